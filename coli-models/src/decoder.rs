//! The decoder-only transformer shared by the families: GQA attention with
//! optional q/k norm or multi-head latent attention (MLA), dense SwiGLU MLP or a
//! routed MoE block (softmax or grouped-sigmoid routing, optional shared expert),
//! pre-norm residual layers. Family files build it from their own config and
//! tensor names.
//!
//! One forward pass handles any number of tokens: prefill is the same code as
//! decode with more rows, and every per-token result is computed in the same
//! order either way, so a prompt fed in one batch and one token at a time give
//! identical bits.

use coli_kernels::attention::{attend, attend_selected, KvView};
use coli_kernels::norm::{rms_norm, swiglu_inplace};
use coli_kernels::rope::{apply as apply_rope, RopeLayout, RopeTable};
use coli_kernels::routing::{
    sigmoid, sigmoid_group_top_k, softmax_top_k, GroupedSigmoid, RouteScratch,
};
use coli_kernels::MatRef;
use rayon::prelude::*;

use crate::weights::Linear;

/// Shape facts every caller needs.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The family's display name.
    pub family: &'static str,
    /// `model_type` as written in config.json.
    pub model_type: String,
    /// Vocabulary size (rows of the embedding and the LM head).
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Dimension per head.
    pub head_dim: usize,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// End-of-sequence ids from config.json.
    pub eos_token_ids: Vec<u32>,
    /// What the KV cache stores per position and layer.
    pub kv: KvShape,
}

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
}

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

/// Multi-head latent attention (DeepSeek-V3, Kimi-K2, GLM-5). The cache keeps per
/// position only the normalised latent (`rank` values) and the rotated shared key
/// (`rope` values). Queries are absorbed into the latent space (`q_nope · W_uk`) and the
/// attended latent is expanded by `W_uv` afterwards, so prefill and decode run the
/// same per-token arithmetic.
#[derive(Clone, Debug)]
pub struct Mla {
    /// Query projection(s).
    pub q: MlaQuery,
    /// `kv_a_proj_with_mqa`: `[rank + rope, hidden]`.
    pub kv_a: Linear,
    /// RMSNorm of the latent, length `rank`.
    pub kv_norm: Vec<f32>,
    /// `kv_b_proj`: `[n_heads * (nope + v_dim), rank]`, per head `nope` key rows then `v_dim` value rows.
    pub kv_b: Linear,
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

/// The token mixer of a layer.
#[derive(Clone, Debug)]
pub enum Mixer {
    /// Grouped-query attention over a per-head KV cache.
    Gqa(Box<Attention>),
    /// Multi-head latent attention over a compressed cache.
    Mla(Box<Mla>),
}

/// A SwiGLU MLP: `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `[intermediate, hidden]`.
    pub gate_proj: Linear,
    /// `[intermediate, hidden]`.
    pub up_proj: Linear,
    /// `[hidden, intermediate]`.
    pub down_proj: Linear,
}

/// How a token's experts and their weights are chosen from the router logits.
#[derive(Clone, Debug)]
pub enum Routing {
    /// Softmax over all experts, top-k (Mixtral, OLMoE, Qwen-MoE).
    Softmax {
        /// Renormalise the top-k weights to sum to 1.
        norm_topk_prob: bool,
    },
    /// Sigmoid scores, bias-corrected group-limited selection (DeepSeek-V3, GLM-4.5).
    GroupedSigmoid {
        /// `e_score_correction_bias` (selection only).
        bias: Vec<f32>,
        /// `n_group`.
        n_group: usize,
        /// `topk_group`.
        topk_group: usize,
        /// Renormalise the chosen weights.
        norm_topk_prob: bool,
        /// `routed_scaling_factor`.
        scaling: f32,
    },
}

/// Experts every token goes through besides the routed ones.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// The expert (DeepSeek: `n_shared_experts` fused into one wider MLP).
    pub mlp: Mlp,
    /// Qwen2-MoE's `shared_expert_gate` `[1, hidden]`: output scaled by `sigmoid(gate x)`.
    pub gate: Option<Linear>,
}

/// A routed mixture of experts.
#[derive(Clone, Debug)]
pub struct Moe {
    /// Router `[n_experts, hidden]`.
    pub router: Linear,
    /// The routed experts.
    pub experts: Vec<Mlp>,
    /// Experts per token.
    pub top_k: usize,
    /// Routing rule.
    pub routing: Routing,
    /// Shared expert, if the family has one.
    pub shared: Option<SharedExpert>,
}

/// The feed-forward part of a layer.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// Dense SwiGLU.
    Dense(Box<Mlp>),
    /// Mixture of experts.
    Moe(Box<Moe>),
}

/// One pre-norm decoder layer.
#[derive(Clone, Debug)]
pub struct Layer {
    /// RMSNorm before attention.
    pub input_layernorm: Vec<f32>,
    /// Attention.
    pub attn: Mixer,
    /// RMSNorm before the feed-forward block.
    pub post_attention_layernorm: Vec<f32>,
    /// Feed-forward block.
    pub ffn: Ffn,
}

/// What a weight matrix is for (conversion and placement treat them differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearRole {
    /// Token embeddings.
    Embedding,
    /// The output head.
    Head,
    /// A router or a shared-expert gate (kept at source precision: routing must not move).
    Router,
    /// Attention, dense MLP, shared experts, DSA indexer.
    Dense,
    /// A routed expert's matrix.
    Expert {
        /// Decoder layer.
        layer: usize,
        /// Expert index.
        expert: usize,
    },
}

/// A whole decoder-only model.
#[derive(Debug)]
pub struct Transformer {
    /// Shape facts.
    pub info: ModelInfo,
    /// Token embeddings `[vocab, hidden]`.
    pub embed_tokens: Linear,
    /// Layers.
    pub layers: Vec<Layer>,
    /// Final RMSNorm.
    pub norm: Vec<f32>,
    /// Output head `[vocab, hidden]` (may share the embedding's bytes).
    pub lm_head: Linear,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE frequency table, computed once.
    pub rope: RopeTable,
    /// RoPE pair layout.
    pub rope_layout: RopeLayout,
    /// Where routed experts come from when they are streamed (None: read in place).
    pub store: Option<crate::expert_store::ExpertStore>,
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
            index_keys: model
                .layers
                .iter()
                .map(|l| match &l.attn {
                    Mixer::Mla(m) => match m.dsa.as_ref().and_then(|d| d.indexer.as_ref()) {
                        Some(ind) => vec![0.0; capacity * ind.head_dim],
                        None => Vec::new(),
                    },
                    Mixer::Gqa(_) => Vec::new(),
                })
                .collect(),
            capacity,
        }
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

