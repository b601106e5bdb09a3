//! A DeepSeek-V4 compressor: per position raw `kv` and `gate` projections, and per
//! finished window of `rate` positions one entry, their softmax-gated sum (per channel,
//! with a learned bias per offset), normalised and rotated at the window's start. CSA's
//! compressors read two interleaved series (the previous window's first, this window's
//! second); HCA's one. Mirrors `DeepseekV4HCACompressor` and `DeepseekV4CSACompressor`.

use coli_core::ModelDir;
use coli_kernels::norm::rms_norm_inplace;
use coli_kernels::rope::RopeTable;

use super::compressed::{rotate, CompressedScratch};
use super::ring::RingCache;
use crate::error::Result;
use crate::weights::{load_vector, Linear};

/// A compressor: per position raw `kv` and `gate` projections; per finished window one
/// entry.
#[derive(Clone, Debug)]
pub struct Compressor {
    /// Positions per window.
    pub rate: usize,
    /// Two interleaved series (CSA and its indexer), else one (HCA).
    pub overlap: bool,
    /// Width of an entry.
    pub dim: usize,
    /// `kv_proj` `[series * dim, hidden]`.
    pub kv: Linear,
    /// `gate_proj` `[series * dim, hidden]`.
    pub gate: Linear,
    /// `position_bias` `[rate, series * dim]`, added to the gates by offset in the window.
    pub position_bias: Vec<f32>,
    /// `kv_norm` `[dim]`.
    pub norm: Vec<f32>,
    /// The `compress` RoPE, at each entry's window start.
    pub rope: RopeTable,
    /// Trailing channels RoPE rotates.
    pub rope_dim: usize,
}

impl Compressor {
    /// Series in the projections.
    pub(super) fn series(&self) -> usize {
        if self.overlap {
            2
        } else {
            1
        }
    }

    /// Floats of one projection's row (`series * dim`).
    pub(super) fn proj_width(&self) -> usize {
        self.series() * self.dim
    }

    /// Floats it keeps per position in the cache's raw rows: the `kv` and `gate` rows.
    pub fn raw_width(&self) -> usize {
        2 * self.proj_width()
    }

    /// `{prefix}.kv_proj`, `.gate_proj`, `.position_bias`, `.kv_norm` (transformers'
    /// names; the release's are mapped by the caller through `name`).
    pub fn load(
        dir: &ModelDir,
        name: &dyn Fn(&str) -> String,
        hidden: usize,
        shape: (usize, usize, bool),
        rope: RopeTable,
        rope_dim: usize,
    ) -> Result<Compressor> {
        let (rate, dim, overlap) = shape;
        let series = if overlap { 2 } else { 1 };
        Ok(Compressor {
            rate,
            overlap,
            dim,
            kv: Linear::load(dir, &name("kv_proj"), series * dim, hidden)?,
            gate: Linear::load(dir, &name("gate_proj"), series * dim, hidden)?,
            position_bias: load_view_f32(dir, &name("position_bias"), &[rate, series * dim])?,
            norm: load_vector(dir, &name("kv_norm"), dim)?,
            rope,
            rope_dim,
        })
    }

    /// The `kv` and `gate` projections of the step's `n` rows of `xn`.
    pub(super) fn project(&self, xn: &[f32], n: usize, kv: &mut [f32], gate: &mut [f32]) {
        let w = self.proj_width();
        Linear::forward_group(
            [&self.kv, &self.gate],
            xn,
            n,
            [&mut kv[..n * w], &mut gate[..n * w]],
        );
    }

    /// Copies row `t` of the projections into the raw row `row` (at this compressor's
    /// `offset`).
    pub(super) fn store(&self, kv: &[f32], gate: &[f32], t: usize, row: &mut [f32], offset: usize) {
        let w = self.proj_width();
        row[offset..offset + w].copy_from_slice(&kv[t * w..(t + 1) * w]);
        row[offset + w..offset + 2 * w].copy_from_slice(&gate[t * w..(t + 1) * w]);
    }

    /// Entry `win` (positions `win * rate ..= p`, with `p` the last) from the raw rows
    /// (this compressor's at `raw_off`), into the entry's floats at `entry_off`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish(
        &self,
        win: usize,
        ring: &mut RingCache,
        raw_off: usize,
        entry_off: usize,
        eps: f32,
        s: &mut CompressedScratch,
    ) {
        let (m, d) = (self.rate, self.dim);
        let w = self.proj_width();
        let first = win * m;
        let entry = &mut s.entry[..d];
        let logits = &mut s.slot_logits[..2 * m];
        let values = &mut s.slot_values[..2 * m];
        for (c, e) in entry.iter_mut().enumerate() {
            // The slots: the previous window's first series (CSA, not for window 0), then
            // this window's last series.
            let mut k = 0;
            if self.overlap && win > 0 {
                for i in 0..m {
                    let row = &ring.raw(first - m + i)[raw_off..];
                    values[k] = row[c];
                    logits[k] = row[w + c] + self.position_bias[i * w + c];
                    k += 1;
                }
            }
            let own = if self.overlap { d } else { 0 };
            for i in 0..m {
                let row = &ring.raw(first + i)[raw_off..];
                values[k] = row[own + c];
                logits[k] = row[w + own + c] + self.position_bias[i * w + own + c];
                k += 1;
            }
            coli_kernels::softmax::softmax_inplace(&mut logits[..k]);
            *e = values[..k]
                .iter()
                .zip(&logits[..k])
                .fold(0.0, |acc, (v, p)| acc + v * p);
        }
        rms_norm_inplace(entry, &self.norm, eps);
        rotate(&self.rope, self.rope_dim, first, entry, false);
        ring.entry_mut(win)[entry_off..][..d].copy_from_slice(entry);
    }
}

/// Loads a tensor of any shape as f32, checking the shape.
fn load_view_f32(dir: &ModelDir, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    Ok(dir.tensor_shaped(name, shape)?.to_f32_vec()?)
}
