//! DeepSeek-V4's attention: shared-KV multi-query attention (one `head_dim` vector per
//! position serves as key and value) over a sliding window, plus, on compressed layers,
//! entries that each summarise `rate` positions:
//!
//! * `heavily_compressed_attention` (HCA): one entry per window of `rate` positions, a
//!   softmax-gated sum of the window's projections (per channel, with a learned bias per
//!   offset), normalised and rotated at the window's first position. Every finished
//!   window is attended.
//! * `compressed_sparse_attention` (CSA): entries from two interleaved series, each window
//!   joining the previous window's first series to its own second one (width `2 rate`,
//!   stride `rate`); a Lightning indexer with its own smaller compressor scores the
//!   finished entries for each query (`sum_h w_h relu(q_h · k)`) and only its top
//!   `index_topk` are attended.
//!
//! Queries come through a low-rank projection and a per-head unweighted RMSNorm; RoPE
//! rotates the trailing `rope_dim` channels of each head in interleaved pairs; each head
//! has a learned sink logit; the output's rotary channels are rotated back by the query's
//! position, and the heads go out through a grouped low-rank projection.
//!
//! What a sequence keeps ([`RingCache`]): the last positions' keys and, on compressed
//! layers, the compressors' raw projections in rings, and every finished entry. An entry
//! depends only on positions up to the one that completes it, so cutting the cache back
//! (within the rings' slack) leaves exactly the state a shorter sequence would have had,
//! and a prompt fed at once or token by token gives the same bits. Mirrors `DeepseekV4Attention`, `DeepseekV4HCACompressor`,
//! `DeepseekV4CSACompressor` and `DeepseekV4Indexer` of `modeling_deepseek_v4.py`.

use coli_kernels::dot::dot_f32;
use coli_kernels::norm::{rms_norm_inplace, rms_norm_unweighted_inplace};
use coli_kernels::rope::{apply as apply_rope, RopeLayout, RopeTable};
use coli_kernels::softmax::softmax_with_sink;
use rayon::prelude::*;

use super::compressor::Compressor;
use super::ring::{RingCache, RingShape};
use super::scratch::grow;
use super::{norm_rows_inplace, KvCache, Scratch, Step, ATTENTION_TASKS, MAX_ROT_HALF};
use crate::weights::Linear;

/// Index-score work (entries x heads x width) from which a query's scores are computed on
/// the thread pool: below it, waking the workers costs more than the sums.
const PARALLEL_SCORES: usize = 1 << 16;

/// The attention of one DeepSeek-V4 layer.
#[derive(Clone, Debug)]
pub struct CompressedAttention {
    /// `q_a_proj` `[q_lora_rank, hidden]`.
    pub q_a: Linear,
    /// `q_a_norm` `[q_lora_rank]`.
    pub q_a_norm: Vec<f32>,
    /// `q_b_proj` `[heads * head_dim, q_lora_rank]`.
    pub q_b: Linear,
    /// `kv_proj` `[head_dim, hidden]`: the shared key and value.
    pub kv: Linear,
    /// `kv_norm` `[head_dim]`.
    pub kv_norm: Vec<f32>,
    /// `o_a_proj`, one `[o_lora_rank, heads * head_dim / groups]` block per head group.
    pub o_a: Vec<Linear>,
    /// `o_b_proj` `[hidden, groups * o_lora_rank]`.
    pub o_b: Linear,
    /// One sink logit per head.
    pub sinks: Vec<f32>,
    /// Query heads.
    pub heads: usize,
    /// Width of a head, and of the shared key/value.
    pub head_dim: usize,
    /// Trailing channels of each head that RoPE rotates.
    pub rope_dim: usize,
    /// Positions of the sliding window, the query's own included.
    pub window: usize,
    /// This layer's RoPE (`main` on sliding layers, `compress` on compressed ones).
    pub rope: RopeTable,
    /// The compressor of a compressed layer.
    pub compressor: Option<Compressor>,
    /// The Lightning indexer of a CSA layer.
    pub indexer: Option<LightningIndexer>,
}

