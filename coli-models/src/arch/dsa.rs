//! DeepSeek sparse attention (GLM-5): a lightning indexer of a few small heads scores
//! every earlier position; the layer's MLA attends only to the best `top_k`. A layer
//! without its own indexer ("shared") reuses the previous layer's selection.

use coli_core::ModelDir;
use coli_kernels::rope::{apply as apply_rope, RopeLayout};
use rayon::prelude::*;

use super::scratch::{grow, DsaScratch};
use super::{KvCache, PositionLoop, Scratch, Step, ATTENTION_TASKS, MAX_ROT_HALF};
use crate::error::Result;
use crate::weights::{load_vector, Linear};

/// The lightning indexer of DeepSeek sparse attention: a few small heads score every
/// earlier position; the best `top_k` are the only ones the layer attends to.
#[derive(Clone, Debug)]
pub struct Indexer {
    /// `wq_b`: `[n_heads * head_dim, q_lora_rank]`, applied to the normalised low-rank query.
    pub wq_b: Linear,
    /// `wk`: `[head_dim, hidden]`.
    pub wk: Linear,
    /// LayerNorm weight of the key (`k_norm`), length `head_dim`.
    pub k_norm_weight: Vec<f32>,
    /// LayerNorm bias of the key.
    pub k_norm_bias: Vec<f32>,
    /// `weights_proj`: `[n_heads, hidden]`, per-token head weights.
    pub weights_proj: Linear,
    /// Indexer heads.
    pub n_heads: usize,
    /// Indexer head dimension (its first `rope` dims are rotated, interleaved).
    pub head_dim: usize,
}

/// Sparse attention settings of one MLA layer.
#[derive(Clone, Debug)]
pub struct Dsa {
    /// This layer's indexer, or `None` to reuse the previous layer's selection ("shared").
    pub indexer: Option<Indexer>,
    /// Positions each query attends to at most (`index_topk`).
    pub top_k: usize,
}

/// Epsilon of the indexer's key LayerNorm (fixed in the reference).
pub const INDEXER_NORM_EPS: f32 = 1e-6;

/// One position's indexer query, key, head weights and cache row.
type IndexerPositionItem<'a> = (
    usize,
    (
        ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]),
        &'a mut [f32],
    ),
);

impl Dsa {
    /// Sizes the selection buffers (and the indexer's, where this layer runs one).
    pub(crate) fn reserve(&self, s: &mut DsaScratch, n: usize, ctx: usize) {
        grow(&mut s.sel, n * self.top_k);
        grow(&mut s.sel_len, n);
        grow(&mut s.sel_order, ATTENTION_TASKS * ctx);
        if let Some(ind) = &self.indexer {
            grow(&mut s.iq, n * ind.n_heads * ind.head_dim);
            grow(&mut s.ik, n * ind.head_dim);
            grow(&mut s.iw, n * ind.n_heads);
        }
    }
}

impl Indexer {
    /// `{prefix}.{wq_b, wk, k_norm, weights_proj}` for `n_heads` heads of `head_dim`,
    /// reading the `q_lora_rank`-wide normalised query.
    pub fn load(
        dir: &ModelDir,
        prefix: &str,
        n_heads: usize,
        head_dim: usize,
        q_lora_rank: usize,
        hidden: usize,
    ) -> Result<Indexer> {
        let name = |n: &str| format!("{prefix}.{n}");
        Ok(Indexer {
            wq_b: Linear::load(dir, &name("wq_b.weight"), n_heads * head_dim, q_lora_rank)?,
            wk: Linear::load(dir, &name("wk.weight"), head_dim, hidden)?,
            k_norm_weight: load_vector(dir, &name("k_norm.weight"), head_dim)?,
            k_norm_bias: load_vector(dir, &name("k_norm.bias"), head_dim)?,
            weights_proj: Linear::load(dir, &name("weights_proj.weight"), n_heads, hidden)?,
            n_heads,
            head_dim,
        })
    }

    /// Projects, normalises and rotates the step's indexer queries and keys, appends the
    /// keys to the layer's index cache, and leaves in `s.dsa.sel` each token's `top_k`
    /// best earlier positions (ascending), scored `sum_h w_h * relu(q_h · k * scale)`;
    /// ties go to the earlier position. `rope` is the MLA block's rotary width.
    pub(crate) fn select_positions(
        &self,
        st: &Step,
        rope: usize,
        top_k: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
    ) {
        self.project_and_store(st, rope, kv, s);
        self.select(st, top_k, kv, &mut s.dsa, &mut s.scores);
    }

