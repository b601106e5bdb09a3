//! DeepSeek-V4's manifold-constrained hyper-connections (mHC): the residual is `hc_mult`
//! parallel streams per token instead of one. Before each attention or feed-forward block a
//! [`HyperConnection`] reads every stream (through an unweighted RMSNorm and one linear
//! map) and derives three weights: `pre` collapses the streams into the block's input,
//! `post` spreads the block's output back over the streams, and `comb`, projected onto the
//! doubly-stochastic matrices by Sinkhorn-Knopp iterations, mixes the old streams into the
//! new ones: `new[k] = post[k] out + sum_j comb[j][k] old[j]`. After the last layer the
//! [`HyperHead`] collapses the streams once more before the final norm. Mirrors
//! `DeepseekV4HyperConnection` and `DeepseekV4HyperHead` of `modeling_deepseek_v4.py`.

use coli_core::ModelDir;
use coli_kernels::norm::rms_norm_unweighted_inplace;
use coli_kernels::routing::sigmoid;

use super::scratch::grow;
use crate::error::Result;
use crate::weights::{load_vector, Linear};

/// The settings every hyper-connection of a model shares, and its final collapse.
#[derive(Clone, Debug)]
pub struct Hyper {
    /// Streams per token (`hc_mult`).
    pub mult: usize,
    /// Sinkhorn-Knopp iterations (`hc_sinkhorn_iters`).
    pub iters: usize,
    /// Floor added to the weights and the Sinkhorn denominators (`hc_eps`).
    pub eps: f32,
    /// The input norm's epsilon (`rms_norm_eps`).
    pub norm_eps: f32,
    /// The collapse before the final norm.
    pub head: HyperHead,
}

/// The mixing weights in front of one block (`attn_hc` or `ffn_hc`).
#[derive(Clone, Debug)]
pub struct HyperConnection {
    /// `fn` `[(2 + N) N, N hidden]`: the streams to the `pre`, `post` and `comb` logits.
    pub map: Linear,
    /// `base` `[(2 + N) N]`.
    pub base: Vec<f32>,
    /// `scale` `[3]`: multiplies the `pre`, `post` and `comb` logits.
    pub scale: [f32; 3],
}

/// The final collapse of the streams (`hc_head`).
#[derive(Clone, Debug)]
pub struct HyperHead {
    /// `hc_fn` `[N, N hidden]`.
    pub map: Linear,
    /// `hc_base` `[N]`.
    pub base: Vec<f32>,
    /// `hc_scale`.
    pub scale: f32,
}

/// Per-token weights of the blocks' hyper-connections, and their buffers.
#[derive(Debug, Default)]
pub(crate) struct HyperScratch {
    /// The normalised streams `[n, N hidden]`.
    flat: Vec<f32>,
    /// The linear map's outputs `[n, (2 + N) N]`.
    mixes: Vec<f32>,
    /// `post` `[n, N]`.
    post: Vec<f32>,
    /// `comb` `[n, N, N]`.
    comb: Vec<f32>,
    /// One token's new streams `[N hidden]`.
    row: Vec<f32>,
}

impl HyperScratch {
    /// Floats held.
    pub(crate) fn floats(&self) -> usize {
        self.flat.len() + self.mixes.len() + self.post.len() + self.comb.len() + self.row.len()
    }
}

impl HyperConnection {
    /// `{prefix}.fn`, `.base` and `.scale` (transformers spells them `attn_hc.fn`; the
    /// release `hc_attn_fn`: the caller passes the names).
    pub fn load(
        dir: &ModelDir,
        [map, base, scale]: [&str; 3],
        mult: usize,
        hidden: usize,
    ) -> Result<HyperConnection> {
        let outs = (2 + mult) * mult;
        let s = load_vector(dir, scale, 3)?;
        Ok(HyperConnection {
            map: Linear::load(dir, map, outs, mult * hidden)?,
            base: load_vector(dir, base, outs)?,
            scale: [s[0], s[1], s[2]],
        })
    }
}

