//! The KV cache and the shape the family gives it. The planner sizes memory from the same
//! [`KvShape`] and [`KvCache::bytes_for`], so its figure is the allocation's.

use std::io::{Read, Write};

use super::ring::{RingCache, RingShape, RING_SLACK};
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
    /// Per layer, the rings of a layer that reads only its last positions: a DeepSeek-V4
    /// attention layer (with its entries) or a sliding-window GQA layer (which then
    /// keeps no keys per position: `attends` is false).
    pub rings: Vec<Option<RingShape>>,
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
            rings: vec![None; layers],
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
            rings: model
                .layers
                .iter()
                .map(|l| ring_shape(&l.attn, model.info.kv))
                .collect(),
        }
    }

    /// Bytes per position over all layers (f32 elements).
    pub fn bytes_per_position(&self) -> usize {
        let per_layer = self.shape.key_width + self.shape.value_width;
        let attending = self.attends.iter().filter(|&&a| a).count();
        let entries: usize = self
            .rings
            .iter()
            .flatten()
            .map(RingShape::entry_floats_per_position)
            .sum();
        (attending * per_layer + self.index_widths.iter().sum::<usize>() + entries)
            * std::mem::size_of::<f32>()
    }

    /// Bytes a cache of `capacity` positions allocates.
    pub fn bytes(&self, capacity: usize) -> usize {
        self.bytes_per_position() * capacity + self.state_bytes(capacity)
    }

    /// Bytes one sequence keeps whatever its length: recurrent states, and the rings of
    /// DeepSeek-V4 and sliding-window layers (a cache of `capacity` positions, fewer than a ring's, holds less).
    pub fn state_bytes(&self, capacity: usize) -> usize {
        let rings: usize = self
            .rings
            .iter()
            .flatten()
            .map(|r| r.ring_floats(RING_SLACK, capacity))
            .sum();
        (self.state_floats.iter().sum::<usize>() + rings) * std::mem::size_of::<f32>()
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
    /// Per layer, the rings of a DeepSeek-V4 or sliding-window layer (see [`RingCache`]).
    pub(crate) rings: Vec<Option<RingCache>>,
    /// Positions the cache can hold.
    pub capacity: usize,
}

impl KvCache {
    /// Allocates the whole cache up front (decode never allocates).
    pub fn new(model: &Transformer, capacity: usize) -> KvCache {
        KvCache::with_slack(model, capacity, RING_SLACK)
    }

