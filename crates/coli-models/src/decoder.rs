//! The decoder-only transformer shared by the families: GQA attention with
//! optional q/k norm, dense SwiGLU MLP or a softmax-routed MoE block, pre-norm
//! residual layers. Family files build it from their own config and tensor names.
//!
//! One forward pass handles any number of tokens: prefill is the same code as
//! decode with more rows, and every per-token result is computed in the same
//! order either way, so a prompt fed in one batch and one token at a time give
//! identical bits.

use coli_kernels::attention::{attend, KvView};
use coli_kernels::norm::{rms_norm, swiglu_inplace};
use coli_kernels::rope::{apply as apply_rope, RopeLayout, RopeTable};
use coli_kernels::routing::softmax_top_k;
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

/// Softmax-routed mixture of experts.
#[derive(Clone, Debug)]
pub struct Moe {
    /// Router `[n_experts, hidden]`.
    pub router: Linear,
    /// The routed experts.
    pub experts: Vec<Mlp>,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the top-k weights to sum to 1.
    pub norm_topk_prob: bool,
}

/// The feed-forward part of a layer.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// Dense SwiGLU.
    Dense(Box<Mlp>),
    /// Mixture of experts.
    Moe(Moe),
}

/// One pre-norm decoder layer.
#[derive(Clone, Debug)]
pub struct Layer {
    /// RMSNorm before attention.
    pub input_layernorm: Vec<f32>,
    /// Attention.
    pub attn: Attention,
    /// RMSNorm before the feed-forward block.
    pub post_attention_layernorm: Vec<f32>,
    /// Feed-forward block.
    pub ffn: Ffn,
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
}

/// Key/value cache: per layer `[capacity, n_kv_heads * head_dim]` for keys and for values.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) keys: Vec<Vec<f32>>,
    pub(crate) values: Vec<Vec<f32>>,
    /// Positions the cache can hold.
    pub capacity: usize,
}

impl KvCache {
    /// Allocates the whole cache up front (decode never allocates).
    pub fn new(info: &ModelInfo, capacity: usize) -> KvCache {
        let per_layer = capacity * info.n_kv_heads * info.head_dim;
        KvCache {
            keys: (0..info.n_layers).map(|_| vec![0.0; per_layer]).collect(),
            values: (0..info.n_layers).map(|_| vec![0.0; per_layer]).collect(),
            capacity,
        }
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
    // MoE routing and per-expert gather buffers.
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
    /// Every dense weight matrix: all but the routed experts.
    fn dense_linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v = vec![&mut self.embed_tokens, &mut self.lm_head];
        for l in &mut self.layers {
            let a = &mut l.attn;
            v.extend([&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj]);
            match &mut l.ffn {
                Ffn::Dense(m) => v.extend([&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj]),
                Ffn::Moe(moe) => v.push(&mut moe.router),
            }
        }
        v
    }

    /// Copies the dense weights into resident anonymous memory (huge pages where granted).
    /// Same bytes, same results; only the memory they are read from changes. Routed experts
    /// stay where they are: placing them is the expert store's job, not a blanket copy.
    pub fn make_resident(&mut self) -> crate::error::Result<()> {
        let mut linears = self.dense_linears_mut();
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
        let (h, qd, kvd) = (
            i.hidden_size,
            i.n_heads * i.head_dim,
            i.n_kv_heads * i.head_dim,
        );
        grow(&mut s.x, n * h);
        grow(&mut s.xn, n * h);
        grow(&mut s.q, n * qd);
        grow(&mut s.k, n * kvd);
        grow(&mut s.v, n * kvd);
        grow(&mut s.attn, n * qd);
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
    ) {
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
            self.attention(li, &layer.attn, n, start, kv, s, positions);
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
                Ffn::Moe(moe) => moe_forward(moe, n, h, s),
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
        if let QkNorm::FullProjection { q, k } = &a.qk_norm {
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

/// Routes each token, runs every selected expert once over all its tokens (batch union),
/// then sums each token's expert outputs in routing-rank order.
fn moe_forward(moe: &Moe, n: usize, h: usize, s: &mut Scratch) {
    let e = moe.experts.len();
    let k = moe.top_k;
    moe.router
        .forward(&s.xn[..n * h], n, &mut s.router_logits[..n * e]);
    for t in 0..n {
        softmax_top_k(
            &s.router_logits[t * e..(t + 1) * e],
            k,
            moe.norm_topk_prob,
            &mut s.probs,
            &mut s.order,
            &mut s.experts[t * k..(t + 1) * k],
            &mut s.weights[t * k..(t + 1) * k],
        );
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
        mlp_forward(
            &moe.experts[ex],
            m,
            &s.gathered[..m * h],
            &mut s.gate,
            &mut s.up,
            &mut s.expert_y[..m * h],
        );
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

    /// `{prefix}.{q,k,v,o}_proj` with optional biases.
    pub fn attention(
        dir: &ModelDir,
        prefix: &str,
        info: &ModelInfo,
        bias: bool,
    ) -> Result<Attention> {
        let (h, qd, kvd) = (
            info.hidden_size,
            info.n_heads * info.head_dim,
            info.n_kv_heads * info.head_dim,
        );
        Ok(Attention {
            q_proj: Linear::load_prefixed(dir, &format!("{prefix}.q_proj"), qd, h, bias)?,
            k_proj: Linear::load_prefixed(dir, &format!("{prefix}.k_proj"), kvd, h, bias)?,
            v_proj: Linear::load_prefixed(dir, &format!("{prefix}.v_proj"), kvd, h, bias)?,
            o_proj: Linear::load_prefixed(dir, &format!("{prefix}.o_proj"), h, qd, bias)?,
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