impl HyperHead {
    /// `hc_head.hc_fn`, `.hc_base`, `.hc_scale` (or the release's `hc_head_fn`, …).
    pub fn load(
        dir: &ModelDir,
        [map, base, scale]: [&str; 3],
        mult: usize,
        hidden: usize,
    ) -> Result<HyperHead> {
        Ok(HyperHead {
            map: Linear::load(dir, map, mult, mult * hidden)?,
            base: load_vector(dir, base, mult)?,
            scale: load_vector(dir, scale, 1)?[0],
        })
    }
}

impl Hyper {
    /// Sizes the buffers for `n` tokens of width `hidden`.
    pub(crate) fn reserve(&self, s: &mut HyperScratch, n: usize, hidden: usize) {
        let m = self.mult;
        grow(&mut s.flat, n * m * hidden);
        grow(&mut s.mixes, n * (2 + m) * m);
        grow(&mut s.post, n * m);
        grow(&mut s.comb, n * m * m);
        grow(&mut s.row, m * hidden);
    }

    /// The unweighted RMSNorm of each token's streams, then `map` over them into `s.mixes`.
    fn mix(&self, map: &Linear, x: &[f32], n: usize, s: &mut HyperScratch) {
        let w = x.len() / n;
        let flat = &mut s.flat[..n * w];
        flat.copy_from_slice(x);
        for row in flat.chunks_exact_mut(w) {
            rms_norm_unweighted_inplace(row, self.norm_eps);
        }
        map.forward(flat, n, &mut s.mixes[..n * map.rows]);
    }

    /// The block input of each of the `n` tokens of `x` (`[n, N hidden]`) into `out`
    /// (`[n, hidden]`), keeping `post` and `comb` for [`Hyper::expand`].
    pub(crate) fn collapse(
        &self,
        hc: &HyperConnection,
        x: &[f32],
        n: usize,
        s: &mut HyperScratch,
        out: &mut [f32],
    ) {
        let m = self.mult;
        let h = out.len() / n;
        self.mix(&hc.map, x, n, s);
        let width = (2 + m) * m;
        for t in 0..n {
            let mixes = &s.mixes[t * width..(t + 1) * width];
            let (pre_w, rest) = mixes.split_at(m);
            let (post_w, comb_w) = rest.split_at(m);
            let (pre_b, rest_b) = hc.base.split_at(m);
            let (post_b, comb_b) = rest_b.split_at(m);
            let post = &mut s.post[t * m..(t + 1) * m];
            for ((p, &w), &b) in post.iter_mut().zip(post_w).zip(post_b) {
                *p = 2.0 * sigmoid(w * hc.scale[1] + b);
            }
            let comb = &mut s.comb[t * m * m..(t + 1) * m * m];
            for ((c, &w), &b) in comb.iter_mut().zip(comb_w).zip(comb_b) {
                *c = w * hc.scale[2] + b;
            }
            sinkhorn(comb, m, self.iters, self.eps);
            let o = &mut out[t * h..(t + 1) * h];
            o.fill(0.0);
            let xs = &x[t * m * h..(t + 1) * m * h];
            for ((&w, &b), stream) in pre_w.iter().zip(pre_b).zip(xs.chunks_exact(h)) {
                let pre = sigmoid(w * hc.scale[0] + b) + self.eps;
                for (oi, &xi) in o.iter_mut().zip(stream) {
                    *oi += pre * xi;
                }
            }
        }
    }

    /// The new streams of each token: `x[k] = post[k] out + sum_j comb[j][k] x[j]`, with
    /// the weights the last [`Hyper::collapse`] left.
    pub(crate) fn expand(&self, x: &mut [f32], out: &[f32], n: usize, s: &mut HyperScratch) {
        let m = self.mult;
        let h = out.len() / n;
        let row = &mut s.row[..m * h];
        for t in 0..n {
            let xs = &mut x[t * m * h..(t + 1) * m * h];
            let o = &out[t * h..(t + 1) * h];
            let comb = &s.comb[t * m * m..(t + 1) * m * m];
            for (k, new) in row.chunks_exact_mut(h).enumerate() {
                let post = s.post[t * m + k];
                for (ni, &oi) in new.iter_mut().zip(o) {
                    *ni = post * oi;
                }
                for (j, old) in xs.chunks_exact(h).enumerate() {
                    let c = comb[j * m + k];
                    for (ni, &xi) in new.iter_mut().zip(old) {
                        *ni += c * xi;
                    }
                }
            }
            xs.copy_from_slice(row);
        }
    }

