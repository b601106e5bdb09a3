//! Grouped-query attention (Llama, OLMoE, Qwen-MoE, Mixtral, GLM-4.5): q/k/v projections,
//! optional q/k RMSNorm and clipping, RoPE, a per-head KV cache, causal softmax attention.

use coli_core::ModelDir;
use coli_kernels::attention::{attend_ring, KvView};
use coli_kernels::routing::sigmoid;
use rayon::prelude::*;

use super::scratch::grow;
use super::ATTENTION_TASKS;
use super::{norm_rows_inplace, rope_position, KvCache, ModelInfo, PositionLoop, Scratch, Step};
use crate::error::Result;
use crate::weights::Linear;

/// How q and k are normalised before RoPE.
#[derive(Clone, Debug)]
pub enum QkNorm {
    /// No normalisation (Llama).
    None,
    /// RMSNorm over the whole q / k projection (OLMoE).
    FullProjection {
        /// Weight of length `n_heads * head_dim`.
        q: Vec<f32>,
        /// Weight of length `n_kv_heads * head_dim`.
        k: Vec<f32>,
    },
    /// RMSNorm of each head separately, one weight shared by the heads (Qwen3, GLM-4.5).
    PerHead {
        /// Weight of length `head_dim`.
        q: Vec<f32>,
        /// Weight of length `head_dim`.
        k: Vec<f32>,
    },
}

/// Grouped-query attention.
#[derive(Clone, Debug)]
pub struct Attention {
    /// Query projection `[n_heads * head_dim, hidden]`.
    pub q_proj: Linear,
    /// Key projection `[n_kv_heads * head_dim, hidden]`.
    pub k_proj: Linear,
    /// Value projection.
    pub v_proj: Linear,
    /// Output projection `[hidden, n_heads * head_dim]`.
    pub o_proj: Linear,
    /// q/k normalisation.
    pub qk_norm: QkNorm,
    /// Clamp q, k and v to ±this (OLMoE's `clip_qkv`).
    pub clip_qkv: Option<f32>,
    /// Attend to at most this many positions, the query's own included (gpt-oss' sliding
    /// layers: key `j` is seen from query `i` when `i - j < window`).
    pub window: Option<usize>,
    /// One learned logit per query head that joins the softmax's denominator (gpt-oss).
    pub sinks: Option<Vec<f32>>,
    /// Qwen3-Next's output gate: `q_proj` gives `[q | gate]` per head (`2 head_dim` rows
    /// each), and the attention output is multiplied by `sigmoid(gate)` before `o_proj`.
    pub output_gate: bool,
}

/// Where a layer's keys and values are read: the key rows, the value rows, the floats
/// between positions, and the rows before position `p` comes back to row `p % rows`.
type KvRows<'a> = (&'a [f32], &'a [f32], usize, usize);

impl Attention {
    /// `{prefix}.{q,k,v,o}_proj`, with biases on q/k/v if `qkv_bias` and on o if `o_bias`.
    pub fn load(
        dir: &ModelDir,
        prefix: &str,
        info: &ModelInfo,
        qkv_bias: bool,
        o_bias: bool,
    ) -> Result<Attention> {
        Self::load_with(dir, prefix, info, qkv_bias, o_bias, false)
    }

    /// Gated attention (Qwen3-Next): as [`Attention::load`], with `q_proj` giving
    /// `[q | gate]` per head.
    pub fn load_gated(
        dir: &ModelDir,
        prefix: &str,
        info: &ModelInfo,
        bias: bool,
    ) -> Result<Attention> {
        Self::load_with(dir, prefix, info, bias, bias, true)
    }

    fn load_with(
        dir: &ModelDir,
        prefix: &str,
        info: &ModelInfo,
        qkv_bias: bool,
        o_bias: bool,
        output_gate: bool,
    ) -> Result<Attention> {
        let (h, qd, kvd) = (
            info.hidden_size,
            info.n_heads * info.head_dim,
            info.n_kv_heads * info.head_dim,
        );
        let w = |name: &str, rows: usize, cols: usize, bias: bool| {
            Linear::load_prefixed(dir, &format!("{prefix}.{name}"), rows, cols, bias)
        };
        Ok(Attention {
            q_proj: w("q_proj", if output_gate { 2 * qd } else { qd }, h, qkv_bias)?,
            k_proj: w("k_proj", kvd, h, qkv_bias)?,
            v_proj: w("v_proj", kvd, h, qkv_bias)?,
            o_proj: w("o_proj", h, qd, o_bias)?,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            window: None,
            sinks: None,
            output_gate,
        })
    }

