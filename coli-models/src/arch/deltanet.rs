//! Gated DeltaNet, the linear attention of Qwen3-Next and Qwen3.5-MoE: projections to
//! q, k, v (through a short causal convolution), an output gate z and the per-head write
//! strength b and decay a; the gated delta rule on a `[dk, dv]` state per value head; a
//! gated RMSNorm; the output projection. Its per-sequence state (the convolution's last
//! inputs and the delta-rule states) replaces a KV cache and lives in [`KvCache`].
//!
//! `transformers` runs a prompt through the chunked form of the delta rule and decode
//! through the recurrent form; the two agree up to rounding. coli runs the recurrent form
//! for both, token after token, so a prompt fed at once and fed one token at a time give
//! identical bits (the projections are batched; the recurrence is per token).

use coli_core::ModelDir;
use coli_kernels::deltanet::{
    causal_conv_step, gated_delta_step, l2_normalize, rms_norm_gated, softplus,
};
use rayon::prelude::*;

use super::scratch::{grow, DeltaScratch};
use super::{KvCache, Scratch, Step};
use crate::error::{ModelError, Result};
use crate::weights::{load_vector, load_view, Linear};

/// How the checkpoint packs the input projections.
// One per layer: the variants' size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum DeltaInput {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head: for each key
    /// head, `[q (dk) | k (dk) | v (r dv) | z (r dv)]` and `[b (r) | a (r)]`, with
    /// `r = value heads / key heads`.
    Grouped {
        /// `[2 key_dim + 2 value_dim, hidden]`.
        qkvz: Linear,
        /// `[2 value heads, hidden]`.
        ba: Linear,
    },
    /// Qwen3.5: `in_proj_qkv` (flat `[q | k | v]`), `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split {
        /// `[2 key_dim + value_dim, hidden]`.
        qkv: Linear,
        /// `[value_dim, hidden]`.
        z: Linear,
        /// `[value heads, hidden]`.
        b: Linear,
        /// `[value heads, hidden]`.
        a: Linear,
    },
    /// Qwen3-Next as llama.cpp's converter writes it: `in_proj_qkvz` taken apart into a
    /// flat `[q | k | v]` (`attn_qkv`) and z (`attn_gate`), the heads in the grouped
    /// layout's order; `in_proj_ba` left grouped (`ssm_ba`).
    SplitGroupedBa {
        /// `[2 key_dim + value_dim, hidden]`.
        qkv: Linear,
        /// `[value_dim, hidden]`.
        z: Linear,
        /// `[2 value heads, hidden]`, grouped as [`DeltaInput::Grouped`]'s.
        ba: Linear,
    },
}

/// Head counts and widths of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaDims {
    /// Key (and query) heads.
    pub key_heads: usize,
    /// Value heads (a multiple of the key heads).
    pub value_heads: usize,
    /// Key head dimension.
    pub key_dim: usize,
    /// Value head dimension.
    pub value_dim: usize,
    /// Taps of the causal convolution.
    pub conv_kernel: usize,
}

impl DeltaDims {
    /// Channels of the convolution: `[q | k | v]`.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Floats of one sequence's state: the convolution's last `kernel - 1` inputs and a
    /// `[key_dim, value_dim]` delta-rule state per value head.
    pub fn state_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels()
            + self.value_heads * self.key_dim * self.value_dim
    }

    /// Value heads per key head.
    fn ratio(&self) -> usize {
        self.value_heads / self.key_heads
    }
}

/// A Gated DeltaNet layer.
#[derive(Clone, Debug)]
pub struct GatedDeltaNet {
    /// Head counts and widths.
    pub dims: DeltaDims,
    /// Input projections.
    pub input: DeltaInput,
    /// Depthwise convolution weights `[channels, kernel]`.
    pub conv: Vec<f32>,
    /// `-exp(A_log)` per value head.
    pub neg_a: Vec<f32>,
    /// `dt_bias` per value head.
    pub dt_bias: Vec<f32>,
    /// Gated RMSNorm weight `[value_dim]` (used as stored).
    pub norm: Vec<f32>,
    /// Output projection `[hidden, value heads * value_dim]`.
    pub out_proj: Linear,
}

