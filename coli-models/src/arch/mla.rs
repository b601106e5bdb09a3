//! Multi-head latent attention (DeepSeek-V3, Kimi-K2, GLM-5). The cache keeps per
//! position only the normalised latent (`rank` values) and the rotated shared key
//! (`rope` values). Queries are absorbed into the latent space (`q_nope · W_uk`) and the
//! attended latent is expanded by `W_uv` afterwards, so prefill and decode run the
//! same per-token arithmetic.

use coli_core::ModelDir;
use coli_kernels::attention::{attend, attend_selected, KvView};
use coli_kernels::rope::apply as apply_rope;
use rayon::prelude::*;

use super::scratch::grow;
use super::{norm_rows_inplace, Dsa, KvCache, PositionLoop, Scratch, Step};
use super::{ATTENTION_TASKS, MAX_ROT_HALF};
use crate::error::Result;
use crate::weights::{load_vector, Linear};

/// Epsilon of the two low-rank norms (`q_a_layernorm`, `kv_a_layernorm`): fixed in the
/// DeepSeek-V3 and GLM-5 references, not read from the config.
pub const LOW_RANK_NORM_EPS: f32 = 1e-6;

/// How MLA forms its queries.
// One per layer, read in place: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum MlaQuery {
    /// One projection `q_proj` (`q_lora_rank` null).
    Direct(Linear),
    /// `q_b(norm(q_a x))`.
    LowRank {
        /// `[q_lora_rank, hidden]`.
        a: Linear,
        /// RMSNorm weight of length `q_lora_rank`.
        norm: Vec<f32>,
        /// `[n_heads * (nope + rope), q_lora_rank]`.
        b: Linear,
    },
}

/// The latent's up-projection, as a checkpoint stores it. (One per MLA layer: the split
/// variant's two matrices are kept inline.)
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum KvUp {
    /// `kv_b_proj`: `[n_heads * (nope + v_dim), rank]`, per head `nope` key rows then
    /// `v_dim` value rows (Hugging Face checkpoints, older GGUFs' `attn_kv_b`).
    Fused(Linear),
    /// llama.cpp's split of it (GGUF `attn_k_b`, `attn_v_b`).
    Split {
        /// `[n_heads * rank, nope]`: each head's key part transposed, row `head * rank + c`
        /// holding column `c` of the head's key rows.
        k: Linear,
        /// `[n_heads * v_dim, rank]`: each head's value rows.
        v: Linear,
    },
}

/// Multi-head latent attention (see the module doc).
#[derive(Clone, Debug)]
pub struct Mla {
    /// Query projection(s).
    pub q: MlaQuery,
    /// `kv_a_proj_with_mqa`: `[rank + rope, hidden]`.
    pub kv_a: Linear,
    /// RMSNorm of the latent, length `rank`.
    pub kv_norm: Vec<f32>,
    /// The latent's up-projection to keys and values.
    pub kv_b: KvUp,
    /// `[hidden, n_heads * v_dim]`.
    pub o_proj: Linear,
    /// Attention heads.
    pub n_heads: usize,
    /// Non-rotary query/key dims per head.
    pub nope: usize,
    /// Rotary dims per head (shared key).
    pub rope: usize,
    /// Value dims per head.
    pub v_dim: usize,
    /// `kv_lora_rank`.
    pub rank: usize,
    /// Epsilon of the two low-rank norms.
    pub norm_eps: f32,
    /// Softmax scale (`qk_head_dim^-0.5`, times YaRN's mscale² where configured).
    pub scale: f32,
    /// DeepSeek sparse attention (GLM-5): attend only to the positions the indexer selects.
    pub dsa: Option<Dsa>,
}

/// Shapes of an MLA block (config keys of DeepSeek-V3).
#[derive(Clone, Copy, Debug)]
pub struct MlaDims {
    /// `num_attention_heads`.
    pub n_heads: usize,
    /// `q_lora_rank` (None: a plain `q_proj`).
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank`.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`.
    pub nope: usize,
    /// `qk_rope_head_dim`.
    pub rope: usize,
    /// `v_head_dim`.
    pub v_dim: usize,
}

impl MlaDims {
    /// Checks every dimension; errors name the config key.
    pub fn validate(&self, dir: &ModelDir) -> Result<()> {
        let c = &dir.config;
        for (key, v) in [
            ("num_attention_heads", self.n_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.nope),
            ("v_head_dim", self.v_dim),
        ] {
            if v == 0 {
                return Err(c.error(key, "must be positive").into());
            }
        }
        if self.rope == 0 || !self.rope.is_multiple_of(2) || self.rope / 2 > MAX_ROT_HALF {
            return Err(c
                .error(
                    "qk_rope_head_dim",
                    format!(
                        "{} must be even, positive and at most {}",
                        self.rope,
                        2 * MAX_ROT_HALF
                    ),
                )
                .into());
        }
        if self.q_lora_rank == Some(0) {
            return Err(c.error("q_lora_rank", "must be positive or null").into());
        }
        Ok(())
    }
}