/// Grow-only scratch buffers, reused across forwards.
#[derive(Debug, Default)]
pub struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    scores: Vec<f32>,
    // MLA: low-rank query, absorbed queries and attended latents (head-major), row buffers.
    qa: Vec<f32>,
    qabs: Vec<f32>,
    latent: Vec<f32>,
    rowbuf: Vec<f32>,
    // DSA: indexer queries, keys, head weights; each token's selected positions.
    iq: Vec<f32>,
    ik: Vec<f32>,
    iw: Vec<f32>,
    sel: Vec<u32>,
    sel_len: Vec<usize>,
    sel_order: Vec<u32>,
    // MoE routing and per-expert gather buffers.
    route: RouteScratch,
    shared_gate: Vec<f32>,
    prefetch_logits: Vec<f32>,
    prefetch_x: Vec<f32>,
    router_logits: Vec<f32>,
    probs: Vec<f32>,
    order: Vec<usize>,
    experts: Vec<usize>,
    weights: Vec<f32>,
    counts: Vec<usize>,
    slots: Vec<usize>,
    gathered: Vec<f32>,
    expert_out: Vec<f32>,
    expert_y: Vec<f32>,
    /// Logits of the positions asked for, `[n, vocab]`.
    pub logits: Vec<f32>,
    /// (tokens, context, logit rows) the buffers are already large enough for.
    sized_for: (usize, usize, usize),
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// Whether a forward should produce logits for every position or only the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last position (generation).
    Last,
    /// Every position (teacher-forced evaluation).
    All,
}

/// Serial or parallel per-position RoPE + KV writes (they give the same bits; tested).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionLoop {
    /// Positions in parallel on the rayon pool.
    Parallel,
    /// One position after another.
    Serial,
}

const MAX_ROT_HALF: usize = 512;

/// Most parallel attention tasks per layer: bounds the score scratch to this many rows of
/// the context, whatever the prompt length.
const ATTENTION_TASKS: usize = 64;

/// One position's q, k, v rows and its KV cache rows, as the position loop hands them out.
type PositionItem<'a> = (
    usize,
    (
        ((&'a mut [f32], &'a mut [f32]), &'a [f32]),
        (&'a mut [f32], &'a mut [f32]),
    ),
);

impl Transformer {
    /// Every weight matrix with its role, in a fixed order.
    pub fn linears_mut(&mut self) -> Vec<(LinearRole, &mut Linear)> {
        use LinearRole::*;
        let mut v: Vec<(LinearRole, &mut Linear)> = vec![
            (Embedding, &mut self.embed_tokens),
            (Head, &mut self.lm_head),
        ];
        for (li, l) in self.layers.iter_mut().enumerate() {
            match &mut l.attn {
                Mixer::Gqa(a) => v.extend(
                    [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj]
                        .map(|x| (Dense, x)),
                ),
                Mixer::Mla(m) => {
                    match &mut m.q {
                        MlaQuery::Direct(q) => v.push((Dense, q)),
                        MlaQuery::LowRank { a, b, .. } => v.extend([(Dense, a), (Dense, b)]),
                    }
                    v.extend([&mut m.kv_a, &mut m.kv_b, &mut m.o_proj].map(|x| (Dense, x)));
                    if let Some(ind) = m.dsa.as_mut().and_then(|d| d.indexer.as_mut()) {
                        v.extend(
                            [&mut ind.wq_b, &mut ind.wk, &mut ind.weights_proj].map(|x| (Dense, x)),
                        );
                    }
                }
            }
            match &mut l.ffn {
                Ffn::Dense(m) => v.extend(
                    [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj].map(|x| (Dense, x)),
                ),
                Ffn::Moe(moe) => {
                    v.push((Router, &mut moe.router));
                    if let Some(sh) = &mut moe.shared {
                        let m = &mut sh.mlp;
                        v.extend(
                            [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj]
                                .map(|x| (Dense, x)),
                        );
                        if let Some(g) = &mut sh.gate {
                            v.push((Router, g));
                        }
                    }
                    for (e, m) in moe.experts.iter_mut().enumerate() {
                        let role = Expert {
                            layer: li,
                            expert: e,
                        };
                        v.extend(
                            [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj].map(|x| (role, x)),
                        );
                    }
                }
            }
        }
        v
    }

    /// Copies the dense weights into resident anonymous memory (huge pages where granted).
    /// Same bytes, same results; only the memory they are read from changes. Routed experts
    /// stay where they are: placing them is the expert store's job, not a blanket copy.
    pub fn make_resident(&mut self) -> crate::error::Result<()> {
        self.copy_resident(false)
    }

    /// Copies the routed experts (`experts`) or every other matrix into resident memory.
    pub(crate) fn copy_resident(&mut self, experts: bool) -> crate::error::Result<()> {
        let mut linears: Vec<&mut Linear> = self
            .linears_mut()
            .into_iter()
            .filter(|(r, _)| matches!(r, LinearRole::Expert { .. }) == experts)
            .map(|(_, l)| l)
            .collect();
        let views: Vec<coli_core::TensorView> = linears.iter().map(|l| l.view().clone()).collect();
        let resident = coli_core::make_resident(&views.iter().collect::<Vec<_>>())?;
        for (l, v) in linears.iter_mut().zip(resident) {
            l.set_view(v);
        }
        Ok(())
    }

