//! Grow-only buffers reused across forwards. The residual stream and the attention rows
//! are shared by every block; each block kind keeps its own group and says how large it
//! must be (its `reserve`), so nothing here knows a block's shapes.

use super::compressed::CompressedScratch;
use super::hyper::HyperScratch;
use super::{Ffn, Mixer, Transformer, ATTENTION_TASKS};

/// The buffers of one forward, reused across forwards (decode allocates nothing).
#[derive(Debug, Default)]
pub struct Scratch {
    /// Residual stream `[n, hidden]`.
    pub(crate) x: Vec<f32>,
    /// Normalised residual `[n, hidden]`.
    pub(crate) xn: Vec<f32>,
    /// Queries, keys and values of the tokens of the step.
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    /// Attention output before the output projection.
    pub(crate) attn: Vec<f32>,
    /// A block's output `[n, hidden]`, added to the residual.
    pub(crate) proj: Vec<f32>,
    /// Score rows, one per attention task.
    pub(crate) scores: Vec<f32>,
    /// SwiGLU intermediates (dense MLP, shared and routed experts).
    pub(crate) ffn: MlpScratch,
    /// MLA's low-rank and absorbed queries and attended latents.
    pub(crate) mla: MlaScratch,
    /// The DSA indexer's queries, keys, head weights and selections.
    pub(crate) dsa: DsaScratch,
    /// MoE routing and per-expert gather buffers.
    pub(crate) moe: MoeScratch,
    /// Gated DeltaNet's projections, convolution outputs and per-head outputs.
    pub(crate) delta: DeltaScratch,
    /// Gated attention's `[q | gate]` projection and its gates.
    pub(crate) gate: GateScratch,
    /// DeepSeek-V4's attention buffers.
    pub(crate) v4: CompressedScratch,
    /// DeepSeek-V4's hyper-connection weights and buffers.
    pub(crate) hyper: HyperScratch,
    /// Logits of the positions asked for, `[n, vocab]`.
    pub logits: Vec<f32>,
    /// One-row scratches of a batched forward's rows, for the blocks that run per sequence
    /// (MLA: each row's attention, and the DSA selection it hands to later layers).
    pub(crate) rows: Vec<Scratch>,
    /// (tokens, context, logit rows) the buffers are already large enough for.
    sized_for: (usize, usize, usize),
}

/// SwiGLU intermediates.
#[derive(Debug, Default)]
pub(crate) struct MlpScratch {
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
}

/// MLA: low-rank query, absorbed queries and attended latents (head-major), a row buffer.
#[derive(Debug, Default)]
pub(crate) struct MlaScratch {
    pub(crate) qa: Vec<f32>,
    pub(crate) qabs: Vec<f32>,
    pub(crate) latent: Vec<f32>,
    pub(crate) rowbuf: Vec<f32>,
}

/// DSA: indexer queries, keys, head weights; each token's selected positions.
#[derive(Debug, Default)]
pub(crate) struct DsaScratch {
    pub(crate) iq: Vec<f32>,
    pub(crate) ik: Vec<f32>,
    pub(crate) iw: Vec<f32>,
    pub(crate) sel: Vec<u32>,
    pub(crate) sel_len: Vec<usize>,
    pub(crate) sel_order: Vec<u32>,
}

/// Gated DeltaNet: the packed projections, the convolution's inputs and outputs (flat
/// `[q | k | v]` channels), z, b (then beta), a (then the decay), the per-head outputs
/// (head-major) and the gated-norm outputs.
#[derive(Debug, Default)]
pub(crate) struct DeltaScratch {
    pub(crate) packed: Vec<f32>,
    pub(crate) mixed: Vec<f32>,
    pub(crate) conv: Vec<f32>,
    pub(crate) z: Vec<f32>,
    pub(crate) b: Vec<f32>,
    pub(crate) a: Vec<f32>,
    pub(crate) heads: Vec<f32>,
    pub(crate) out: Vec<f32>,
}

/// Gated attention: `q_proj`'s output (`[q | gate]` per head) and the gates.
#[derive(Debug, Default)]
pub(crate) struct GateScratch {
    pub(crate) packed: Vec<f32>,
    pub(crate) gate: Vec<f32>,
}

/// MoE: routing, the next layer's guess, and the per-expert gather buffers.
#[derive(Debug, Default)]
pub(crate) struct MoeScratch {
    pub(crate) route: coli_kernels::routing::RouteScratch,
    pub(crate) shared_gate: Vec<f32>,
    pub(crate) prefetch_logits: Vec<f32>,
    pub(crate) prefetch_x: Vec<f32>,
    pub(crate) router_logits: Vec<f32>,
    pub(crate) probs: Vec<f32>,
    pub(crate) order: Vec<usize>,
    pub(crate) experts: Vec<usize>,
    pub(crate) weights: Vec<f32>,
    pub(crate) counts: Vec<usize>,
    pub(crate) slots: Vec<usize>,
    pub(crate) gathered: Vec<f32>,
    pub(crate) expert_out: Vec<f32>,
    pub(crate) expert_y: Vec<f32>,
    /// The experts of a few tokens run side by side: (expert, first row, end row) of the
    /// grouped rows, and each one's intermediates.
    pub(crate) jobs: Vec<(usize, usize, usize)>,
    pub(crate) task_ffn: Vec<MlpScratch>,
}

/// Grows `v` to at least `n` elements (never shrinks).
pub(crate) fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