/// The MLA keys of a DeepSeek-style config.json (flattened into the family configs).
#[derive(Clone, Copy, Debug, serde::Deserialize)]
pub struct MlaConfig {
    /// Rank of the compressed key/value latent.
    pub kv_lora_rank: usize,
    /// Rank of the query compression (null: plain `q_proj`).
    #[serde(default)]
    pub q_lora_rank: Option<usize>,
    /// Rotary dims per head.
    pub qk_rope_head_dim: usize,
    /// Value dims per head.
    pub v_head_dim: usize,
    /// Non-rotary query/key dims per head.
    pub qk_nope_head_dim: usize,
    /// Biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`.
    #[serde(default)]
    pub attention_bias: bool,
}

impl MlaConfig {
    /// The block's shapes for `n_heads` heads.
    pub fn dims(&self, n_heads: usize) -> MlaDims {
        MlaDims {
            n_heads,
            q_lora_rank: self.q_lora_rank,
            kv_lora_rank: self.kv_lora_rank,
            nope: self.qk_nope_head_dim,
            rope: self.qk_rope_head_dim,
            v_dim: self.v_head_dim,
        }
    }
}

/// MLA's softmax scale: `qk_head_dim^-0.5`, times `mscale(factor, mscale_all_dim)²`
/// under YaRN (as `transformers`' DeepSeek-V3 and GLM-5 attention).
pub fn softmax_scale(qk_head_dim: usize, scaling: &coli_core::RopeScaling) -> f32 {
    let mut s = (qk_head_dim as f64).powf(-0.5);
    if let coli_core::RopeScaling::Yarn(y) = scaling {
        if let Some(m) = y.mscale_all_dim.filter(|m| *m != 0.0) {
            let ms = coli_core::yarn_get_mscale(y.factor, m);
            s = s * ms * ms;
        }
    }
    s as f32
}

/// One position's query row, latent row and cache row, as the MLA position loop hands them out.
type MlaPositionItem<'a> = (usize, ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]));

impl Mla {
    /// An MLA block `{prefix}.{q_proj | q_a_proj, q_a_layernorm, q_b_proj},
    /// kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj` (biases where `bias`).
    pub fn load(
        dir: &ModelDir,
        prefix: &str,
        d: &MlaDims,
        hidden: usize,
        bias: bool,
        scale: f32,
    ) -> Result<Mla> {
        let (nh, qk) = (d.n_heads, d.nope + d.rope);
        let w = |name: &str, rows: usize, cols: usize, b: bool| {
            Linear::load_prefixed(dir, &format!("{prefix}.{name}"), rows, cols, b)
        };
        let q = match d.q_lora_rank {
            None => MlaQuery::Direct(w("q_proj", nh * qk, hidden, false)?),
            Some(qr) => MlaQuery::LowRank {
                a: w("q_a_proj", qr, hidden, bias)?,
                norm: load_vector(dir, &format!("{prefix}.q_a_layernorm.weight"), qr)?,
                b: w("q_b_proj", nh * qk, qr, false)?,
            },
        };
        Ok(Mla {
            q,
            kv_a: w("kv_a_proj_with_mqa", d.kv_lora_rank + d.rope, hidden, bias)?,
            kv_norm: load_vector(
                dir,
                &format!("{prefix}.kv_a_layernorm.weight"),
                d.kv_lora_rank,
            )?,
            kv_b: if !dir.has(&format!("{prefix}.kv_b_proj.weight"))
                && dir.has(&format!("{prefix}.k_b_proj.weight"))
            {
                KvUp::Split {
                    k: w("k_b_proj", nh * d.kv_lora_rank, d.nope, false)?,
                    v: w("v_b_proj", nh * d.v_dim, d.kv_lora_rank, false)?,
                }
            } else {
                KvUp::Fused(w(
                    "kv_b_proj",
                    nh * (d.nope + d.v_dim),
                    d.kv_lora_rank,
                    false,
                )?)
            },
            o_proj: w("o_proj", hidden, nh * d.v_dim, bias)?,
            n_heads: nh,
            nope: d.nope,
            rope: d.rope,
            v_dim: d.v_dim,
            rank: d.kv_lora_rank,
            norm_eps: LOW_RANK_NORM_EPS,
            scale,
            dsa: None,
        })
    }

