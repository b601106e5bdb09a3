//! The KV cache and the shape the family gives it. The planner sizes memory from the same
//! [`KvShape`] and [`KvCache::bytes_for`], so its figure is the allocation's.

use super::{Mixer, Transformer};

/// Elements the KV cache keeps per position and layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Key elements (GQA: `n_kv_heads * head_dim`; MLA: `kv_lora_rank + rope dims`).
    pub key_width: usize,
    /// Value elements (GQA: as keys; MLA: 0, the latent serves as both).
    pub value_width: usize,
}

impl KvShape {
    /// Grouped-query attention: keys and values of every KV head.
    pub fn gqa(n_kv_heads: usize, head_dim: usize) -> KvShape {
        KvShape {
            key_width: n_kv_heads * head_dim,
            value_width: n_kv_heads * head_dim,
        }
    }

    /// MLA: the compressed latent plus the shared rotary key, nothing expanded.
    pub fn mla(kv_lora_rank: usize, rope_dim: usize) -> KvShape {
        KvShape {
            key_width: kv_lora_rank + rope_dim,
            value_width: 0,
        }
    }
}

/// What the KV cache holds per position, layer by layer: the family says it from its
/// config alone ([`crate::families::Family::kv_layout`]), so the planner can size the
/// cache without loading a tensor; loading checks it against the blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Keys and values per position of every layer.
    pub shape: KvShape,
    /// Decoder layers.
    pub layers: usize,
    /// Per layer, the floats of its side rows per position (0 where there are none): the
    /// DSA indexer's keys, or DeepSeek-V4's compressor rows and entries.
    pub index_widths: Vec<usize>,
    /// Per layer, whether it keeps keys and values per position (false: a linear-attention
    /// layer, whose state does not grow with the sequence).
    pub attends: Vec<bool>,
    /// Per layer, the floats of its fixed-size recurrent state per sequence (0: none).
    pub state_floats: Vec<usize>,
}

impl KvLayout {
    /// The same shape on every layer, no indexer.
    pub fn uniform(layers: usize, shape: KvShape) -> KvLayout {
        KvLayout {
            shape,
            layers,
            index_widths: vec![0; layers],
            attends: vec![true; layers],
            state_floats: vec![0; layers],
        }
    }

    /// The layout a loaded model's blocks give.
    pub fn of(model: &Transformer) -> KvLayout {
        KvLayout {
            shape: model.info.kv,
            layers: model.layers.len(),
            index_widths: index_key_widths(model).collect(),
            attends: model.layers.iter().map(|l| attends(&l.attn)).collect(),
            state_floats: model.layers.iter().map(|l| state_floats(&l.attn)).collect(),
        }
    }

    /// Bytes per position over all layers (f32 elements).
    pub fn bytes_per_position(&self) -> usize {
        let per_layer = self.shape.key_width + self.shape.value_width;
        let attending = self.attends.iter().filter(|&&a| a).count();
        (attending * per_layer + self.index_widths.iter().sum::<usize>())
            * std::mem::size_of::<f32>()
    }

    /// Bytes of the recurrent states of one sequence, whatever its length.
    pub fn state_bytes(&self) -> usize {
        self.state_floats.iter().sum::<usize>() * std::mem::size_of::<f32>()
    }
}

/// Key/value cache: per layer `[capacity, key width]` keys and `[capacity, value width]`
/// values (see [`KvShape`]), plus the DSA indexer's keys on layers that run an indexer.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) keys: Vec<Vec<f32>>,
    pub(crate) values: Vec<Vec<f32>>,
    pub(crate) index_keys: Vec<Vec<f32>>,
    /// Per layer, the recurrent state of a linear-attention layer (empty elsewhere); a
    /// forward starting at position 0 resets it.
    pub(crate) states: Vec<Vec<f32>>,
    /// Positions the cache can hold.
    pub capacity: usize,
}

impl KvCache {
    /// Allocates the whole cache up front (decode never allocates).
    pub fn new(model: &Transformer, capacity: usize) -> KvCache {
        let (kw, vw) = (model.info.kv.key_width, model.info.kv.value_width);
        let per_layer = |w: usize| {
            model
                .layers
                .iter()
                .map(|l| vec![0.0; if attends(&l.attn) { capacity * w } else { 0 }])
                .collect()
        };
        KvCache {
            keys: per_layer(kw),
            values: per_layer(vw),
            index_keys: index_key_widths(model)
                .map(|w| vec![0.0; capacity * w])
                .collect(),
            states: model
                .layers
                .iter()
                .map(|l| vec![0.0; state_floats(&l.attn)])
                .collect(),
            capacity,
        }
    }

    /// Whether a layer keeps a recurrent state (then the cache cannot be cut back to an
    /// earlier position: see [`KvCache::save_states`]).
    pub fn has_states(&self) -> bool {
        self.states.iter().any(|s| !s.is_empty())
    }

    /// Copies every recurrent state into `into` (grown to fit), to go back to this point.
    pub fn save_states(&self, into: &mut Vec<f32>) {
        into.clear();
        for s in &self.states {
            into.extend_from_slice(s);
        }
    }

    /// Puts back the states [`KvCache::save_states`] copied.
    pub fn restore_states(&mut self, from: &[f32]) {
        let mut at = 0;
        for s in &mut self.states {
            let len = s.len();
            s.copy_from_slice(&from[at..at + len]);
            at += len;
        }
        assert_eq!(at, from.len(), "states saved from another model");
    }

    /// Bytes [`KvCache::new`] allocates for `capacity` positions, without allocating.
    pub fn bytes_for(model: &Transformer, capacity: usize) -> usize {
        let l = KvLayout::of(model);
        l.bytes_per_position() * capacity + l.state_bytes()
    }

    /// Bytes the cache holds.
    pub fn bytes(&self) -> usize {
        let n: usize = self
            .keys
            .iter()
            .chain(&self.values)
            .chain(&self.index_keys)
            .chain(&self.states)
            .map(Vec::len)
            .sum();
        n * std::mem::size_of::<f32>()
    }
}

/// Per layer, the width of its side rows (the DSA indexer's keys, DeepSeek-V4's compressor
/// rows; 0 where the layer has none).
fn index_key_widths(model: &Transformer) -> impl Iterator<Item = usize> + '_ {
    model.layers.iter().map(|l| match &l.attn {
        Mixer::Mla(m) => m
            .dsa
            .as_ref()
            .and_then(|d| d.indexer.as_ref())
            .map_or(0, |ind| ind.head_dim),
        Mixer::Compressed(c) => c.side_width(),
        Mixer::Gqa(_) | Mixer::DeltaNet(_) => 0,
    })
}

/// Whether a layer's mixer keeps keys and values per position.
fn attends(m: &Mixer) -> bool {
    !matches!(m, Mixer::DeltaNet(_))
}

/// Floats of a layer's recurrent state per sequence.
fn state_floats(m: &Mixer) -> usize {
    match m {
        Mixer::DeltaNet(d) => d.dims.state_floats(),
        _ => 0,
    }
}