/// The Lightning indexer of a CSA layer.
#[derive(Clone, Debug)]
pub struct LightningIndexer {
    /// Its own compressor (two series, `index_head_dim` wide).
    pub compressor: Compressor,
    /// `q_b_proj` `[index_heads * index_head_dim, q_lora_rank]`.
    pub q_b: Linear,
    /// `weights_proj` `[index_heads, hidden]`.
    pub weights: Linear,
    /// Indexer heads.
    pub heads: usize,
    /// Entries each query keeps.
    pub top_k: usize,
}

/// Buffers of the compressed attention.
#[derive(Debug, Default)]
pub(crate) struct CompressedScratch {
    /// Low-rank queries `[n, q_lora_rank]`.
    qr: Vec<f32>,
    /// A compressor's raw projections `[n, series * dim]`.
    raw_kv: Vec<f32>,
    raw_gate: Vec<f32>,
    /// Indexer queries `[n, index_heads * index_head_dim]` and head weights.
    iq: Vec<f32>,
    iw: Vec<f32>,
    /// Each token's selected entries (`min(top_k, ctx / rate)` slots per token) and how
    /// many; the candidates' order while selecting.
    sel: Vec<u32>,
    order: Vec<u32>,
    sel_len: Vec<usize>,
    /// Index scores of one query over the finished entries.
    index_scores: Vec<f32>,
    /// Score rows of the attention tasks.
    scores: Vec<f32>,
    /// One head group's attention outputs `[n, group width]`, its low-rank outputs
    /// `[n, o_lora_rank]`, and every group's `[n, groups * o_lora_rank]`.
    group_in: Vec<f32>,
    group_one: Vec<f32>,
    group_out: Vec<f32>,
    /// A window's slots (values and gate logits) and the entry being finished.
    pub(super) slot_values: Vec<f32>,
    pub(super) slot_logits: Vec<f32>,
    pub(super) entry: Vec<f32>,
}

impl CompressedScratch {
    /// Floats held (the `u32`/`usize` rows counted as words).
    pub(crate) fn floats(&self) -> usize {
        [
            &self.qr,
            &self.raw_kv,
            &self.raw_gate,
            &self.iq,
            &self.iw,
            &self.index_scores,
            &self.scores,
            &self.group_in,
            &self.group_one,
            &self.group_out,
            &self.slot_values,
            &self.slot_logits,
            &self.entry,
        ]
        .iter()
        .map(|v| v.len())
        .sum::<usize>()
            + self.sel.len()
            + self.order.len()
            + 2 * self.sel_len.len()
    }
}

/// RoPE on the trailing `rope_dim` channels of `head` at `pos`, interleaved pairs; `back`
/// rotates by `-pos` (sin negated), as the attention output is.
pub(super) fn rotate(rope: &RopeTable, rope_dim: usize, pos: usize, head: &mut [f32], back: bool) {
    let half = rope_dim / 2;
    let mut cos = [0.0f32; MAX_ROT_HALF];
    let mut sin = [0.0f32; MAX_ROT_HALF];
    rope.cos_sin(pos, &mut cos[..half], &mut sin[..half]);
    if back {
        for v in &mut sin[..half] {
            *v = -*v;
        }
    }
    let hd = head.len();
    apply_rope(
        RopeLayout::Interleaved,
        &mut head[hd - rope_dim..],
        &cos[..half],
        &sin[..half],
    );
}

impl CompressedAttention {
    /// What the layer keeps in the cache: its window's keys, its compressors' raw rows
    /// (the main compressor's, then the indexer's) and their entries (likewise).
    pub fn ring_shape(&self) -> RingShape {
        let comps = || {
            self.compressor
                .iter()
                .chain(self.indexer.iter().map(|i| &i.compressor))
        };
        RingShape {
            window: self.window,
            key_width: self.head_dim,
            rate: self.rate(),
            overlap: self.compressor.as_ref().is_some_and(|c| c.overlap),
            raw_width: comps().map(Compressor::raw_width).sum(),
            entry_width: comps().map(|c| c.dim).sum(),
        }
    }