impl GatedDeltaNet {
    /// Loads `{prefix}.*` (`linear_attn` of a layer), checking every shape.
    pub fn load(
        dir: &ModelDir,
        prefix: &str,
        hidden: usize,
        dims: DeltaDims,
        split: bool,
    ) -> Result<GatedDeltaNet> {
        let d = dims;
        let (kd, vd) = (d.key_heads * d.key_dim, d.value_heads * d.value_dim);
        let w = |name: &str, rows: usize| {
            Linear::load(dir, &format!("{prefix}.{name}.weight"), rows, hidden)
        };
        let input = if !split && dir.has(&format!("{prefix}.in_proj_qkv.weight")) {
            DeltaInput::SplitGroupedBa {
                qkv: w("in_proj_qkv", 2 * kd + vd)?,
                z: w("in_proj_z", vd)?,
                ba: w("in_proj_ba", 2 * d.value_heads)?,
            }
        } else if split {
            DeltaInput::Split {
                qkv: w("in_proj_qkv", 2 * kd + vd)?,
                z: w("in_proj_z", vd)?,
                b: w("in_proj_b", d.value_heads)?,
                a: w("in_proj_a", d.value_heads)?,
            }
        } else {
            DeltaInput::Grouped {
                qkvz: w("in_proj_qkvz", 2 * kd + 2 * vd)?,
                ba: w("in_proj_ba", 2 * d.value_heads)?,
            }
        };
        let channels = d.conv_channels();
        let conv_name = format!("{prefix}.conv1d.weight");
        // `[channels, 1, kernel]` as transformers keeps it; `[channels, kernel]` as
        // llama.cpp's converter squeezes it (the same values in the same order).
        let squeezed = dir.has(&conv_name) && dir.tensor(&conv_name)?.shape.len() == 2;
        let conv_shape: &[usize] = if squeezed {
            &[channels, d.conv_kernel]
        } else {
            &[channels, 1, d.conv_kernel]
        };
        let conv = load_view(dir, &conv_name, conv_shape)?.to_f32_vec()?;
        // `-exp(A_log)`; a GGUF stores that value itself (`ssm_a`, here `neg_A`).
        let neg_a_name = format!("{prefix}.neg_A");
        let (a_name, neg_a) = if dir.has(&neg_a_name) {
            let v = load_vector(dir, &neg_a_name, d.value_heads)?;
            (neg_a_name, v)
        } else {
            let a_name = format!("{prefix}.A_log");
            let a_log = load_vector(dir, &a_name, d.value_heads)?;
            (a_name, a_log.iter().map(|&a| -a.exp()).collect())
        };
        if let Some(bad) = neg_a.iter().find(|v| !v.is_finite()) {
            return Err(ModelError::BadTensor {
                name: a_name,
                msg: format!("-exp(A_log) = {bad} is not finite"),
            });
        }
        Ok(GatedDeltaNet {
            dims,
            input,
            conv,
            neg_a,
            dt_bias: load_vector(dir, &format!("{prefix}.dt_bias"), d.value_heads)?,
            norm: load_vector(dir, &format!("{prefix}.norm.weight"), d.value_dim)?,
            out_proj: Linear::load(dir, &format!("{prefix}.out_proj.weight"), hidden, vd)?,
        })
    }

    /// Sizes the scratch for `n` tokens.
    pub(crate) fn reserve(&self, s: &mut Scratch, n: usize) {
        let d = &self.dims;
        let (kd, vd) = (d.key_heads * d.key_dim, d.value_heads * d.value_dim);
        let t = &mut s.delta;
        grow(&mut t.packed, n * (2 * kd + 2 * vd).max(2 * d.value_heads));
        grow(&mut t.mixed, n * d.conv_channels());
        grow(&mut t.conv, n * d.conv_channels());
        grow(&mut t.z, n * vd);
        grow(&mut t.b, n * d.value_heads);
        grow(&mut t.a, n * d.value_heads);
        grow(&mut t.heads, n * vd);
        grow(&mut t.out, n * vd);
    }