    /// Sizes the scratch for `n` tokens at a context of `ctx` positions.
    pub fn reserve(&self, s: &mut Scratch, n: usize, ctx: usize, logits_rows: usize) {
        let (sn, sc, sr) = s.sized_for;
        if n <= sn && ctx <= sc && logits_rows <= sr {
            // The decode path: nothing to size, nothing to walk.
            return;
        }
        s.sized_for = (n.max(sn), ctx.max(sc), logits_rows.max(sr));
        let (n, ctx, logits_rows) = s.sized_for;
        let i = &self.info;
        let h = i.hidden_size;
        // Widest q / k / v / attention-output rows over the layers' mixers.
        let (mut qd, mut kd, mut vd, mut ad) = (0, 0, 0, 0);
        for l in &self.layers {
            match &l.attn {
                Mixer::Gqa(_) => {
                    let kvd = i.n_kv_heads * i.head_dim;
                    qd = qd.max(i.n_heads * i.head_dim);
                    kd = kd.max(kvd);
                    vd = vd.max(kvd);
                    ad = ad.max(i.n_heads * i.head_dim);
                }
                Mixer::Mla(m) => {
                    let kw = m.rank + m.rope;
                    qd = qd.max(m.n_heads * (m.nope + m.rope));
                    kd = kd.max(kw);
                    ad = ad.max(m.n_heads * m.v_dim);
                    if let MlaQuery::LowRank { a, .. } = &m.q {
                        grow(&mut s.qa, n * a.rows);
                    }
                    grow(&mut s.qabs, m.n_heads * n * kw);
                    if let Some(d) = &m.dsa {
                        if s.sel.len() < n * d.top_k {
                            s.sel.resize(n * d.top_k, 0);
                        }
                        if s.sel_len.len() < n {
                            s.sel_len.resize(n, 0);
                        }
                        if s.sel_order.len() < ATTENTION_TASKS * ctx {
                            s.sel_order.resize(ATTENTION_TASKS * ctx, 0);
                        }
                        if let Some(ind) = &d.indexer {
                            grow(&mut s.iq, n * ind.n_heads * ind.head_dim);
                            grow(&mut s.ik, n * ind.head_dim);
                            grow(&mut s.iw, n * ind.n_heads);
                        }
                    }
                    grow(&mut s.latent, m.n_heads * n * m.rank);
                    grow(&mut s.rowbuf, m.n_heads * m.rank);
                }
            }
        }
        grow(&mut s.x, n * h);
        grow(&mut s.xn, n * h);
        grow(&mut s.q, n * qd);
        grow(&mut s.k, n * kd);
        grow(&mut s.v, n * vd);
        grow(&mut s.attn, n * ad);
        grow(&mut s.proj, n * h);
        grow(&mut s.scores, ATTENTION_TASKS * ctx);
        grow(&mut s.logits, logits_rows * i.vocab_size);
        let mut inter = 0;
        for l in &self.layers {
            match &l.ffn {
                Ffn::Dense(m) => inter = inter.max(m.gate_proj.rows),
                Ffn::Moe(moe) => {
                    let e = moe.experts.len();
                    let k = moe.top_k;
                    let ei = moe
                        .experts
                        .iter()
                        .map(|m| m.gate_proj.rows)
                        .max()
                        .unwrap_or(0);
                    if let Some(sh) = &moe.shared {
                        inter = inter.max(sh.mlp.gate_proj.rows);
                        grow(&mut s.shared_gate, n);
                    }
                    grow(&mut s.router_logits, n * e);
                    grow(&mut s.probs, e);
                    grow(&mut s.weights, n * k);
                    grow(&mut s.gathered, n * k * h);
                    grow(&mut s.expert_out, n * k * h);
                    grow(&mut s.expert_y, n * k * h);
                    grow(&mut s.gate, n * k * ei);
                    grow(&mut s.up, n * k * ei);
                    if s.order.len() < e {
                        s.order.reserve(e);
                    }
                    if s.experts.len() < n * k {
                        s.experts.resize(n * k, 0);
                    }
                    if s.slots.len() < n * k {
                        s.slots.resize(n * k, 0);
                    }
                    if s.counts.len() < e + 1 {
                        s.counts.resize(e + 1, 0);
                    }
                }
            }
        }
        grow(&mut s.gate, n * inter);
        grow(&mut s.up, n * inter);
    }

    /// Runs `tokens` at positions `start..start + n`, appending their keys and values to
    /// `kv`; leaves the logits of the requested positions in `s.logits`.
    /// Token ids must already be checked against the vocabulary.
    pub fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
        logits: LogitsFor,
        positions: PositionLoop,
    ) -> crate::error::Result<()> {
        let info = &self.info;
        let (n, h) = (tokens.len(), info.hidden_size);
        let end = start + n;
        assert!(end <= kv.capacity, "forward past the KV capacity");
        let rows = if logits == LogitsFor::All { n } else { 1 };
        self.reserve(s, n, end, rows);
        for (t, &tok) in tokens.iter().enumerate() {
            self.embed_tokens
                .row_f32(tok as usize, &mut s.x[t * h..(t + 1) * h]);
        }
        for (li, layer) in self.layers.iter().enumerate() {
            norm_rows(
                &s.x[..n * h],
                &layer.input_layernorm,
                self.rms_norm_eps,
                &mut s.xn[..n * h],
            );
            match &layer.attn {
                Mixer::Gqa(a) => self.attention(li, a, n, start, kv, s, positions),
                Mixer::Mla(m) => self.mla(li, m, n, start, kv, s, positions),
            }
            add_into(&mut s.x[..n * h], &s.proj[..n * h]);
            norm_rows(
                &s.x[..n * h],
                &layer.post_attention_layernorm,
                self.rms_norm_eps,
                &mut s.xn[..n * h],
            );
            match &layer.ffn {
                Ffn::Dense(m) => mlp_forward(
                    m,
                    n,
                    &s.xn[..n * h],
                    &mut s.gate,
                    &mut s.up,
                    &mut s.proj[..n * h],
                ),
                Ffn::Moe(moe) => {
                    let store = self.store.as_ref().map(|st| {
                        // The next MoE layer, for prefetch while this one computes.
                        let next = self.layers[li + 1..].iter().enumerate().find_map(|(j, l)| {
                            match &l.ffn {
                                Ffn::Moe(m) => {
                                    Some((li + 1 + j, &**m, &l.post_attention_layernorm[..]))
                                }
                                Ffn::Dense(_) => None,
                            }
                        });
                        StoreCtx {
                            store: st,
                            layer: li,
                            next,
                        }
                    });
                    moe_forward(moe, n, h, s, store, self.rms_norm_eps)?
                }
            }
            add_into(&mut s.x[..n * h], &s.proj[..n * h]);
        }
        let first = n - rows;
        norm_rows(
            &s.x[first * h..n * h],
            &self.norm,
            self.rms_norm_eps,
            &mut s.xn[..rows * h],
        );
        let v = info.vocab_size;
        self.lm_head
            .forward(&s.xn[..rows * h], rows, &mut s.logits[..rows * v]);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        li: usize,
        a: &Attention,
        n: usize,
        start: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
        positions: PositionLoop,
    ) {
        let info = &self.info;
        let (h, hd, nh, nkv) = (
            info.hidden_size,
            info.head_dim,
            info.n_heads,
            info.n_kv_heads,
        );
        let (qd, kvd) = (nh * hd, nkv * hd);
        let xn = &s.xn[..n * h];
        Linear::forward_group(
            [&a.q_proj, &a.k_proj, &a.v_proj],
            xn,
            n,
            [&mut s.q[..n * qd], &mut s.k[..n * kvd], &mut s.v[..n * kvd]],
        );
        // Full-projection weights span a whole row; per-head weights repeat every head_dim.
        if let QkNorm::FullProjection { q, k } | QkNorm::PerHead { q, k } = &a.qk_norm {
            norm_rows_inplace(&mut s.q[..n * qd], q, self.rms_norm_eps);
            norm_rows_inplace(&mut s.k[..n * kvd], k, self.rms_norm_eps);
        }
        if let Some(c) = a.clip_qkv {
            for buf in [&mut s.q[..n * qd], &mut s.k[..n * kvd], &mut s.v[..n * kvd]] {
                for x in buf.iter_mut() {
                    *x = x.clamp(-c, c);
                }
            }
        }
        // RoPE on q and k, then the KV writes, per position.
        let kc = &mut kv.keys[li][start * kvd..(start + n) * kvd];
        let vc = &mut kv.values[li][start * kvd..(start + n) * kvd];
        let work = |(t, (((q, k), v), (kc, vc))): PositionItem| {
            rope_position(&self.rope, self.rope_layout, start + t, hd, q, k);
            kc.copy_from_slice(k);
            vc.copy_from_slice(v);
        };
        match positions {
            PositionLoop::Serial => s.q[..n * qd]
                .chunks_mut(qd)
                .zip(s.k[..n * kvd].chunks_mut(kvd))
                .zip(s.v[..n * kvd].chunks(kvd))
                .zip(kc.chunks_mut(kvd).zip(vc.chunks_mut(kvd)))
                .enumerate()
                .for_each(work),
            PositionLoop::Parallel => s.q[..n * qd]
                .par_chunks_mut(qd)
                .zip(s.k[..n * kvd].par_chunks_mut(kvd))
                .zip(s.v[..n * kvd].par_chunks(kvd))
                .zip(kc.par_chunks_mut(kvd).zip(vc.par_chunks_mut(kvd)))
                .enumerate()
                .for_each(work),
        }
        // Causal attention over the (position, head) items, split into at most
        // ATTENTION_TASKS contiguous groups; each group reuses one row of scores.
        let ctx = start + n;
        let scale = 1.0 / (hd as f32).sqrt();
        let (keys, values) = (&kv.keys[li][..], &kv.values[li][..]);
        let group = nh / nkv;
        let q = &s.q[..n * qd];
        let items = n * nh;
        let per_task = items.div_ceil(ATTENTION_TASKS.min(items));
        s.attn[..n * qd]
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
                        stride: kvd,
                        offset: (head / group) * hd,
                        head_dim: hd,
                    };
                    attend(
                        &q[t * qd + head * hd..][..hd],
                        view,
                        start + t + 1,
                        scale,
                        scores,
                        out,
                    );
                }
            });
        a.o_proj.forward(&s.attn[..n * qd], n, &mut s.proj[..n * h]);
    }
}