    /// The compression rate (0 on a sliding layer).
    fn rate(&self) -> usize {
        self.compressor.as_ref().map_or(0, |c| c.rate)
    }

    /// Where the indexer's compressor starts in a raw row and in an entry.
    fn indexer_offsets(&self) -> (usize, usize) {
        self.compressor
            .as_ref()
            .map_or((0, 0), |c| (c.raw_width(), c.dim))
    }

    /// Sizes the buffers for `n` tokens at a context of `ctx` positions.
    pub(crate) fn reserve(&self, s: &mut Scratch, n: usize, ctx: usize) {
        let (hd, nh) = (self.head_dim, self.heads);
        grow(&mut s.q, n * nh * hd);
        grow(&mut s.k, n * hd);
        grow(&mut s.attn, n * nh * hd);
        let c = &mut s.v4;
        grow(&mut c.qr, n * self.q_a.rows);
        let groups = self.o_a.len();
        let r = self.o_a.first().map_or(0, |l| l.rows);
        grow(&mut c.group_in, n * nh * hd / groups.max(1));
        grow(&mut c.group_one, n * r);
        grow(&mut c.group_out, n * groups * r);
        let entries = match self.rate() {
            0 => 0,
            r => ctx / r,
        };
        grow(
            &mut c.scores,
            ATTENTION_TASKS * (self.window.min(ctx) + entries),
        );
        let comps = || {
            self.compressor
                .iter()
                .chain(self.indexer.iter().map(|i| &i.compressor))
        };
        let w: usize = comps().map(Compressor::proj_width).sum();
        grow(&mut c.raw_kv, n * w);
        grow(&mut c.raw_gate, n * w);
        for comp in comps() {
            grow(&mut c.slot_values, 2 * comp.rate);
            grow(&mut c.slot_logits, 2 * comp.rate);
            grow(&mut c.entry, comp.dim);
        }
        if let Some(ix) = &self.indexer {
            grow(&mut c.iq, n * ix.heads * ix.compressor.dim);
            grow(&mut c.iw, n * ix.heads);
            grow(&mut c.sel, n * ix.top_k.min(entries));
            grow(&mut c.order, entries);
            grow(&mut c.sel_len, n);
            grow(&mut c.index_scores, entries);
        }
    }