    /// Width of a cache row (latent + rotary key).
    fn key_width(&self) -> usize {
        self.rank + self.rope
    }

    /// Sizes the query, latent and (with DSA) selection buffers.
    pub(crate) fn reserve(&self, s: &mut Scratch, n: usize, ctx: usize) {
        let kw = self.key_width();
        grow(&mut s.q, n * self.n_heads * (self.nope + self.rope));
        grow(&mut s.k, n * kw);
        grow(&mut s.attn, n * self.n_heads * self.v_dim);
        if let MlaQuery::LowRank { a, .. } = &self.q {
            grow(&mut s.mla.qa, n * a.rows);
        }
        grow(&mut s.mla.qabs, self.n_heads * n * kw);
        grow(&mut s.mla.latent, self.n_heads * n * self.rank);
        grow(&mut s.mla.rowbuf, self.n_heads * self.rank);
        if let Some(d) = &self.dsa {
            d.reserve(&mut s.dsa, n, ctx);
        }
    }

    /// Attention of the step's tokens: leaves the projected output in `s.proj`.
    pub(crate) fn forward(&self, st: &Step, kv: &mut KvCache, s: &mut Scratch) {
        self.project(st, s);
        self.normalise_rotate_store(st, kv, s);
        if let Some(Dsa {
            indexer: Some(ind),
            top_k,
        }) = &self.dsa
        {
            ind.select_positions(st, self.rope, *top_k, kv, s);
        }
        self.absorb_queries(st.n, s);
        self.attend_latent(st, kv, s);
        self.expand_values(st.n, s);
        let (n, h) = (st.n, st.model.info.hidden_size);
        self.o_proj.forward(
            &s.attn[..n * self.n_heads * self.v_dim],
            n,
            &mut s.proj[..n * h],
        );
    }

    /// Queries (through the low-rank path where configured) and the latent + rotary key.
    fn project(&self, st: &Step, s: &mut Scratch) {
        let (n, h) = (st.n, st.model.info.hidden_size);
        let (qk, kw) = (self.nope + self.rope, self.key_width());
        let nh = self.n_heads;
        let xn = &s.xn[..n * h];
        match &self.q {
            MlaQuery::Direct(qp) => Linear::forward_group(
                [qp, &self.kv_a],
                xn,
                n,
                [&mut s.q[..n * nh * qk], &mut s.k[..n * kw]],
            ),
            MlaQuery::LowRank { a, norm, b } => {
                let qr = a.rows;
                let qa = &mut s.mla.qa[..n * qr];
                Linear::forward_group([a, &self.kv_a], xn, n, [&mut *qa, &mut s.k[..n * kw]]);
                norm_rows_inplace(qa, norm, self.norm_eps);
                b.forward(qa, n, &mut s.q[..n * nh * qk]);
            }
        }
    }

    /// Per position: normalise the latent, rotate the rope parts, write the cache row.
    fn normalise_rotate_store(&self, st: &Step, kv: &mut KvCache, s: &mut Scratch) {
        let (n, start) = (st.n, st.start);
        let (nope, rp, r) = (self.nope, self.rope, self.rank);
        let (qk, kw, nh) = (nope + rp, self.key_width(), self.n_heads);
        let (rope, layout) = (&st.model.rope, st.model.rope_layout);
        let cache = &mut kv.keys[st.layer][start * kw..(start + n) * kw];
        let work = |(t, ((q, k), c)): MlaPositionItem| {
            coli_kernels::norm::rms_norm_inplace(&mut k[..r], &self.kv_norm, self.norm_eps);
            let half = rp / 2;
            let mut cos = [0.0f32; MAX_ROT_HALF];
            let mut sin = [0.0f32; MAX_ROT_HALF];
            rope.cos_sin(start + t, &mut cos[..half], &mut sin[..half]);
            apply_rope(layout, &mut k[r..], &cos[..half], &sin[..half]);
            for head in q.chunks_mut(qk) {
                apply_rope(layout, &mut head[nope..], &cos[..half], &sin[..half]);
            }
            c.copy_from_slice(k);
        };
        match st.positions {
            PositionLoop::Serial => s.q[..n * nh * qk]
                .chunks_mut(nh * qk)
                .zip(s.k[..n * kw].chunks_mut(kw))
                .zip(cache.chunks_mut(kw))
                .enumerate()
                .for_each(work),
            PositionLoop::Parallel => s.q[..n * nh * qk]
                .par_chunks_mut(nh * qk)
                .zip(s.k[..n * kw].par_chunks_mut(kw))
                .zip(cache.par_chunks_mut(kw))
                .enumerate()
                .for_each(work),
        }
    }