    /// The step's tokens, rows `0..n` of `s.xn` at positions `st.start..`, on `kv`'s state
    /// of this layer; leaves the projected output in `s.proj`.
    pub(crate) fn forward(&self, st: &Step, kv: &mut KvCache, s: &mut Scratch) {
        self.project(st.n, st.model.info.hidden_size, s);
        self.recur(st, kv, s, 0);
        self.output(st, s);
    }

    /// Rows of several sequences: row `r` continues `kvs[seqs[r]]` at `starts[r]` (a
    /// sequence's rows in order, each advancing its state).
    pub(crate) fn forward_rows(
        &self,
        st: &Step,
        kvs: &mut [&mut KvCache],
        seqs: &[usize],
        starts: &[usize],
        s: &mut Scratch,
    ) {
        self.project(st.n, st.model.info.hidden_size, s);
        for (r, (&q, &start)) in seqs.iter().zip(starts).enumerate() {
            let row = Step { n: 1, start, ..*st };
            let kv = &mut *kvs[q];
            self.recur(&row, kv, s, r);
        }
        self.output(st, s);
    }

    /// The input projections of `n` rows into the flat `[q | k | v]` channels, z, b and a.
    fn project(&self, n: usize, h: usize, s: &mut Scratch) {
        let d = &self.dims;
        let (kd, vd, nv) = (
            d.key_heads * d.key_dim,
            d.value_heads * d.value_dim,
            d.value_heads,
        );
        let ch = d.conv_channels();
        let x = &s.xn[..n * h];
        let t = &mut s.delta;
        match &self.input {
            DeltaInput::Split { qkv, z, b, a } => Linear::forward_group(
                [qkv, z, b, a],
                x,
                n,
                [
                    &mut t.mixed[..n * ch],
                    &mut t.z[..n * vd],
                    &mut t.b[..n * nv],
                    &mut t.a[..n * nv],
                ],
            ),
            DeltaInput::Grouped { qkvz, ba } => {
                let (r, dk, dv) = (d.ratio(), d.key_dim, d.value_dim);
                let width = 2 * kd + 2 * vd;
                qkvz.forward(x, n, &mut t.packed[..n * width]);
                let group = 2 * dk + 2 * r * dv;
                for row in 0..n {
                    let src = &t.packed[row * width..(row + 1) * width];
                    let mixed = &mut t.mixed[row * ch..(row + 1) * ch];
                    let z = &mut t.z[row * vd..(row + 1) * vd];
                    for g in 0..d.key_heads {
                        let p = &src[g * group..(g + 1) * group];
                        mixed[g * dk..(g + 1) * dk].copy_from_slice(&p[..dk]);
                        mixed[kd + g * dk..kd + (g + 1) * dk].copy_from_slice(&p[dk..2 * dk]);
                        let vs = 2 * kd + g * r * dv;
                        mixed[vs..vs + r * dv].copy_from_slice(&p[2 * dk..2 * dk + r * dv]);
                        z[g * r * dv..(g + 1) * r * dv].copy_from_slice(&p[2 * dk + r * dv..]);
                    }
                }
                grouped_ba(ba, d, x, n, t);
            }
            DeltaInput::SplitGroupedBa { qkv, z, ba } => {
                Linear::forward_group([qkv, z], x, n, [&mut t.mixed[..n * ch], &mut t.z[..n * vd]]);
                grouped_ba(ba, d, x, n, t);
            }
        }
    }