    /// Sizes the shared q/k/v/attention rows for `n` tokens.
    pub(crate) fn reserve(&self, info: &ModelInfo, s: &mut Scratch, n: usize) {
        let (qd, kvd) = (
            info.n_heads * info.head_dim,
            info.n_kv_heads * info.head_dim,
        );
        grow(&mut s.q, n * qd);
        grow(&mut s.k, n * kvd);
        grow(&mut s.v, n * kvd);
        grow(&mut s.attn, n * qd);
        if self.output_gate {
            grow(&mut s.gate.packed, n * 2 * qd);
            grow(&mut s.gate.gate, n * qd);
        }
    }

    /// Attention of the step's tokens: leaves the projected output in `s.proj`.
    pub(crate) fn forward(&self, st: &Step, kv: &mut KvCache, s: &mut Scratch) {
        self.project(st, s);
        self.store_and_attend(st, kv, s, 0);
        self.output(st, s);
    }

    /// RoPE, the KV writes and the attention of the step's tokens (the scratch rows from
    /// `row0` on). A sliding-window layer whose cache is a ring (see
    /// [`super::ring::RingCache`]) takes them in pieces of at most the ring's slack, each
    /// written before it is read, so a piece never overwrites a key one of its own tokens
    /// reads.
    fn store_and_attend(&self, st: &Step, kv: &mut KvCache, s: &mut Scratch, row0: usize) {
        self.rotate(st, s, row0);
        let (li, kvd) = (st.layer, self.kv_width(st));
        let at0 = row0 * kvd;
        match kv.rings[li].as_mut() {
            None => {
                let n = st.n * kvd;
                kv.keys[li][st.start * kvd..][..n].copy_from_slice(&s.k[at0..at0 + n]);
                kv.values[li][st.start * kvd..][..n].copy_from_slice(&s.v[at0..at0 + n]);
                let rows = (&kv.keys[li][..], &kv.values[li][..], kvd, usize::MAX);
                self.attend(st, rows, s, row0);
            }
            Some(ring) => {
                ring.begin(st.start);
                let piece = ring.piece();
                for a in (0..st.n).step_by(piece) {
                    let part = Step {
                        n: piece.min(st.n - a),
                        start: st.start + a,
                        ..*st
                    };
                    for t in a..a + part.n {
                        let row = ring.key_mut(st.start + t);
                        let at = at0 + t * kvd;
                        row[..kvd].copy_from_slice(&s.k[at..at + kvd]);
                        row[kvd..].copy_from_slice(&s.v[at..at + kvd]);
                    }
                    let (keys, rows) = ring.key_ring();
                    self.attend(&part, (keys, &keys[kvd..], 2 * kvd, rows), s, row0 + a);
                }
            }
        }
    }

    /// Attention of rows of several sequences: row `r` is at position `starts[r]` of
    /// `kvs[seqs[r]]`. Projections run over all rows at once; each row's RoPE, KV write and
    /// attention are the single-token ones, in row order, on its sequence's cache.
    pub(crate) fn forward_rows(
        &self,
        st: &Step,
        kvs: &mut [&mut KvCache],
        seqs: &[usize],
        starts: &[usize],
        s: &mut Scratch,
    ) {
        self.project(st, s);
        for (r, (&q, &start)) in seqs.iter().zip(starts).enumerate() {
            let row = Step { n: 1, start, ..*st };
            self.store_and_attend(&row, kvs[q], s, r);
        }
        self.output(st, s);
    }

    fn output(&self, st: &Step, s: &mut Scratch) {
        let (n, h, qd) = (st.n, st.model.info.hidden_size, self.q_width(st));
        if self.output_gate {
            for (a, &g) in s.attn[..n * qd].iter_mut().zip(&s.gate.gate[..n * qd]) {
                *a *= sigmoid(g);
            }
        }
        self.o_proj
            .forward(&s.attn[..n * qd], n, &mut s.proj[..n * h]);
    }

    fn q_width(&self, st: &Step) -> usize {
        st.model.info.n_heads * st.model.info.head_dim
    }

    fn kv_width(&self, st: &Step) -> usize {
        st.model.info.n_kv_heads * st.model.info.head_dim
    }