    /// The step's tokens (`s.xn` in, `s.proj` out), writing their keys, compressor rows
    /// and the entries they finish into the layer's rings.
    ///
    /// Projections run over all the step's tokens at once; then the tokens go through the
    /// rings in pieces of at most [`RingCache::piece`], each piece written before it is
    /// read, so that no piece overwrites a position an earlier token of it still reads.
    pub(crate) fn forward(&self, st: &Step, kv: &mut KvCache, s: &mut Scratch) {
        let (n, start, li) = (st.n, st.start, st.layer);
        let h = st.model.info.hidden_size;
        let (hd, nh, rd) = (self.head_dim, self.heads, self.rope_dim);
        let eps = st.model.rms_norm_eps;
        let xn = &s.xn[..n * h];
        let qr = &mut s.v4.qr[..n * self.q_a.rows];
        self.q_a.forward(xn, n, qr);
        norm_rows_inplace(qr, &self.q_a_norm, eps);
        let q = &mut s.q[..n * nh * hd];
        self.q_b.forward(qr, n, q);
        for (i, head) in q.chunks_exact_mut(hd).enumerate() {
            rms_norm_unweighted_inplace(head, eps);
            rotate(&self.rope, rd, start + i / nh, head, false);
        }
        let k = &mut s.k[..n * hd];
        self.kv.forward(xn, n, k);
        for (t, row) in k.chunks_exact_mut(hd).enumerate() {
            rms_norm_inplace(row, &self.kv_norm, eps);
            rotate(&self.rope, rd, start + t, row, false);
        }
        // Both compressors' projections: the main one's rows, then the indexer's.
        let main_w = self.compressor.as_ref().map_or(0, Compressor::proj_width);
        let (kv_all, gate_all) = (&mut s.v4.raw_kv, &mut s.v4.raw_gate);
        let (main_kv, ix_kv) = kv_all.split_at_mut(n * main_w);
        let (main_gate, ix_gate) = gate_all.split_at_mut(n * main_w);
        if let Some(c) = &self.compressor {
            c.project(xn, n, main_kv, main_gate);
        }
        if let Some(ix) = &self.indexer {
            ix.compressor.project(xn, n, ix_kv, ix_gate);
            self.index_queries(ix, st, s);
        }
        let ring = kv.rings[li]
            .as_mut()
            .expect("a DeepSeek-V4 layer's cache has rings");
        ring.begin(start);
        let (ix_raw, ix_entry) = self.indexer_offsets();
        let piece = ring.piece();
        for a in (0..n).step_by(piece) {
            let b = (a + piece).min(n);
            for t in a..b {
                ring.set_key(start + t, &s.k[t * hd..(t + 1) * hd]);
            }
            let c4 = &mut s.v4;
            let (main_kv, ix_kv) = c4.raw_kv.split_at(n * main_w);
            let (main_gate, ix_gate) = c4.raw_gate.split_at(n * main_w);
            if let Some(c) = &self.compressor {
                for t in a..b {
                    let row = ring.raw_mut(start + t);
                    c.store(main_kv, main_gate, t, row, 0);
                    if let Some(ix) = &self.indexer {
                        ix.compressor.store(ix_kv, ix_gate, t, row, ix_raw);
                    }
                }
            }
            for p in start + a..start + b {
                if let Some(c) = self.compressor.as_ref() {
                    if (p + 1).is_multiple_of(c.rate) {
                        c.finish(p / c.rate, ring, 0, 0, eps, c4);
                        if let Some(ix) = &self.indexer {
                            ix.compressor
                                .finish(p / c.rate, ring, ix_raw, ix_entry, eps, c4);
                        }
                    }
                }
            }
            if let Some(ix) = &self.indexer {
                self.select(ix, st, ring, a..b, s);
            }
            self.attend(st, ring, a..b, s);
        }
        let attn = &mut s.attn[..n * nh * hd];
        for (i, head) in attn.chunks_exact_mut(hd).enumerate() {
            rotate(&self.rope, rd, start + i / nh, head, true);
        }
        self.output(n, h, s);
    }

    /// The indexer's queries and head weights for the step's tokens.
    fn index_queries(&self, ix: &LightningIndexer, st: &Step, s: &mut Scratch) {
        let (n, h) = (st.n, st.model.info.hidden_size);
        let (ih, id) = (ix.heads, ix.compressor.dim);
        let c = &mut s.v4;
        let (iq, iw) = (&mut c.iq[..n * ih * id], &mut c.iw[..n * ih]);
        ix.q_b.forward(&c.qr[..n * self.q_a.rows], n, iq);
        ix.weights.forward(&s.xn[..n * h], n, iw);
        let weight_scale = 1.0 / (ih as f32).sqrt();
        for w in iw.iter_mut() {
            *w *= weight_scale;
        }
    }