    /// Convolution, normalisation and the delta rule for the step's tokens (scratch rows
    /// `row0..row0 + n`), token after token, on the sequence's state; the gated norm of
    /// each value head's output lands in `s.delta.out`.
    fn recur(&self, st: &Step, kv: &mut KvCache, s: &mut Scratch, row0: usize) {
        let d = &self.dims;
        let (nk, nv, dk, dv, kern) = (
            d.key_heads,
            d.value_heads,
            d.key_dim,
            d.value_dim,
            d.conv_kernel,
        );
        let (kd, vd, ch, r) = (nk * dk, nv * dv, d.conv_channels(), d.ratio());
        let n = st.n;
        let eps = st.model.rms_norm_eps;
        let state = &mut kv.states[st.layer];
        if st.start == 0 {
            // A new sequence starts from zeros.
            state.fill(0.0);
        }
        let (history, ssm) = state.split_at_mut((kern - 1) * ch);
        let t = &mut s.delta;
        let rows = row0..row0 + n;
        for row in rows.clone() {
            causal_conv_step(
                history,
                &self.conv,
                kern,
                &t.mixed[row * ch..(row + 1) * ch],
                &mut t.conv[row * ch..(row + 1) * ch],
            );
            let c = &mut t.conv[row * ch..(row + 1) * ch];
            let (qk, _) = c.split_at_mut(2 * kd);
            for head in qk.chunks_exact_mut(dk) {
                l2_normalize(head, 1e-6);
            }
            // q / sqrt(dk), the scale computed in double as Python does.
            let scale = (1.0 / (dk as f64).sqrt()) as f32;
            for x in &mut c[..kd] {
                *x *= scale;
            }
            for h in 0..nv {
                let i = row * nv + h;
                let b = t.b[i];
                t.b[i] = 1.0 / (1.0 + (-b).exp());
                t.a[i] = (self.neg_a[h] * softplus(t.a[i] + self.dt_bias[h])).exp();
            }
        }
        // Value heads in parallel, each running its tokens in order. Outputs are
        // head-major in `heads` ([head][token][dv]).
        let (conv, beta, decay) = (&t.conv, &t.b, &t.a);
        ssm.par_chunks_mut(dk * dv)
            .zip(t.heads[..n * vd].par_chunks_mut(n * dv))
            .enumerate()
            .for_each(|(h, (sh, outs))| {
                let mut tmp = [0.0f32; MAX_VALUE_DIM];
                let kh = h / r;
                for (j, out) in outs.chunks_exact_mut(dv).enumerate() {
                    let row = row0 + j;
                    let c = &conv[row * ch..(row + 1) * ch];
                    gated_delta_step(
                        sh,
                        &c[kh * dk..(kh + 1) * dk],
                        &c[kd + kh * dk..kd + (kh + 1) * dk],
                        &c[2 * kd + h * dv..2 * kd + (h + 1) * dv],
                        decay[row * nv + h],
                        beta[row * nv + h],
                        &mut tmp[..dv],
                        out,
                    );
                }
            });
        for j in 0..n {
            let row = row0 + j;
            for h in 0..nv {
                let o = &mut t.out[row * vd + h * dv..row * vd + (h + 1) * dv];
                o.copy_from_slice(&t.heads[h * n * dv + j * dv..][..dv]);
                rms_norm_gated(
                    o,
                    &self.norm,
                    &t.z[row * vd + h * dv..row * vd + (h + 1) * dv],
                    eps,
                );
            }
        }
    }

    fn output(&self, st: &Step, s: &mut Scratch) {
        let (n, h) = (st.n, st.model.info.hidden_size);
        let vd = self.dims.value_heads * self.dims.value_dim;
        self.out_proj
            .forward(&s.delta.out[..n * vd], n, &mut s.proj[..n * h]);
    }
}

/// Largest value head dimension (the delta step's stack buffer); checked at load.
pub const MAX_VALUE_DIM: usize = 1024;

/// `in_proj_ba` grouped per key head (`[b (r) | a (r)]` each) into b and a, value heads
/// in order.
fn grouped_ba(ba: &Linear, d: &DeltaDims, x: &[f32], n: usize, t: &mut DeltaScratch) {
    let (nv, r) = (d.value_heads, d.ratio());
    ba.forward(x, n, &mut t.packed[..n * 2 * nv]);
    for row in 0..n {
        let src = &t.packed[row * 2 * nv..(row + 1) * 2 * nv];
        for g in 0..d.key_heads {
            let p = &src[g * 2 * r..(g + 1) * 2 * r];
            t.b[row * nv + g * r..row * nv + (g + 1) * r].copy_from_slice(&p[..r]);
            t.a[row * nv + g * r..row * nv + (g + 1) * r].copy_from_slice(&p[r..]);
        }
    }
}