impl Transformer {
    /// The DSA indexer of layer `li`: projects, normalises and rotates its queries and keys,
    /// appends the keys to its cache, and leaves in `s.sel` each token's `top_k` best earlier
    /// positions (ascending), scored `sum_h w_h * relu(q_h · k * scale)`; ties go to the
    /// earlier position.
    #[allow(clippy::too_many_arguments)]
    fn select_positions(
        &self,
        li: usize,
        m: &Mla,
        ind: &Indexer,
        top_k: usize,
        n: usize,
        start: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
        positions: PositionLoop,
    ) {
        let h = self.info.hidden_size;
        let (ih, id, rp) = (ind.n_heads, ind.head_dim, m.rope);
        let qr = ind.wq_b.cols;
        ind.wq_b
            .forward(&s.qa[..n * qr], n, &mut s.iq[..n * ih * id]);
        Linear::forward_group(
            [&ind.wk, &ind.weights_proj],
            &s.xn[..n * h],
            n,
            [&mut s.ik[..n * id], &mut s.iw[..n * ih]],
        );
        let head_scale = (ih as f64).powf(-0.5) as f32;
        let rope = &self.rope;
        let cache = &mut kv.index_keys[li][start * id..(start + n) * id];
        let work = |(t, (((q, k), w), c)): IndexerPositionItem| {
            coli_kernels::norm::layer_norm_inplace(
                k,
                &ind.k_norm_weight,
                &ind.k_norm_bias,
                INDEXER_NORM_EPS,
            );
            let half = rp / 2;
            let mut cos = [0.0f32; MAX_ROT_HALF];
            let mut sin = [0.0f32; MAX_ROT_HALF];
            rope.cos_sin(start + t, &mut cos[..half], &mut sin[..half]);
            apply_rope(
                RopeLayout::Interleaved,
                &mut k[..rp],
                &cos[..half],
                &sin[..half],
            );
            for head in q.chunks_mut(id) {
                apply_rope(
                    RopeLayout::Interleaved,
                    &mut head[..rp],
                    &cos[..half],
                    &sin[..half],
                );
            }
            for x in w.iter_mut() {
                *x *= head_scale;
            }
            c.copy_from_slice(k);
        };
        match positions {
            PositionLoop::Serial => s.iq[..n * ih * id]
                .chunks_mut(ih * id)
                .zip(s.ik[..n * id].chunks_mut(id))
                .zip(s.iw[..n * ih].chunks_mut(ih))
                .zip(cache.chunks_mut(id))
                .enumerate()
                .for_each(work),
            PositionLoop::Parallel => s.iq[..n * ih * id]
                .par_chunks_mut(ih * id)
                .zip(s.ik[..n * id].par_chunks_mut(id))
                .zip(s.iw[..n * ih].par_chunks_mut(ih))
                .zip(cache.par_chunks_mut(id))
                .enumerate()
                .for_each(work),
        }
        let ctx = start + n;
        let keys = &kv.index_keys[li][..ctx * id];
        let (iq, iw) = (&s.iq[..n * ih * id], &s.iw[..n * ih]);
        let score_scale = (id as f64).powf(-0.5) as f32;
        let per_task = n.div_ceil(ATTENTION_TASKS.min(n));
        s.sel[..n * top_k]
            .par_chunks_mut(per_task * top_k)
            .zip(s.sel_len[..n].par_chunks_mut(per_task))
            .zip(s.scores[..n.div_ceil(per_task) * ctx].par_chunks_mut(ctx))
            .zip(s.sel_order[..n.div_ceil(per_task) * ctx].par_chunks_mut(ctx))
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
                    let k = top_k.min(visible);
                    let order = &mut order[..visible];
                    for (p, o) in order.iter_mut().enumerate() {
                        *o = p as u32;
                    }
                    let scores = &scores[..visible];
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
                    *len = k;
                }
            });
    }
}

