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
    /// Per layer, the width of the DSA indexer's key cache (0 where there is none).
    pub index_widths: Vec<usize>,
}

impl KvLayout {
    /// The same shape on every layer, no indexer.
    pub fn uniform(layers: usize, shape: KvShape) -> KvLayout {
        KvLayout {
            shape,
            layers,
            index_widths: vec![0; layers],
        }
    }

    /// The layout a loaded model's blocks give.
    pub fn of(model: &Transformer) -> KvLayout {
        KvLayout {
            shape: model.info.kv,
            layers: model.layers.len(),
            index_widths: index_key_widths(model).collect(),
        }
    }

    /// Bytes per position over all layers (f32 elements).
    pub fn bytes_per_position(&self) -> usize {
        let per_layer = self.shape.key_width + self.shape.value_width;
        (self.layers * per_layer + self.index_widths.iter().sum::<usize>())
            * std::mem::size_of::<f32>()
    }
}

/// Key/value cache: per layer `[capacity, key width]` keys and `[capacity, value width]`
/// values (see [`KvShape`]), plus the DSA indexer's keys on layers that run an indexer.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) keys: Vec<Vec<f32>>,
    pub(crate) values: Vec<Vec<f32>>,
    pub(crate) index_keys: Vec<Vec<f32>>,
    /// Positions the cache can hold.
    pub capacity: usize,
}

impl KvCache {
    /// Allocates the whole cache up front (decode never allocates).
    pub fn new(model: &Transformer, capacity: usize) -> KvCache {
        let (kw, vw) = (model.info.kv.key_width, model.info.kv.value_width);
        let n = model.layers.len();
        KvCache {
            keys: (0..n).map(|_| vec![0.0; capacity * kw]).collect(),
            values: (0..n).map(|_| vec![0.0; capacity * vw]).collect(),
            index_keys: index_key_widths(model)
                .map(|w| vec![0.0; capacity * w])
                .collect(),
            capacity,
        }
    }

    /// Bytes [`KvCache::new`] allocates for `capacity` positions, without allocating.
    pub fn bytes_for(model: &Transformer, capacity: usize) -> usize {
        KvLayout::of(model).bytes_per_position() * capacity
    }

    /// Bytes the cache holds.
    pub fn bytes(&self) -> usize {
        let n: usize = self
            .keys
            .iter()
            .chain(&self.values)
            .chain(&self.index_keys)
            .map(Vec::len)
            .sum();
        n * std::mem::size_of::<f32>()
    }
}

/// Per layer, the width of the DSA indexer's key cache (0 where the layer has no indexer).
fn index_key_widths(model: &Transformer) -> impl Iterator<Item = usize> + '_ {
    model.layers.iter().map(|l| match &l.attn {
        Mixer::Mla(m) => m
            .dsa
            .as_ref()
            .and_then(|d| d.indexer.as_ref())
            .map_or(0, |ind| ind.head_dim),
        Mixer::Gqa(_) => 0,
    })
}