    /// The final collapse of `x` (`[n, N hidden]`) into `out` (`[n, hidden]`).
    pub(crate) fn head(&self, x: &[f32], n: usize, s: &mut HyperScratch, out: &mut [f32]) {
        let (m, hd) = (self.mult, &self.head);
        let h = out.len() / n;
        self.mix(&hd.map, x, n, s);
        for t in 0..n {
            let o = &mut out[t * h..(t + 1) * h];
            o.fill(0.0);
            let xs = &x[t * m * h..(t + 1) * m * h];
            let mixes = &s.mixes[t * m..(t + 1) * m];
            for ((&w, &b), stream) in mixes.iter().zip(&hd.base).zip(xs.chunks_exact(h)) {
                let pre = sigmoid(w * hd.scale + b) + self.eps;
                for (oi, &xi) in o.iter_mut().zip(stream) {
                    *oi += pre * xi;
                }
            }
        }
    }
}

/// `comb`'s logits (`[m, m]`) to a doubly-stochastic matrix: a softmax along each row plus
/// `eps`, the columns normalised, then `iters - 1` rounds of rows then columns.
fn sinkhorn(comb: &mut [f32], m: usize, iters: usize, eps: f32) {
    for row in comb.chunks_exact_mut(m) {
        coli_kernels::softmax::softmax_inplace(row);
        for c in row.iter_mut() {
            *c += eps;
        }
    }
    let columns = |comb: &mut [f32]| {
        for k in 0..m {
            let sum: f32 = (0..m).map(|j| comb[j * m + k]).sum();
            for j in 0..m {
                comb[j * m + k] /= sum + eps;
            }
        }
    };
    columns(comb);
    for _ in 1..iters {
        for row in comb.chunks_exact_mut(m) {
            let sum: f32 = row.iter().sum();
            for c in row.iter_mut() {
                *c /= sum + eps;
            }
        }
        columns(comb);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sinkhorn-Knopp in f64, written from the paper's definition (softmax rows, + eps,
    /// then alternate column and row normalisation), to compare with the f32 loop.
    fn sinkhorn_f64(logits: &[f64], m: usize, iters: usize, eps: f64) -> Vec<f64> {
        let mut c: Vec<f64> = Vec::new();
        for row in logits.chunks(m) {
            let max = row.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
            let s: f64 = e.iter().sum();
            c.extend(e.iter().map(|v| v / s + eps));
        }
        let norm_cols = |c: &mut Vec<f64>| {
            for k in 0..m {
                let s: f64 = (0..m).map(|j| c[j * m + k]).sum();
                for j in 0..m {
                    c[j * m + k] /= s + eps;
                }
            }
        };
        norm_cols(&mut c);
        for _ in 1..iters {
            for j in 0..m {
                let s: f64 = c[j * m..(j + 1) * m].iter().sum();
                for k in 0..m {
                    c[j * m + k] /= s + eps;
                }
            }
            norm_cols(&mut c);
        }
        c
    }

    #[test]
    fn sinkhorn_gives_a_doubly_stochastic_matrix_as_defined() {
        let m = 4;
        let logits: Vec<f32> = (0..m * m)
            .map(|i| ((i * 37) % 11) as f32 * 0.4 - 2.0)
            .collect();
        let mut c = logits.clone();
        sinkhorn(&mut c, m, 20, 1e-6);
        let want = sinkhorn_f64(
            &logits.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            m,
            20,
            1e-6,
        );
        for (a, b) in c.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
        }
        for k in 0..m {
            let col: f32 = (0..m).map(|j| c[j * m + k]).sum();
            let row: f32 = c[k * m..(k + 1) * m].iter().sum();
            assert!(
                (col - 1.0).abs() < 1e-4 && (row - 1.0).abs() < 1e-3,
                "{col} {row}"
            );
        }
        // One iteration normalises the columns only.
        let mut one = logits.clone();
        sinkhorn(&mut one, m, 1, 1e-6);
        assert!(one != c);
    }
}