/// One position's indexer query, key, head weights and cache row.
type IndexerPositionItem<'a> = (
    usize,
    (
        ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]),
        &'a mut [f32],
    ),
);

/// One position's query row, latent row and cache row, as the MLA position loop hands them out.
type MlaPositionItem<'a> = (usize, ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]));

impl Transformer {
    /// Multi-head latent attention for `n` tokens (see [`Mla`]).
    #[allow(clippy::too_many_arguments)]
    fn mla(
        &self,
        li: usize,
        m: &Mla,
        n: usize,
        start: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
        positions: PositionLoop,
    ) {
        let h = self.info.hidden_size;
        let (nh, nope, rp, vd, r) = (m.n_heads, m.nope, m.rope, m.v_dim, m.rank);
        let (qk, kw) = (nope + rp, r + rp);
        let xn = &s.xn[..n * h];
        match &m.q {
            MlaQuery::Direct(qp) => Linear::forward_group(
                [qp, &m.kv_a],
                xn,
                n,
                [&mut s.q[..n * nh * qk], &mut s.k[..n * kw]],
            ),
            MlaQuery::LowRank { a, norm, b } => {
                let qr = a.rows;
                Linear::forward_group(
                    [a, &m.kv_a],
                    xn,
                    n,
                    [&mut s.qa[..n * qr], &mut s.k[..n * kw]],
                );
                norm_rows_inplace(&mut s.qa[..n * qr], norm, m.norm_eps);
                b.forward(&s.qa[..n * qr], n, &mut s.q[..n * nh * qk]);
            }
        }
        // Per position: normalise the latent, rotate the rope parts, write the cache row.
        let (rope, layout) = (&self.rope, self.rope_layout);
        let cache = &mut kv.keys[li][start * kw..(start + n) * kw];
        let work = |(t, ((q, k), c)): MlaPositionItem| {
            coli_kernels::norm::rms_norm_inplace(&mut k[..r], &m.kv_norm, m.norm_eps);
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
        match positions {
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
        if let Some(Dsa {
            indexer: Some(ind),
            top_k,
        }) = &m.dsa
        {
            self.select_positions(li, m, ind, *top_k, n, start, kv, s, positions);
        }
        // Absorbed queries, head-major `[head][t] = (q_nope · W_uk(head), q_rope)`: the nope
        // rows of W_uk are accumulated in increasing order, per token.
        let q = &s.q[..n * nh * qk];
        s.qabs[..nh * n * kw]
            .par_chunks_mut(n * kw)
            .zip(s.rowbuf[..nh * r].par_chunks_mut(r))
            .enumerate()
            .for_each(|(head, (qa, row))| {
                qa.fill(0.0);
                for i in 0..nope {
                    m.kv_b.row_f32(head * (nope + vd) + i, row);
                    for t in 0..n {
                        let qi = q[t * nh * qk + head * qk + i];
                        for (d, &w) in qa[t * kw..t * kw + r].iter_mut().zip(row.iter()) {
                            *d += qi * w;
                        }
                    }
                }
                for t in 0..n {
                    qa[t * kw + r..(t + 1) * kw]
                        .copy_from_slice(&q[t * nh * qk + head * qk + nope..][..rp]);
                }
            });
        // Attention over the latent cache: keys are whole rows, values their first `r` values.
        let ctx = start + n;
        let cache = &kv.keys[li][..ctx * kw];
        let qabs = &s.qabs[..nh * n * kw];
        // Sparse layers attend to each token's selected positions (this layer's indexer or the
        // previous layer's selection); dense layers to every earlier position.
        let selection = m
            .dsa
            .as_ref()
            .map(|d| (d.top_k, &s.sel[..], &s.sel_len[..n]));
        let items = nh * n;
        let per_task = items.div_ceil(ATTENTION_TASKS.min(items));
        s.latent[..items * r]
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
                            attend_selected(q, view, positions, m.scale, scores, out)
                        }
                        None => attend(q, view, start + t + 1, m.scale, scores, out),
                    }
                }
            });
        // Expand each head's attended latent through W_uv into token-major `[t][head][v]`.
        let latent = &s.latent[..items * r];
        s.attn[..n * nh * vd]
            .par_chunks_mut(vd)
            .enumerate()
            .for_each(|(i, out)| {
                let (t, head) = (i / nh, i % nh);
                let c = &latent[(head * n + t) * r..][..r];
                for (j, o) in out.iter_mut().enumerate() {
                    *o = m.kv_b.dot_row(head * (nope + vd) + nope + j, c);
                }
            });
        m.o_proj
            .forward(&s.attn[..n * nh * vd], n, &mut s.proj[..n * h]);
    }
}

/// RoPE for one position: every query head and every key head.
fn rope_position(
    rope: &RopeTable,
    layout: RopeLayout,
    pos: usize,
    hd: usize,
    q: &mut [f32],
    k: &mut [f32],
) {
    let half = rope.rot_dim() / 2;
    assert!(half <= MAX_ROT_HALF);
    let mut cos = [0.0f32; MAX_ROT_HALF];
    let mut sin = [0.0f32; MAX_ROT_HALF];
    rope.cos_sin(pos, &mut cos[..half], &mut sin[..half]);
    for head in q.chunks_mut(hd).chain(k.chunks_mut(hd)) {
        apply_rope(layout, head, &cos[..half], &sin[..half]);
    }
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        rms_norm(xr, w, eps, or);
    }
}

fn norm_rows_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    for r in x.chunks_exact_mut(w.len()) {
        coli_kernels::norm::rms_norm_inplace(r, w, eps);
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `out = down(silu(gate xs) * up xs)` for `n` rows.
fn mlp_forward(m: &Mlp, n: usize, xs: &[f32], gate: &mut [f32], up: &mut [f32], out: &mut [f32]) {
    let inter = m.gate_proj.rows;
    let (g, u) = (&mut gate[..n * inter], &mut up[..n * inter]);
    Linear::forward_group([&m.gate_proj, &m.up_proj], xs, n, [&mut *g, &mut *u]);
    swiglu_inplace(g, u);
    m.down_proj.forward(g, n, out);
}

/// [`mlp_forward`] on bias-free kernel matrices (a streamed expert): the same kernels, so
/// the same bits as reading the expert in place.
fn mlp_forward_mats(
    [gate_m, up_m, down_m]: [MatRef; 3],
    n: usize,
    xs: &[f32],
    gate: &mut [f32],
    up: &mut [f32],
    out: &mut [f32],
) {
    let inter = gate_m.rows;
    let (g, u) = (&mut gate[..n * inter], &mut up[..n * inter]);
    coli_kernels::matmul::matmul_many([&gate_m, &up_m], xs, n, [&mut *g, &mut *u]);
    swiglu_inplace(g, u);
    coli_kernels::matmul::matmul(&down_m, g, n, out);
}

/// The expert store a MoE layer reads from, with the next MoE layer to prefetch for.
struct StoreCtx<'a> {
    store: &'a crate::expert_store::ExpertStore,
    layer: usize,
    /// The next MoE layer: its index, block and the norm in front of it.
    next: Option<(usize, &'a Moe, &'a [f32])>,
}