    /// Absorbed queries, head-major `[head][t] = (q_nope · W_uk(head), q_rope)`: the nope
    /// rows of W_uk are accumulated in increasing order, per token.
    fn absorb_queries(&self, n: usize, s: &mut Scratch) {
        let (nope, rp, vd, r, nh) = (self.nope, self.rope, self.v_dim, self.rank, self.n_heads);
        let (qk, kw) = (nope + rp, self.key_width());
        let q = &s.q[..n * nh * qk];
        s.mla.qabs[..nh * n * kw]
            .par_chunks_mut(n * kw)
            .zip(s.mla.rowbuf[..nh * r].par_chunks_mut(r))
            .enumerate()
            .for_each(|(head, (qa, row))| {
                qa.fill(0.0);
                match &self.kv_b {
                    KvUp::Fused(kv_b) => {
                        for i in 0..nope {
                            kv_b.row_f32(head * (nope + vd) + i, row);
                            for t in 0..n {
                                let qi = q[t * nh * qk + head * qk + i];
                                for (d, &w) in qa[t * kw..t * kw + r].iter_mut().zip(row.iter()) {
                                    *d += qi * w;
                                }
                            }
                        }
                    }
                    // Latent element c is the dot product of row (head, c) with q_nope.
                    KvUp::Split { k, .. } => {
                        for t in 0..n {
                            let qn = &q[t * nh * qk + head * qk..][..nope];
                            for (c, d) in qa[t * kw..t * kw + r].iter_mut().enumerate() {
                                *d = k.dot_row(head * r + c, qn);
                            }
                        }
                    }
                }
                for t in 0..n {
                    qa[t * kw + r..(t + 1) * kw]
                        .copy_from_slice(&q[t * nh * qk + head * qk + nope..][..rp]);
                }
            });
    }

    /// Attention over the latent cache: keys are whole rows, values their first `r` values.
    /// Sparse layers attend to each token's selected positions (this layer's indexer or the
    /// previous layer's selection); dense layers to every earlier position.
    fn attend_latent(&self, st: &Step, kv: &KvCache, s: &mut Scratch) {
        let (n, start, ctx) = (st.n, st.start, st.ctx());
        let (r, kw, nh) = (self.rank, self.key_width(), self.n_heads);
        let cache = &kv.keys[st.layer][..ctx * kw];
        let qabs = &s.mla.qabs[..nh * n * kw];
        let selection = self
            .dsa
            .as_ref()
            .map(|d| (d.top_k, &s.dsa.sel[..], &s.dsa.sel_len[..n]));
        let items = nh * n;
        let per_task = items.div_ceil(ATTENTION_TASKS.min(items));
        s.mla.latent[..items * r]
            .par_chunks_mut(per_task * r)
            .zip(s.scores[..items.div_ceil(per_task) * ctx].par_chunks_mut(ctx))
            .enumerate()
            .for_each(|(task, (outs, scores))| {
                for (j, out) in outs.chunks_mut(r).enumerate() {
                    let i = task * per_task + j;
                    let t = i % n;
                    let view = KvView {
                        keys: cache,
                        values: cache,
                        stride: kw,
                        offset: 0,
                        head_dim: kw,
                    };
                    let q = &qabs[i * kw..][..kw];
                    match selection {
                        Some((k, sel, len)) => {
                            let positions = &sel[t * k..][..len[t]];
                            attend_selected(q, view, positions, self.scale, scores, out)
                        }
                        None => attend(q, view, start + t + 1, self.scale, scores, out),
                    }
                }
            });
    }

    /// Expands each head's attended latent through W_uv into token-major `[t][head][v]`.
    fn expand_values(&self, n: usize, s: &mut Scratch) {
        let (nope, vd, r, nh) = (self.nope, self.v_dim, self.rank, self.n_heads);
        let latent = &s.mla.latent[..nh * n * r];
        s.attn[..n * nh * vd]
            .par_chunks_mut(vd)
            .enumerate()
            .for_each(|(i, out)| {
                let (t, head) = (i / nh, i % nh);
                let c = &latent[(head * n + t) * r..][..r];
                for (j, o) in out.iter_mut().enumerate() {
                    *o = match &self.kv_b {
                        KvUp::Fused(kv_b) => kv_b.dot_row(head * (nope + vd) + nope + j, c),
                        KvUp::Split { v, .. } => v.dot_row(head * vd + j, c),
                    };
                }
            });
    }
}