    /// The selection of the step's tokens `tokens`: each one's `top_k` best-scoring
    /// finished entries (ties to the earlier entry), in increasing order, into
    /// `s.v4.sel`.
    fn select(
        &self,
        ix: &LightningIndexer,
        st: &Step,
        ring: &RingCache,
        tokens: std::ops::Range<usize>,
        s: &mut Scratch,
    ) {
        let start = st.start;
        let comp = &ix.compressor;
        let (ih, id) = (ix.heads, comp.dim);
        let (_, off) = self.indexer_offsets();
        let c = &mut s.v4;
        let softmax_scale = 1.0 / (id as f32).sqrt();
        let stride_sel = ix.top_k.min(st.ctx() / comp.rate);
        for t in tokens {
            let p = start + t;
            let ready = (p + 1) / comp.rate;
            let sel = &mut c.sel[t * stride_sel..(t + 1) * stride_sel];
            if ready <= ix.top_k {
                // Every finished entry is kept: nothing to score.
                for (j, x) in sel[..ready].iter_mut().enumerate() {
                    *x = j as u32;
                }
                c.sel_len[t] = ready;
                continue;
            }
            let q = &mut c.iq[t * ih * id..(t + 1) * ih * id];
            for head in q.chunks_exact_mut(id) {
                rotate(&comp.rope, comp.rope_dim, p, head, false);
            }
            let scores = &mut c.index_scores[..ready];
            let (q, wts) = (&*q, &c.iw[t * ih..(t + 1) * ih]);
            // Each entry's score is its own serial sum over the heads: the same bits
            // whichever thread computes it.
            let score = |(win, sc): (usize, &mut f32)| {
                let key = &ring.entry(win)[off..off + id];
                let mut total = 0.0f32;
                for (hq, &wt) in q.chunks_exact(id).zip(wts) {
                    total += dot_f32(hq, key).max(0.0) * softmax_scale * wt;
                }
                *sc = total;
            };
            if ready * ih * id >= PARALLEL_SCORES {
                scores.par_iter_mut().enumerate().for_each(score);
            } else {
                scores.iter_mut().enumerate().for_each(score);
            }
            let keep = ix.top_k;
            top_k_ascending(scores, &mut c.order[..ready], &mut sel[..keep]);
            c.sel_len[t] = keep;
        }
    }

    /// Attention of every (token, head) of the step's tokens `tokens`: the sliding
    /// window's keys, then the compressed entries (every finished one on HCA layers, the
    /// selection on CSA layers), and the head's sink.
    fn attend(&self, st: &Step, ring: &RingCache, tokens: std::ops::Range<usize>, s: &mut Scratch) {
        let start = st.start;
        let (hd, nh) = (self.head_dim, self.heads);
        let scale = 1.0 / (hd as f32).sqrt();
        let rate = self.rate();
        let ctx = st.ctx();
        let row_len = self.window.min(ctx) + ctx.checked_div(rate).unwrap_or(0);
        let first_item = tokens.start * nh;
        let items = tokens.len() * nh;
        if items == 0 {
            return;
        }
        let per_task = items.div_ceil(ATTENTION_TASKS.min(items));
        let q = &s.q[..st.n * nh * hd];
        let (sel, sel_len) = (&s.v4.sel, &s.v4.sel_len);
        let top_k = self
            .indexer
            .as_ref()
            .map_or(0, |i| i.top_k.min(ctx / rate.max(1)));
        let entry_dim = self.compressor.as_ref().map_or(0, |c| c.dim);
        s.attn[first_item * hd..(first_item + items) * hd]
            .par_chunks_mut(per_task * hd)
            .zip(s.v4.scores[..items.div_ceil(per_task) * row_len].par_chunks_mut(row_len))
            .enumerate()
            .for_each(|(task, (outs, scores))| {
                for (j, out) in outs.chunks_mut(hd).enumerate() {
                    let i = first_item + task * per_task + j;
                    let (t, head) = (i / nh, i % nh);
                    let p = start + t;
                    let qh = &q[i * hd..(i + 1) * hd];
                    let first = (p + 1).saturating_sub(self.window);
                    let mut used = 0;
                    for pos in first..=p {
                        scores[used] = dot_f32(qh, ring.key(pos)) * scale;
                        used += 1;
                    }
                    let entries: &[u32] = match (&self.compressor, &self.indexer) {
                        (_, Some(_)) => &sel[t * top_k..t * top_k + sel_len[t]],
                        _ => &[],
                    };
                    let all = match (&self.compressor, &self.indexer) {
                        (Some(c), None) => (p + 1) / c.rate,
                        _ => 0,
                    };
                    let entry = |k: usize| -> &[f32] {
                        let win = if all > 0 { k } else { entries[k] as usize };
                        &ring.entry(win)[..entry_dim]
                    };
                    let extra = all + entries.len();
                    for k in 0..extra {
                        scores[used + k] = dot_f32(qh, entry(k)) * scale;
                    }
                    let total = used + extra;
                    softmax_with_sink(&mut scores[..total], self.sinks[head]);
                    out.fill(0.0);
                    for (pos, &pr) in (first..=p).zip(&scores[..used]) {
                        for (o, &v) in out.iter_mut().zip(ring.key(pos)) {
                            *o += pr * v;
                        }
                    }
                    for (k, &pr) in scores[used..total].iter().enumerate() {
                        for (o, &v) in out.iter_mut().zip(entry(k)) {
                            *o += pr * v;
                        }
                    }
                }
            });
    }