/// Routes each token, runs every selected expert once over all its tokens (batch union),
/// then sums each token's expert outputs in routing-rank order.
fn moe_forward(
    moe: &Moe,
    n: usize,
    h: usize,
    s: &mut Scratch,
    store: Option<StoreCtx>,
    eps: f32,
) -> crate::error::Result<()> {
    let e = moe.experts.len();
    let k = moe.top_k;
    moe.router
        .forward(&s.xn[..n * h], n, &mut s.router_logits[..n * e]);
    for t in 0..n {
        let logits = &s.router_logits[t * e..(t + 1) * e];
        let (experts, weights) = (
            &mut s.experts[t * k..(t + 1) * k],
            &mut s.weights[t * k..(t + 1) * k],
        );
        match &moe.routing {
            Routing::Softmax { norm_topk_prob } => softmax_top_k(
                logits,
                k,
                *norm_topk_prob,
                &mut s.probs,
                &mut s.order,
                experts,
                weights,
            ),
            Routing::GroupedSigmoid {
                bias,
                n_group,
                topk_group,
                norm_topk_prob,
                scaling,
            } => {
                let p = GroupedSigmoid {
                    bias,
                    n_group: *n_group,
                    topk_group: *topk_group,
                    renormalize: *norm_topk_prob,
                    scaling: *scaling,
                };
                sigmoid_group_top_k(logits, k, &p, &mut s.route, experts, weights)
            }
        }
    }
    // Counting sort of the (token, rank) slots by expert.
    let counts = &mut s.counts[..e + 1];
    counts.fill(0);
    for &ex in &s.experts[..n * k] {
        counts[ex + 1] += 1;
    }
    for i in 0..e {
        counts[i + 1] += counts[i];
    }
    for (slot, &ex) in s.experts[..n * k].iter().enumerate() {
        s.slots[counts[ex]] = slot;
        counts[ex] += 1;
    }
    if let Some(ctx) = &store {
        for &ex in &s.experts[..n * k] {
            ctx.store.record(ctx.layer, ex);
        }
        // This layer's experts, in the order the loop below takes them: queue the reads of
        // those not in RAM on the I/O threads now, so they arrive while earlier ones compute.
        s.order.clear();
        let mut begin = 0;
        for ex in 0..e {
            if s.counts[ex] > begin {
                s.order.push(ex);
            }
            begin = s.counts[ex];
        }
        ctx.store.prefetch(ctx.layer, &s.order, false);
        // Decode: guess the next MoE layer's experts from the current residual stream (through
        // that layer's own norm) and start reading them while this layer computes (a hint:
        // never changes a result).
        let guess = ctx
            .next
            .filter(|(_, next, _)| n == 1 && ctx.store.speculation_due(next.top_k));
        if let Some((next_layer, next, norm)) = guess {
            let ne = next.experts.len();
            grow(&mut s.prefetch_logits, ne);
            grow(&mut s.prefetch_x, h);
            rms_norm(&s.x[..h], norm, eps, &mut s.prefetch_x[..h]);
            next.router
                .forward(&s.prefetch_x[..h], 1, &mut s.prefetch_logits[..ne]);
            if let Routing::GroupedSigmoid { bias, .. } = &next.routing {
                for (l, b) in s.prefetch_logits[..ne].iter_mut().zip(bias) {
                    *l = sigmoid(*l) + b;
                }
            }
            let want = next.top_k.min(ctx.store.cap());
            let top =
                coli_kernels::routing::top_k_indices(&s.prefetch_logits[..ne], want, &mut s.order);
            ctx.store.prefetch(next_layer, top, true);
        }
    }
    // counts[ex] is now the end of expert ex's run; its start is the previous expert's end.
    let mut begin = 0;
    for ex in 0..e {
        let end = s.counts[ex];
        if end == begin {
            continue;
        }
        let m = end - begin;
        for (j, &slot) in s.slots[begin..end].iter().enumerate() {
            let t = slot / k;
            s.gathered[j * h..(j + 1) * h].copy_from_slice(&s.xn[t * h..(t + 1) * h]);
        }
        let (xs, y) = (&s.gathered[..m * h], &mut s.expert_y[..m * h]);
        match &store {
            None => mlp_forward(&moe.experts[ex], m, xs, &mut s.gate, &mut s.up, y),
            Some(ctx) => {
                let e = ctx.store.get(ctx.layer, ex)?;
                mlp_forward_mats(
                    [e.mat(0), e.mat(1), e.mat(2)],
                    m,
                    xs,
                    &mut s.gate,
                    &mut s.up,
                    y,
                )
            }
        }
        for (j, &slot) in s.slots[begin..end].iter().enumerate() {
            s.expert_out[slot * h..(slot + 1) * h].copy_from_slice(&s.expert_y[j * h..(j + 1) * h]);
        }
        begin = end;
    }
    let out = &mut s.proj[..n * h];
    out.fill(0.0);
    for t in 0..n {
        let o = &mut out[t * h..(t + 1) * h];
        for r in 0..k {
            let slot = t * k + r;
            let w = s.weights[slot];
            for (oi, &yi) in o.iter_mut().zip(&s.expert_out[slot * h..(slot + 1) * h]) {
                *oi += yi * w;
            }
        }
    }
    // The shared expert, added after the routed sum (optionally gated per token).
    if let Some(sh) = &moe.shared {
        let y = &mut s.expert_y[..n * h];
        mlp_forward(&sh.mlp, n, &s.xn[..n * h], &mut s.gate, &mut s.up, y);
        if let Some(g) = &sh.gate {
            g.forward(&s.xn[..n * h], n, &mut s.shared_gate[..n]);
        }
        for t in 0..n {
            let w = sh.gate.as_ref().map(|_| sigmoid(s.shared_gate[t]));
            let o = &mut s.proj[t * h..(t + 1) * h];
            for (oi, &yi) in o.iter_mut().zip(&y[t * h..(t + 1) * h]) {
                *oi += match w {
                    Some(w) => w * yi,
                    None => yi,
                };
            }
        }
    }
    Ok(())
}