    /// [`KvCache::new`] with rings of `slack` positions beyond what ring layers
    /// read (the default is [`RING_SLACK`]): how far a sequence can be cut back and
    /// continued exactly. Tests use small rings to make them wrap.
    pub fn with_slack(model: &Transformer, capacity: usize, slack: usize) -> KvCache {
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
            rings: model
                .layers
                .iter()
                .map(|l| {
                    ring_shape(&l.attn, model.info.kv).map(|r| RingCache::new(r, slack, capacity))
                })
                .collect(),
            capacity,
        }
    }

    /// Whether a layer keeps a recurrent state (then the cache cannot be cut back to an
    /// earlier position: see [`KvCache::save_states`]).
    pub fn has_states(&self) -> bool {
        self.states.iter().any(|s| !s.is_empty())
    }

    /// The shortest length the sequence held can be cut back to and continued exactly
    /// (0 without rings; a recurrent state cannot be cut back at all: see
    /// [`KvCache::has_states`]).
    pub fn floor(&self) -> usize {
        self.rings
            .iter()
            .flatten()
            .map(RingCache::floor)
            .max()
            .unwrap_or(0)
    }

    /// Keeps a copy of the rings as they are after `len` positions (a prompt just fed),
    /// so that a later cut at or past `len` goes back to it.
    pub fn checkpoint(&mut self, len: usize) {
        for r in self.rings.iter_mut().flatten() {
            r.save(len);
        }
    }

    /// For a cut to `len` below [`KvCache::floor`]: puts back the checkpoint when it lies
    /// at or before `len`, returning its length.
    pub fn back_to_checkpoint(&mut self, len: usize) -> Option<usize> {
        let at = self.rings.iter().flatten().next()?.saved_len()?;
        if at > len
            || self
                .rings
                .iter()
                .flatten()
                .any(|r| r.saved_len() != Some(at))
        {
            return None;
        }
        for r in self.rings.iter_mut().flatten() {
            r.restore();
        }
        Some(at)
    }

    /// Drops a checkpoint past `len` (the sequence now holds only `len` positions).
    pub fn forget_checkpoint_after(&mut self, len: usize) {
        for r in self.rings.iter_mut().flatten() {
            r.forget_saved_after(len);
        }
    }

    /// How many positions back from its length the sequence can always be cut and
    /// continued exactly (unbounded without rings).
    pub fn cut_depth(&self) -> usize {
        self.rings
            .iter()
            .flatten()
            .map(RingCache::piece)
            .min()
            .unwrap_or(usize::MAX)
    }

    /// Whether some layer keeps only its last positions (then a cut deeper than
    /// [`KvCache::floor`] starts over, and a failed forward may have overwritten them).
    pub fn has_rings(&self) -> bool {
        self.rings.iter().any(Option::is_some)
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
        KvLayout::of(model).bytes(capacity)
    }

    /// Writes the first `n` positions' keys, values and side rows, then the recurrent
    /// states and the rings (f32, little-endian; see [`RingCache::write`]). `n` must not
    /// be below [`KvCache::floor`], and a recurrent state is the state after every
    /// position held, whatever `n`.
    pub(crate) fn write(&self, n: usize, w: &mut dyn Write) -> std::io::Result<()> {
        for buf in self.keys.iter().chain(&self.values).chain(&self.index_keys) {
            let width = buf.len() / self.capacity.max(1);
            for x in &buf[..n * width] {
                w.write_all(&x.to_le_bytes())?;
            }
        }
        for state in &self.states {
            for &x in state {
                // A sequence of no tokens has a zero state, whatever the cache holds.
                let x = if n == 0 { 0.0 } else { x };
                w.write_all(&x.to_le_bytes())?;
            }
        }
        for ring in self.rings.iter().flatten() {
            ring.write(n, w)?;
        }
        Ok(())
    }

    /// Reads what [`KvCache::write`] wrote for `n` positions.
    pub(crate) fn read(&mut self, n: usize, r: &mut dyn Read) -> std::io::Result<()> {
        let cap = self.capacity.max(1);
        let mut b4 = [0u8; 4];
        let mut read = |xs: &mut [f32]| -> std::io::Result<()> {
            for x in xs {
                r.read_exact(&mut b4)?;
                *x = f32::from_le_bytes(b4);
            }
            Ok(())
        };
        for buf in self
            .keys
            .iter_mut()
            .chain(self.values.iter_mut())
            .chain(self.index_keys.iter_mut())
        {
            let width = buf.len() / cap;
            read(&mut buf[..n * width])?;
        }
        for state in self.states.iter_mut() {
            read(state)?;
        }
        for ring in self.rings.iter_mut().flatten() {
            ring.read(n, r)?;
        }
        Ok(())
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
            .sum::<usize>()
            + self
                .rings
                .iter()
                .flatten()
                .map(RingCache::floats)
                .sum::<usize>();
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
        Mixer::Gqa(_) | Mixer::DeltaNet(_) | Mixer::Compressed(_) => 0,
    })
}

/// Whether a layer's mixer keeps keys and values per position (not a linear-attention
/// layer nor a ring layer: see [`ring_shape`]).
fn attends(m: &Mixer) -> bool {
    match m {
        Mixer::Gqa(a) => a.window.is_none(),
        Mixer::Mla(_) => true,
        Mixer::DeltaNet(_) | Mixer::Compressed(_) => false,
    }
}

/// The rings of a DeepSeek-V4 attention layer, or of a sliding-window GQA layer (its
/// window's keys and values, one row per position).
fn ring_shape(m: &Mixer, kv: KvShape) -> Option<RingShape> {
    match m {
        Mixer::Compressed(c) => Some(c.ring_shape()),
        Mixer::Gqa(a) => a.window.map(|w| RingShape::sliding(w, kv)),
        _ => None,
    }
}

/// Floats of a layer's recurrent state per sequence.
fn state_floats(m: &Mixer) -> usize {
    match m {
        Mixer::DeltaNet(d) => d.dims.state_floats(),
        _ => 0,
    }
}