    /// The grouped output projection: each head group through its `o_a` block, then `o_b`.
    fn output(&self, n: usize, h: usize, s: &mut Scratch) {
        let groups = self.o_a.len();
        let width = self.heads * self.head_dim / groups;
        let r = self.o_a[0].rows;
        let c = &mut s.v4;
        let gi = &mut c.group_in[..n * width];
        let go = &mut c.group_out[..n * groups * r];
        let one = &mut c.group_one[..n * r];
        for (g, block) in self.o_a.iter().enumerate() {
            for t in 0..n {
                let src = &s.attn[t * self.heads * self.head_dim + g * width..][..width];
                gi[t * width..(t + 1) * width].copy_from_slice(src);
            }
            block.forward(gi, n, one);
            for t in 0..n {
                go[t * groups * r + g * r..][..r].copy_from_slice(&one[t * r..(t + 1) * r]);
            }
        }
        self.o_b.forward(go, n, &mut s.proj[..n * h]);
    }
}

/// The indices of the `out.len()` largest scores, ascending, through `order` (scratch of
/// `scores.len()`): a selection in linear time, then a sort of the kept ones. Ties go to
/// the lower index (a choice: torch's `topk` breaks them arbitrarily; the oracle fixtures
/// refuse near-ties); a NaN score ranks below every number.
fn top_k_ascending(scores: &[f32], order: &mut [u32], out: &mut [u32]) {
    let k = out.len();
    assert!(k <= scores.len() && order.len() == scores.len());
    for (i, o) in order.iter_mut().enumerate() {
        *o = i as u32;
    }
    let key = |i: u32| {
        let v = scores[i as usize];
        if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            v
        }
    };
    // Score descending, then index ascending: a total order.
    let cmp = |a: &u32, b: &u32| key(*b).total_cmp(&key(*a)).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k, cmp);
    }
    out.copy_from_slice(&order[..k]);
    out.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_keeps_the_largest_and_breaks_ties_to_the_earlier_entry() {
        let scores = [0.5f32, 2.0, -1.0, 2.0, 0.7];
        let (mut order, mut out) = ([0u32; 5], [0u32; 3]);
        top_k_ascending(&scores, &mut order, &mut out);
        assert_eq!(out, [1, 3, 4]);
        let (mut order, mut two) = ([0u32; 3], [0u32; 2]);
        top_k_ascending(&[1.0, 1.0, 1.0], &mut order, &mut two);
        assert_eq!(two, [0, 1]);
        // A NaN never displaces a number; -0.0 and 0.0 tie to the lower index.
        let (mut order, mut two) = ([0u32; 4], [0u32; 2]);
        top_k_ascending(&[f32::NAN, -0.0, 0.0, -5.0], &mut order, &mut two);
        assert_eq!(two, [1, 2]);
    }

    /// The linear-time selection against a sort of every candidate, on many random rows
    /// with repeated values.
    #[test]
    fn selection_equals_sorting_every_candidate() {
        let mut x = 0x9E37_79B9_u64;
        for len in 1..60 {
            for k in 0..=len {
                let scores: Vec<f32> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % 7) as f32 - 3.0
                    })
                    .collect();
                let mut all: Vec<u32> = (0..len as u32).collect();
                all.sort_by(|a, b| {
                    scores[*b as usize]
                        .total_cmp(&scores[*a as usize])
                        .then(a.cmp(b))
                });
                let mut want = all[..k].to_vec();
                want.sort_unstable();
                let (mut order, mut out) = (vec![0u32; len], vec![0u32; k]);
                top_k_ascending(&scores, &mut order, &mut out);
                assert_eq!(out, want, "len {len} k {k}");
            }
        }
    }
}