/// Loaders of the shared blocks, given the names a family's checkpoint uses.
pub mod load {
    use coli_core::ModelDir;

    use super::*;
    use crate::error::Result;

    /// Checks head counts against each other and returns `head_dim`
    /// (explicit, or `hidden / n_heads`); errors name the config key.
    pub fn head_dim(
        dir: &ModelDir,
        hidden: usize,
        n_heads: usize,
        n_kv_heads: usize,
        explicit: Option<usize>,
    ) -> Result<usize> {
        let c = &dir.config;
        if n_heads == 0 {
            return Err(c.error("num_attention_heads", "must be positive").into());
        }
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(c
                .error(
                    "num_key_value_heads",
                    format!(
                        "{n_kv_heads} must be positive and divide num_attention_heads = {n_heads}"
                    ),
                )
                .into());
        }
        let hd = explicit.unwrap_or(hidden / n_heads);
        if hd == 0 || !hd.is_multiple_of(2) {
            return Err(c
                .error("head_dim", format!("{hd} must be even and positive"))
                .into());
        }
        Ok(hd)
    }

    /// `{prefix}.{q,k,v,o}_proj`, with biases on q/k/v if `qkv_bias` and on o if `o_bias`.
    pub fn attention(
        dir: &ModelDir,
        prefix: &str,
        info: &ModelInfo,
        qkv_bias: bool,
        o_bias: bool,
    ) -> Result<Attention> {
        let (h, qd, kvd) = (
            info.hidden_size,
            info.n_heads * info.head_dim,
            info.n_kv_heads * info.head_dim,
        );
        Ok(Attention {
            q_proj: Linear::load_prefixed(dir, &format!("{prefix}.q_proj"), qd, h, qkv_bias)?,
            k_proj: Linear::load_prefixed(dir, &format!("{prefix}.k_proj"), kvd, h, qkv_bias)?,
            v_proj: Linear::load_prefixed(dir, &format!("{prefix}.v_proj"), kvd, h, qkv_bias)?,
            o_proj: Linear::load_prefixed(dir, &format!("{prefix}.o_proj"), h, qd, o_bias)?,
            qk_norm: QkNorm::None,
            clip_qkv: None,
        })
    }

    /// A SwiGLU MLP from the three projection names.
    pub fn mlp(
        dir: &ModelDir,
        [gate, up, down]: [&str; 3],
        hidden: usize,
        inter: usize,
        bias: bool,
    ) -> Result<Mlp> {
        Ok(Mlp {
            gate_proj: Linear::load_prefixed(dir, gate, inter, hidden, bias)?,
            up_proj: Linear::load_prefixed(dir, up, inter, hidden, bias)?,
            down_proj: Linear::load_prefixed(dir, down, hidden, inter, bias)?,
        })
    }

    /// A pre-norm layer `{p}` around its mixer and feed-forward block (loads the two norms).
    pub fn layer(dir: &ModelDir, p: &str, hidden: usize, attn: Mixer, ffn: Ffn) -> Result<Layer> {
        Ok(Layer {
            input_layernorm: crate::weights::load_vector(
                dir,
                &format!("{p}.input_layernorm.weight"),
                hidden,
            )?,
            attn,
            post_attention_layernorm: crate::weights::load_vector(
                dir,
                &format!("{p}.post_attention_layernorm.weight"),
                hidden,
            )?,
            ffn,
        })
    }

    /// `{prefix}.{gate,up,down}_proj` without biases.
    pub fn swiglu(dir: &ModelDir, prefix: &str, hidden: usize, inter: usize) -> Result<Mlp> {
        mlp(
            dir,
            [
                &format!("{prefix}.gate_proj"),
                &format!("{prefix}.up_proj"),
                &format!("{prefix}.down_proj"),
            ],
            hidden,
            inter,
            false,
        )
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

    /// MLA's softmax scale: `qk_head_dim^-0.5`, times `mscale(factor, mscale_all_dim)²`
    /// under YaRN (as `transformers`' DeepSeek-V3 and GLM-5 attention).
    pub fn mla_softmax_scale(qk_head_dim: usize, scaling: &coli_core::RopeScaling) -> f32 {
        let mut s = (qk_head_dim as f64).powf(-0.5);
        if let coli_core::RopeScaling::Yarn(y) = scaling {
            if let Some(m) = y.mscale_all_dim.filter(|m| *m != 0.0) {
                let ms = coli_core::yarn_get_mscale(y.factor, m);
                s = s * ms * ms;
            }
        }
        s as f32
    }

    /// An MLA block `{prefix}.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}, kv_a_proj_with_mqa,
    /// kv_a_layernorm, kv_b_proj, o_proj`.
    pub fn mla(
        dir: &ModelDir,
        prefix: &str,
        d: &MlaDims,
        hidden: usize,
        bias: bool,
        norm_eps: f32,
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
                norm: crate::weights::load_vector(
                    dir,
                    &format!("{prefix}.q_a_layernorm.weight"),
                    qr,
                )?,
                b: w("q_b_proj", nh * qk, qr, false)?,
            },
        };
        Ok(Mla {
            q,
            kv_a: w("kv_a_proj_with_mqa", d.kv_lora_rank + d.rope, hidden, bias)?,
            kv_norm: crate::weights::load_vector(
                dir,
                &format!("{prefix}.kv_a_layernorm.weight"),
                d.kv_lora_rank,
            )?,
            kv_b: w("kv_b_proj", nh * (d.nope + d.v_dim), d.kv_lora_rank, false)?,
            o_proj: w("o_proj", hidden, nh * d.v_dim, bias)?,
            n_heads: nh,
            nope: d.nope,
            rope: d.rope,
            v_dim: d.v_dim,
            rank: d.kv_lora_rank,
            norm_eps,
            scale,
            dsa: None,
        })
    }

    /// Routing and expert keys of a DeepSeek-style MoE block (DeepSeek-V3, Kimi-K2, GLM),
    /// spelled as in their config.json (flattened into the family configs).
    #[derive(Clone, Copy, Debug, serde::Deserialize)]
    pub struct SigmoidMoeConfig {
        /// Routed experts per MoE layer.
        pub n_routed_experts: usize,
        /// Experts per token.
        pub num_experts_per_tok: usize,
        /// Width of each routed expert.
        pub moe_intermediate_size: usize,
        /// Shared experts (fused into one MLP of `n * moe_intermediate_size`).
        #[serde(default = "one")]
        pub n_shared_experts: usize,
        /// Expert groups.
        #[serde(default = "one")]
        pub n_group: usize,
        /// Groups a token may route to.
        #[serde(default = "one")]
        pub topk_group: usize,
        /// Renormalise the chosen weights.
        #[serde(default = "yes")]
        pub norm_topk_prob: bool,
        /// Multiplies the routing weights.
        #[serde(default = "one_f")]
        pub routed_scaling_factor: f64,
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

    fn one() -> usize {
        1
    }
    fn one_f() -> f64 {
        1.0
    }
    fn yes() -> bool {
        true
    }

    /// `{prefix}.gate` (weight + `e_score_correction_bias`), `{prefix}.experts.{e}`,
    /// `{prefix}.shared_experts`.
    pub fn sigmoid_moe(
        dir: &ModelDir,
        prefix: &str,
        hidden: usize,
        m: &SigmoidMoeConfig,
    ) -> Result<Moe> {
        let gate = format!("{prefix}.gate");
        let routing = grouped_sigmoid(
            dir,
            &gate,
            m.n_routed_experts,
            m.num_experts_per_tok,
            m.n_group,
            m.topk_group,
            m.norm_topk_prob,
            m.routed_scaling_factor,
        )?;
        let shared = if m.n_shared_experts > 0 {
            Some(SharedExpert {
                mlp: swiglu(
                    dir,
                    &format!("{prefix}.shared_experts"),
                    hidden,
                    m.n_shared_experts * m.moe_intermediate_size,
                )?,
                gate: None,
            })
        } else {
            None
        };
        Ok(Moe {
            router: Linear::load(dir, &format!("{gate}.weight"), m.n_routed_experts, hidden)?,
            experts: experts(
                dir,
                &format!("{prefix}.experts"),
                m.n_routed_experts,
                ["gate_proj", "up_proj", "down_proj"],
                hidden,
                m.moe_intermediate_size,
            )?,
            top_k: m.num_experts_per_tok,
            routing,
            shared,
        })
    }

    /// The feed-forward block `{prefix}` of a DeepSeek-style layer: a sigmoid-routed MoE when
    /// `sparse`, else a dense SwiGLU of `intermediate_size`.
    pub fn dense_or_sigmoid_moe(
        dir: &ModelDir,
        prefix: &str,
        hidden: usize,
        sparse: bool,
        intermediate_size: usize,
        moe: &SigmoidMoeConfig,
    ) -> Result<Ffn> {
        Ok(if sparse {
            Ffn::Moe(Box::new(sigmoid_moe(dir, prefix, hidden, moe)?))
        } else {
            Ffn::Dense(Box::new(swiglu(dir, prefix, hidden, intermediate_size)?))
        })
    }

    /// `count` experts named `{prefix}.{e}.{gate}` / `.{up}` / `.{down}`.
    pub fn experts(
        dir: &ModelDir,
        prefix: &str,
        count: usize,
        [gate, up, down]: [&str; 3],
        hidden: usize,
        inter: usize,
    ) -> Result<Vec<Mlp>> {
        (0..count)
            .map(|e| {
                mlp(
                    dir,
                    [
                        &format!("{prefix}.{e}.{gate}"),
                        &format!("{prefix}.{e}.{up}"),
                        &format!("{prefix}.{e}.{down}"),
                    ],
                    hidden,
                    inter,
                    false,
                )
            })
            .collect()
    }

    /// Checks the expert count (`experts_key`) and `num_experts_per_tok` against each other.
    pub fn check_top_k(
        dir: &ModelDir,
        experts_key: &str,
        n_experts: usize,
        top_k: usize,
    ) -> Result<()> {
        let c = &dir.config;
        if n_experts == 0 {
            return Err(c.error(experts_key, "must be positive").into());
        }
        if top_k == 0 || top_k > n_experts {
            return Err(c
                .error(
                    "num_experts_per_tok",
                    format!("{top_k} must be between 1 and {experts_key} = {n_experts}"),
                )
                .into());
        }
        Ok(())
    }

    /// DeepSeek-style routing settings, validated; the bias is `{gate}.e_score_correction_bias`.
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_sigmoid(
        dir: &ModelDir,
        gate: &str,
        n_experts: usize,
        top_k: usize,
        n_group: usize,
        topk_group: usize,
        norm_topk_prob: bool,
        scaling: f64,
    ) -> Result<Routing> {
        let c = &dir.config;
        if n_group == 0 || !n_experts.is_multiple_of(n_group) {
            return Err(c
                .error(
                    "n_group",
                    format!("{n_group} must be positive and divide n_routed_experts = {n_experts}"),
                )
                .into());
        }
        if topk_group == 0 || topk_group > n_group {
            return Err(c
                .error(
                    "topk_group",
                    format!("{topk_group} must be between 1 and n_group = {n_group}"),
                )
                .into());
        }
        check_top_k(dir, "n_routed_experts", n_experts, top_k)?;
        if top_k > topk_group * (n_experts / n_group) {
            return Err(c
                .error(
                    "num_experts_per_tok",
                    format!(
                        "{top_k} exceeds the {} experts in topk_group = {topk_group} groups",
                        topk_group * (n_experts / n_group)
                    ),
                )
                .into());
        }
        if !(scaling.is_finite() && scaling > 0.0) {
            return Err(c
                .error(
                    "routed_scaling_factor",
                    format!("must be positive, found {scaling}"),
                )
                .into());
        }
        Ok(Routing::GroupedSigmoid {
            bias: crate::weights::load_vector(
                dir,
                &format!("{gate}.e_score_correction_bias"),
                n_experts,
            )?,
            n_group,
            topk_group,
            norm_topk_prob,
            scaling: scaling as f32,
        })
    }

    /// The embedding and the LM head (tied: the head reads the embedding's bytes).
    pub fn embeddings(
        dir: &ModelDir,
        embed: &str,
        head: &str,
        info: &ModelInfo,
        tied: bool,
    ) -> Result<(Linear, Linear)> {
        let e = Linear::load(dir, embed, info.vocab_size, info.hidden_size)?;
        let head = if tied && !dir.has(head) {
            e.clone()
        } else {
            Linear::load(dir, head, info.vocab_size, info.hidden_size)?
        };
        Ok((e, head))
    }
}