    /// q, k, v projections, then the q/k norm and clipping.
    fn project(&self, st: &Step, s: &mut Scratch) {
        let (n, h) = (st.n, st.model.info.hidden_size);
        let (qd, kvd) = (self.q_width(st), self.kv_width(st));
        if self.output_gate {
            Linear::forward_group(
                [&self.q_proj, &self.k_proj, &self.v_proj],
                &s.xn[..n * h],
                n,
                [
                    &mut s.gate.packed[..n * 2 * qd],
                    &mut s.k[..n * kvd],
                    &mut s.v[..n * kvd],
                ],
            );
            let hd = st.model.info.head_dim;
            let per_head = s.gate.packed[..n * 2 * qd].chunks_exact(2 * hd);
            let outs = s.q[..n * qd]
                .chunks_exact_mut(hd)
                .zip(s.gate.gate[..n * qd].chunks_exact_mut(hd));
            for (src, (q, g)) in per_head.zip(outs) {
                q.copy_from_slice(&src[..hd]);
                g.copy_from_slice(&src[hd..]);
            }
        } else {
            Linear::forward_group(
                [&self.q_proj, &self.k_proj, &self.v_proj],
                &s.xn[..n * h],
                n,
                [&mut s.q[..n * qd], &mut s.k[..n * kvd], &mut s.v[..n * kvd]],
            );
        }
        // Full-projection weights span a whole row; per-head weights repeat every head_dim.
        if let QkNorm::FullProjection { q, k } | QkNorm::PerHead { q, k } = &self.qk_norm {
            let eps = st.model.rms_norm_eps;
            norm_rows_inplace(&mut s.q[..n * qd], q, eps);
            norm_rows_inplace(&mut s.k[..n * kvd], k, eps);
        }
        if let Some(c) = self.clip_qkv {
            for buf in [&mut s.q[..n * qd], &mut s.k[..n * kvd], &mut s.v[..n * kvd]] {
                for x in buf.iter_mut() {
                    *x = x.clamp(-c, c);
                }
            }
        }
    }

    /// RoPE on q and k, per position; the step's tokens are the scratch rows from `row0`
    /// on.
    fn rotate(&self, st: &Step, s: &mut Scratch, row0: usize) {
        let (n, start) = (st.n, st.start);
        let (qd, kvd, hd) = (self.q_width(st), self.kv_width(st), st.model.info.head_dim);
        let (q, k) = (
            &mut s.q[row0 * qd..(row0 + n) * qd],
            &mut s.k[row0 * kvd..(row0 + n) * kvd],
        );
        let (rope, layout) = (&st.model.rope, st.model.rope_layout);
        let work = |(t, (q, k)): (usize, (&mut [f32], &mut [f32]))| {
            rope_position(rope, layout, start + t, hd, q, k);
        };
        match st.positions {
            PositionLoop::Serial => q
                .chunks_mut(qd)
                .zip(k.chunks_mut(kvd))
                .enumerate()
                .for_each(work),
            PositionLoop::Parallel => q
                .par_chunks_mut(qd)
                .zip(k.par_chunks_mut(kvd))
                .enumerate()
                .for_each(work),
        }
    }

    /// Causal attention over the (position, head) items, split into at most
    /// ATTENTION_TASKS contiguous groups; each group reuses one row of scores. The step's
    /// tokens are the scratch rows from `row0` on.
    fn attend(&self, st: &Step, kv: KvRows, s: &mut Scratch, row0: usize) {
        let info = &st.model.info;
        let (n, start, ctx) = (st.n, st.start, st.ctx());
        let (hd, nh, nkv) = (info.head_dim, info.n_heads, info.n_kv_heads);
        let qd = nh * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let (keys, values, stride, rows) = kv;
        let group = nh / nkv;
        let q = &s.q[row0 * qd..(row0 + n) * qd];
        let items = n * nh;
        let per_task = items.div_ceil(ATTENTION_TASKS.min(items));
        s.attn[row0 * qd..(row0 + n) * qd]
            .par_chunks_mut(per_task * hd)
            .zip(s.scores[..items.div_ceil(per_task) * ctx].par_chunks_mut(ctx))
            .enumerate()
            .for_each(|(task, (outs, scores))| {
                for (j, out) in outs.chunks_mut(hd).enumerate() {
                    let i = task * per_task + j;
                    let (t, head) = (i / nh, i % nh);
                    let view = KvView {
                        keys,
                        values,
                        stride,
                        offset: (head / group) * hd,
                        head_dim: hd,
                    };
                    let q = &q[t * qd + head * hd..][..hd];
                    let end = start + t + 1;
                    let first = self.window.map_or(0, |w| end.saturating_sub(w));
                    let sink = self.sinks.as_ref().map(|s| s[head]);
                    attend_ring(q, view, rows, first..end, scale, sink, scores, out);
                }
            });
    }
}