impl Transformer {
    /// Sizes the scratch for `n` tokens at a context of `ctx` positions.
    pub fn reserve(&self, s: &mut Scratch, n: usize, ctx: usize, logits_rows: usize) {
        let (sn, sc, sr) = s.sized_for;
        if n <= sn && ctx <= sc && logits_rows <= sr {
            // The decode path: nothing to size, nothing to walk.
            return;
        }
        s.sized_for = (n.max(sn), ctx.max(sc), logits_rows.max(sr));
        let (n, ctx, logits_rows) = s.sized_for;
        let h = self.info.hidden_size;
        for l in &self.layers {
            match &l.attn {
                Mixer::Gqa(a) => a.reserve(&self.info, s, n),
                Mixer::Mla(m) => m.reserve(s, n, ctx),
                Mixer::DeltaNet(d) => d.reserve(s, n),
                Mixer::Compressed(c) => c.reserve(s, n, ctx),
            }
            match &l.ffn {
                Ffn::Dense(m) => m.reserve(&mut s.ffn, n),
                Ffn::Moe(moe) => moe.reserve(s, n, h),
            }
        }
        if let Some(hy) = &self.hyper {
            hy.reserve(&mut s.hyper, n, h);
        }
        grow(&mut s.x, n * h * self.streams());
        grow(&mut s.xn, n * h);
        grow(&mut s.proj, n * h);
        grow(&mut s.scores, ATTENTION_TASKS * ctx);
        grow(&mut s.logits, logits_rows * self.info.vocab_size);
    }
}

impl Scratch {
    /// Bytes the buffers hold.
    pub fn bytes(&self) -> usize {
        let f = [
            &self.x,
            &self.xn,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.proj,
            &self.scores,
            &self.ffn.gate,
            &self.ffn.up,
            &self.mla.qa,
            &self.mla.qabs,
            &self.mla.latent,
            &self.mla.rowbuf,
            &self.dsa.iq,
            &self.dsa.ik,
            &self.dsa.iw,
            &self.moe.shared_gate,
            &self.moe.prefetch_logits,
            &self.moe.prefetch_x,
            &self.moe.router_logits,
            &self.moe.probs,
            &self.moe.weights,
            &self.moe.gathered,
            &self.moe.expert_out,
            &self.moe.expert_y,
            &self.delta.packed,
            &self.delta.mixed,
            &self.delta.conv,
            &self.delta.z,
            &self.delta.b,
            &self.delta.a,
            &self.delta.heads,
            &self.delta.out,
            &self.gate.packed,
            &self.gate.gate,
            &self.logits,
        ]
        .iter()
        .map(|v| v.len() * 4)
        .sum::<usize>()
            + 4 * (self.v4.floats() + self.hyper.floats());
        let u = 4 * (self.dsa.sel.len() + self.dsa.sel_order.len());
        let w = std::mem::size_of::<usize>()
            * (self.dsa.sel_len.len()
                + self.moe.order.capacity()
                + self.moe.experts.len()
                + self.moe.counts.len()
                + self.moe.slots.len());
        f + u + w
    }
}

impl Transformer {
    /// Bytes a [`Scratch`] sized for `n` tokens at `ctx` positions holds (what a session's
    /// buffers cost; the planner budgets them).
    pub fn scratch_bytes(&self, n: usize, ctx: usize, logits_rows: usize) -> usize {
        let mut s = Scratch::default();
        self.reserve(&mut s, n, ctx, logits_rows);
        s.bytes()
    }
}

/// An upper bound of the scratch one decode step at `ctx` positions needs, from config keys
/// alone (the planner's figure): the logits, `ATTENTION_TASKS` rows of scores, the
/// per-token activations and the widest intermediate. A coli-plan test checks it against
/// [`Transformer::scratch_bytes`] on every fixture.
pub fn decode_bytes_bound(config: &coli_core::RawConfig, ctx: usize) -> usize {
    let v = &config.value;
    let num = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0) as usize;
    let (vocab, hidden) = (num("vocab_size"), num("hidden_size"));
    let heads = num("num_attention_heads").max(1);
    let top_k = num("num_experts_per_tok").max(1);
    let experts = num("n_routed_experts")
        .max(num("num_experts"))
        .max(num("num_local_experts"));
    let wide = [
        num("intermediate_size"),
        num("moe_intermediate_size") * top_k,
        num("shared_expert_intermediate_size"),
        heads * (num("kv_lora_rank") + num("qk_rope_head_dim") + num("v_head_dim")),
        heads * num("head_dim").max(hidden / heads) * 2,
        num("index_n_heads") * num("index_head_dim"),
        hidden * 4,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    // Gated DeltaNet: packed projections, convolution in and out, z, per-head outputs.
    let key_dim = num("linear_num_key_heads") * num("linear_key_head_dim");
    let value_heads = num("linear_num_value_heads");
    let value_dim = value_heads * num("linear_value_head_dim");
    let linear = if key_dim + value_dim > 0 {
        6 * key_dim + 8 * value_dim + 4 * value_heads
    } else {
        0
    };
    // DeepSeek-V4: the residual streams (several copies of the residual, normalised and
    // mixed), and the attention scores over the window plus the compressed entries.
    let streams = num("hc_mult");
    let v4 = if streams > 0 {
        3 * streams * hidden
            // Scores over the window and the entries: at most twice the context per task.
            + ATTENTION_TASKS * 2 * ctx
            + num("o_groups") * num("o_lora_rank")
    } else {
        0
    };
    let floats = vocab + ATTENTION_TASKS * ctx + 16 * hidden + 4 * wide + 2 * experts + linear + v4;
    let words = ATTENTION_TASKS * ctx + 4 * experts + 4 * top_k + 8;
    floats * 4 + words * std::mem::size_of::<usize>()
}