    fn project_and_store(&self, st: &Step, rp: usize, kv: &mut KvCache, s: &mut Scratch) {
        let (n, start, h) = (st.n, st.start, st.model.info.hidden_size);
        let (ih, id) = (self.n_heads, self.head_dim);
        let qr = self.wq_b.cols;
        let d = &mut s.dsa;
        self.wq_b
            .forward(&s.mla.qa[..n * qr], n, &mut d.iq[..n * ih * id]);
        Linear::forward_group(
            [&self.wk, &self.weights_proj],
            &s.xn[..n * h],
            n,
            [&mut d.ik[..n * id], &mut d.iw[..n * ih]],
        );
        let head_scale = (ih as f64).powf(-0.5) as f32;
        let rope = &st.model.rope;
        let cache = &mut kv.index_keys[st.layer][start * id..(start + n) * id];
        let work = |(t, (((q, k), w), c)): IndexerPositionItem| {
            coli_kernels::norm::layer_norm_inplace(
                k,
                &self.k_norm_weight,
                &self.k_norm_bias,
                INDEXER_NORM_EPS,
            );
            let half = rp / 2;
            let mut cos = [0.0f32; MAX_ROT_HALF];
            let mut sin = [0.0f32; MAX_ROT_HALF];
            rope.cos_sin(start + t, &mut cos[..half], &mut sin[..half]);
            let (cos, sin) = (&cos[..half], &sin[..half]);
            apply_rope(RopeLayout::Interleaved, &mut k[..rp], cos, sin);
            for head in q.chunks_mut(id) {
                apply_rope(RopeLayout::Interleaved, &mut head[..rp], cos, sin);
            }
            for x in w.iter_mut() {
                *x *= head_scale;
            }
            c.copy_from_slice(k);
        };
        match st.positions {
            PositionLoop::Serial => d.iq[..n * ih * id]
                .chunks_mut(ih * id)
                .zip(d.ik[..n * id].chunks_mut(id))
                .zip(d.iw[..n * ih].chunks_mut(ih))
                .zip(cache.chunks_mut(id))
                .enumerate()
                .for_each(work),
            PositionLoop::Parallel => d.iq[..n * ih * id]
                .par_chunks_mut(ih * id)
                .zip(d.ik[..n * id].par_chunks_mut(id))
                .zip(d.iw[..n * ih].par_chunks_mut(ih))
                .zip(cache.par_chunks_mut(id))
                .enumerate()
                .for_each(work),
        }
    }

    fn select(
        &self,
        st: &Step,
        top_k: usize,
        kv: &KvCache,
        d: &mut DsaScratch,
        scores: &mut [f32],
    ) {
        let (n, start, ctx) = (st.n, st.start, st.ctx());
        let (ih, id) = (self.n_heads, self.head_dim);
        let keys = &kv.index_keys[st.layer][..ctx * id];
        let (iq, iw) = (&d.iq[..n * ih * id], &d.iw[..n * ih]);
        let score_scale = (id as f64).powf(-0.5) as f32;
        let per_task = n.div_ceil(ATTENTION_TASKS.min(n));
        d.sel[..n * top_k]
            .par_chunks_mut(per_task * top_k)
            .zip(d.sel_len[..n].par_chunks_mut(per_task))
            .zip(scores[..n.div_ceil(per_task) * ctx].par_chunks_mut(ctx))
            .zip(d.sel_order[..n.div_ceil(per_task) * ctx].par_chunks_mut(ctx))
            .enumerate()
            .for_each(|(task, (((sel, len), scores), order))| {
                for (j, (sel, len)) in sel.chunks_mut(top_k).zip(len.iter_mut()).enumerate() {
                    let t = task * per_task + j;
                    let visible = start + t + 1;
                    for (p, sc) in scores[..visible].iter_mut().enumerate() {
                        let k = &keys[p * id..][..id];
                        let mut acc = 0.0f32;
                        for hh in 0..ih {
                            let q = &iq[(t * ih + hh) * id..][..id];
                            let d = coli_kernels::dot::dot_f32(q, k) * score_scale;
                            acc += iw[t * ih + hh] * d.max(0.0);
                        }
                        *sc = acc;
                    }
                    *len = top_positions(&scores[..visible], top_k, &mut order[..visible], sel);
                }
            });
    }
}

/// The `top_k` highest-scoring positions (ties to the earlier one), ascending, into `sel`;
/// returns how many were chosen.
fn top_positions(scores: &[f32], top_k: usize, order: &mut [u32], sel: &mut [u32]) -> usize {
    let visible = scores.len();
    let k = top_k.min(visible);
    for (p, o) in order.iter_mut().enumerate() {
        *o = p as u32;
    }
    let better = |a: &u32, b: &u32| {
        scores[*b as usize]
            .total_cmp(&scores[*a as usize])
            .then(a.cmp(b))
    };
    if k < visible {
        order.select_nth_unstable_by(k - 1, better);
    }
    let chosen = &mut order[..k];
    chosen.sort_unstable();
    sel[..k].copy_from_slice(chosen);
    k
}
