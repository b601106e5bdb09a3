//! A routed mixture of experts: route each token, run every selected expert once over
//! all its tokens (batch union), sum each token's expert outputs in routing-rank order,
//! then add the shared expert. Experts are read in place, or through the expert store
//! when the model is placed (same kernels, same bits).

use coli_kernels::norm::rms_norm;
use coli_kernels::routing::{sigmoid, sigmoid_group_top_k, softmax_top_k, GroupedSigmoid};

use super::mlp::{forward_mats, glu_forward_mats, Expert, GluInput, Mlp};
use super::scratch::{grow, MlpScratch, MoeScratch};
use super::{Ffn, Scratch, Step};
use crate::error::Result;
use crate::experts::ExpertStore;
use crate::weights::Linear;

/// Tokens up to which a step runs its experts side by side ([`Moe::run_experts`]):
/// decode and short drafts, whose experts each see a row or a few.
const PARALLEL_EXPERT_TOKENS: usize = 8;

/// Where the parallel experts write their outputs (disjoint row ranges).
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: the pointer is only offset into ranges that one task owns (see its use).
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The element `i` places past the start (a method, so closures capture the whole
    /// wrapper, not its raw pointer).
    fn at(self, i: usize) -> *mut f32 {
        // SAFETY: callers pass offsets inside the buffer.
        unsafe { self.0.add(i) }
    }
}

/// How a token's experts and their weights are chosen from the router logits.
#[derive(Clone, Debug)]
pub enum Routing {
    /// Softmax over all experts, top-k (Mixtral, OLMoE, Qwen-MoE).
    Softmax {
        /// Renormalise the top-k weights to sum to 1.
        norm_topk_prob: bool,
    },
    /// Top-k of the logits, then a softmax over the chosen ones (gpt-oss).
    TopKSoftmax,
    /// DeepSeek-V4: scores from the logits ([`ScoreFn`]); the experts by the top-k of the
    /// scores plus a selection bias, or looked up by token id (`hash_moe` layers); the
    /// weights the chosen scores over their sum (plus 1e-20), times `scaling`.
    Scored {
        /// `scoring_func`.
        score: ScoreFn,
        /// How the experts are chosen.
        choice: Choice,
        /// `routed_scaling_factor`.
        scaling: f32,
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

/// DeepSeek-V4's `scoring_func`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreFn {
    /// `sqrt(softplus(x))`.
    SqrtSoftplus,
    /// Softmax over all experts.
    Softmax,
    /// `sigmoid(x)`.
    Sigmoid,
}

impl ScoreFn {
    /// The scores of one token's logits.
    pub fn apply(self, logits: &[f32], out: &mut [f32]) {
        match self {
            ScoreFn::SqrtSoftplus => {
                for (o, &l) in out.iter_mut().zip(logits) {
                    *o = coli_kernels::deltanet::softplus(l).sqrt();
                }
            }
            ScoreFn::Sigmoid => {
                for (o, &l) in out.iter_mut().zip(logits) {
                    *o = sigmoid(l);
                }
            }
            ScoreFn::Softmax => {
                out.copy_from_slice(logits);
                coli_kernels::softmax::softmax_inplace(out);
            }
        }
    }
}

/// How DeepSeek-V4 chooses a token's experts.
#[derive(Clone, Debug)]
pub enum Choice {
    /// The top-k of the scores plus `e_score_correction_bias` (`moe` layers).
    Biased(Vec<f32>),
    /// Row `token id` of `tid2eid` `[vocab, top_k]` (`hash_moe` layers).
    Hash(Vec<u32>),
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
    pub experts: Vec<Expert>,
    /// Experts per token.
    pub top_k: usize,
    /// Routing rule.
    pub routing: Routing,
    /// Shared expert, if the family has one.
    pub shared: Option<SharedExpert>,
}

/// The expert store a MoE layer reads from, with the next MoE layer to prefetch for.
struct StoreCtx<'a> {
    store: &'a ExpertStore,
    layer: usize,
    /// The next MoE layer: its index, block and the norm in front of it.
    next: Option<(usize, &'a Moe, &'a [f32])>,
}

impl<'a> StoreCtx<'a> {
    /// The step's store (if the model is placed) and the next MoE layer after this one.
    fn of(st: &Step<'a>) -> Option<StoreCtx<'a>> {
        let model = st.model;
        let store = model.store.as_ref()?;
        let li = st.layer;
        let next = model.layers[li + 1..]
            .iter()
            .enumerate()
            .find_map(|(j, l)| match &l.ffn {
                Ffn::Moe(m) => Some((li + 1 + j, &**m, &l.post_attention_layernorm[..])),
                Ffn::Dense(_) => None,
            });
        Some(StoreCtx {
            store,
            layer: li,
            next,
        })
    }
}

impl Moe {
    /// Sizes routing and gather buffers for `n` tokens of width `h`.
    pub(crate) fn reserve(&self, s: &mut Scratch, n: usize, h: usize) {
        let (e, k) = (self.experts.len(), self.top_k);
        let ei = self.experts.iter().map(Expert::inter).max().unwrap_or(0);
        let gw = self
            .experts
            .iter()
            .map(Expert::gate_width)
            .max()
            .unwrap_or(0);
        if let Some(sh) = &self.shared {
            sh.mlp.reserve(&mut s.ffn, n);
            grow(&mut s.moe.shared_gate, n);
        }
        let m = &mut s.moe;
        grow(&mut m.router_logits, n * e);
        grow(&mut m.probs, e);
        grow(&mut m.prefetch_logits, e);
        grow(&mut m.weights, n * k);
        grow(&mut m.gathered, n * k * h);
        grow(&mut m.expert_out, n * k * h);
        grow(&mut m.expert_y, n * k * h);
        grow(&mut s.ffn.gate, n * k * gw);
        grow(&mut s.ffn.up, n * k * ei);
        if m.order.capacity() < e {
            m.order.reserve(e);
        }
        grow(&mut m.experts, n * k);
        grow(&mut m.slots, n * k);
        grow(&mut m.counts, e + 1);
        if m.jobs.capacity() < n * k {
            m.jobs.reserve(n * k);
        }
        // Experts side by side (`run_experts`): one set of intermediates per selected
        // expert, each for as many rows as tokens.
        let rows = n.min(PARALLEL_EXPERT_TOKENS);
        let tasks = (rows * k).min(e);
        if m.task_ffn.len() < tasks {
            m.task_ffn.resize_with(tasks, MlpScratch::default);
        }
        for ffn in &mut m.task_ffn {
            grow(&mut ffn.gate, rows * gw);
            grow(&mut ffn.up, rows * ei);
        }
    }

    /// The block for the step's tokens (`s.xn` in, `s.proj` out).
    pub(crate) fn forward(&self, st: &Step, s: &mut Scratch) -> Result<()> {
        let (n, h) = (st.n, st.model.info.hidden_size);
        self.route(&s.xn[..n * h], st.tokens, &mut s.moe);
        self.group_by_expert(n, &mut s.moe);
        let store = StoreCtx::of(st);
        if let Some(ctx) = &store {
            self.queue_reads(n, ctx, &mut s.moe);
            if n == 1 {
                let token = st.tokens[0];
                guess_next_layer(ctx, token, &s.x[..h], st.model.rms_norm_eps, &mut s.moe);
            }
        }
        self.run_experts(h, store.as_ref(), s)?;
        self.combine(n, h, s);
        self.add_shared(n, h, s);
        Ok(())
    }

    /// Router logits, then each token's experts and weights (rank order).
    fn route(&self, xn: &[f32], tokens: &[u32], s: &mut MoeScratch) {
        let (n, e, k) = (tokens.len(), self.experts.len(), self.top_k);
        self.router.forward(xn, n, &mut s.router_logits[..n * e]);
        for (t, &tok) in tokens.iter().enumerate() {
            let logits = &s.router_logits[t * e..(t + 1) * e];
            let (experts, weights) = (
                &mut s.experts[t * k..(t + 1) * k],
                &mut s.weights[t * k..(t + 1) * k],
            );
            match &self.routing {
                Routing::Softmax { norm_topk_prob } => softmax_top_k(
                    logits,
                    k,
                    *norm_topk_prob,
                    &mut s.probs,
                    &mut s.order,
                    experts,
                    weights,
                ),
                Routing::TopKSoftmax => {
                    coli_kernels::routing::top_k_softmax(logits, k, &mut s.order, experts, weights)
                }
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
                Routing::Scored {
                    score,
                    choice,
                    scaling,
                } => {
                    let scores = &mut s.probs[..e];
                    score.apply(logits, scores);
                    match choice {
                        Choice::Biased(bias) => {
                            let biased = &mut s.prefetch_logits[..e];
                            for ((b, &sc), &bi) in biased.iter_mut().zip(&*scores).zip(bias) {
                                *b = sc + bi;
                            }
                            let top = coli_kernels::routing::top_k_indices(biased, k, &mut s.order);
                            experts.copy_from_slice(top);
                        }
                        Choice::Hash(table) => {
                            let tok = tok as usize;
                            for (x, &id) in experts.iter_mut().zip(&table[tok * k..(tok + 1) * k]) {
                                *x = id as usize;
                            }
                        }
                    }
                    let mut sum = 0.0f32;
                    for (w, &x) in weights.iter_mut().zip(&*experts) {
                        *w = scores[x];
                        sum += *w;
                    }
                    for w in weights.iter_mut() {
                        *w = *w / (sum + 1e-20) * scaling;
                    }
                }
            }
        }
    }

    /// Counting sort of the (token, rank) slots by expert: afterwards `counts[ex]` is the
    /// end of expert `ex`'s run in `slots`, and its start the previous expert's end.
    fn group_by_expert(&self, n: usize, s: &mut MoeScratch) {
        let (e, k) = (self.experts.len(), self.top_k);
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
    }

    /// Records the routing, then queues the reads of this layer's experts that are not in
    /// RAM, in the order [`Moe::run_experts`] takes them, so they arrive while earlier ones
    /// compute.
    fn queue_reads(&self, n: usize, ctx: &StoreCtx, s: &mut MoeScratch) {
        for &ex in &s.experts[..n * self.top_k] {
            ctx.store.record(ctx.layer, ex);
        }
        s.order.clear();
        let mut begin = 0;
        for ex in 0..self.experts.len() {
            if s.counts[ex] > begin {
                s.order.push(ex);
            }
            begin = s.counts[ex];
        }
        ctx.store.prefetch(ctx.layer, &s.order, false);
    }

    /// Runs each selected expert once over its gathered tokens; outputs go to their slots.
    ///
    /// For a few tokens (decode, short drafts) and more than one thread, the experts run
    /// side by side on the pool, each with its own rows of the gather and output buffers and
    /// its own intermediates, rather than one after the other with every matrix split
    /// across the threads (two pool dispatches per expert). Each expert's output is
    /// computed exactly as alone either way; [`Moe::combine`] sums them in the fixed order.
    fn run_experts(&self, h: usize, store: Option<&StoreCtx>, s: &mut Scratch) -> Result<()> {
        use rayon::prelude::*;
        let m = &mut s.moe;
        // Each selected expert's rows `begin..end` of the rows grouped by expert.
        m.jobs.clear();
        let mut begin = 0;
        for ex in 0..self.experts.len() {
            let end = m.counts[ex];
            if end > begin {
                m.jobs.push((ex, begin, end));
            }
            begin = end;
        }
        let rows_total = begin;
        for (j, &slot) in m.slots[..rows_total].iter().enumerate() {
            let t = slot / self.top_k;
            m.gathered[j * h..(j + 1) * h].copy_from_slice(&s.xn[t * h..(t + 1) * h]);
        }
        let side_by_side =
            rows_total <= PARALLEL_EXPERT_TOKENS * self.top_k && rayon::current_num_threads() > 1;
        if side_by_side {
            let y = SharedOut(m.expert_y.as_mut_ptr());
            let gathered = &m.gathered;
            m.jobs
                .par_iter()
                .zip(m.task_ffn[..m.jobs.len()].par_iter_mut())
                .try_for_each(|(&(ex, begin, end), ffn)| {
                    let rows = end - begin;
                    // SAFETY: the jobs' row ranges `begin..end` are disjoint and lie within
                    // the `n * top_k` rows `expert_y` was sized for (`reserve`); each job
                    // writes its own range only, and nothing else touches the buffer until
                    // they are done.
                    let y = unsafe { std::slice::from_raw_parts_mut(y.at(begin * h), rows * h) };
                    self.run_expert(ex, rows, &gathered[begin * h..end * h], store, ffn, y)
                })?;
        } else {
            for &(ex, begin, end) in &m.jobs {
                let (xs, y) = (
                    &m.gathered[begin * h..end * h],
                    &mut m.expert_y[begin * h..end * h],
                );
                self.run_expert(ex, end - begin, xs, store, &mut s.ffn, y)?;
            }
        }
        for (j, &slot) in m.slots[..rows_total].iter().enumerate() {
            m.expert_out[slot * h..(slot + 1) * h].copy_from_slice(&m.expert_y[j * h..(j + 1) * h]);
        }
        Ok(())
    }

    /// One expert over its `rows` gathered rows `xs`, into `y`.
    fn run_expert(
        &self,
        ex: usize,
        rows: usize,
        xs: &[f32],
        store: Option<&StoreCtx>,
        ffn: &mut MlpScratch,
        y: &mut [f32],
    ) -> Result<()> {
        match store {
            None => self.experts[ex].forward(rows, xs, ffn, y),
            Some(ctx) => {
                let e = ctx.store.get(ctx.layer, ex)?;
                match &self.experts[ex] {
                    Expert::SwiGlu(m) => {
                        forward_mats([e.mat(0), e.mat(1), e.mat(2)], m.limit, rows, xs, ffn, y)
                    }
                    // Biases and constants stay resident; the store has the matrices.
                    Expert::Glu(g) => match &g.input {
                        GluInput::Interleaved(gu) => glu_forward_mats(
                            &[e.mat(0), e.mat(1)],
                            &[gu.bias(), g.down.bias()],
                            g.act,
                            rows,
                            xs,
                            ffn,
                            y,
                        ),
                        GluInput::Split { gate, up } => glu_forward_mats(
                            &[e.mat(0), e.mat(1), e.mat(2)],
                            &[gate.bias(), up.bias(), g.down.bias()],
                            g.act,
                            rows,
                            xs,
                            ffn,
                            y,
                        ),
                    },
                }
            }
        }
        Ok(())
    }

    /// Each token's weighted sum of its experts' outputs, in routing-rank order.
    fn combine(&self, n: usize, h: usize, s: &mut Scratch) {
        let k = self.top_k;
        let out = &mut s.proj[..n * h];
        out.fill(0.0);
        for t in 0..n {
            let o = &mut out[t * h..(t + 1) * h];
            for r in 0..k {
                let slot = t * k + r;
                let w = s.moe.weights[slot];
                for (oi, &yi) in o
                    .iter_mut()
                    .zip(&s.moe.expert_out[slot * h..(slot + 1) * h])
                {
                    *oi += yi * w;
                }
            }
        }
    }

    /// The shared expert, added after the routed sum (optionally gated per token).
    fn add_shared(&self, n: usize, h: usize, s: &mut Scratch) {
        let Some(sh) = &self.shared else { return };
        let y = &mut s.moe.expert_y[..n * h];
        sh.mlp.forward(n, &s.xn[..n * h], &mut s.ffn, y);
        if let Some(g) = &sh.gate {
            g.forward(&s.xn[..n * h], n, &mut s.moe.shared_gate[..n]);
        }
        for t in 0..n {
            let w = sh.gate.as_ref().map(|_| sigmoid(s.moe.shared_gate[t]));
            let o = &mut s.proj[t * h..(t + 1) * h];
            for (oi, &yi) in o.iter_mut().zip(&y[t * h..(t + 1) * h]) {
                *oi += match w {
                    Some(w) => w * yi,
                    None => yi,
                };
            }
        }
    }
}

/// Decode: guesses the next MoE layer's experts from the current residual stream (through
/// that layer's own norm) and starts reading them while this layer computes. A hint: it
/// never changes a result, and it is skipped when the store says speculation does not pay.
/// A next layer routed by token id (DeepSeek-V4's `hash_moe`) needs no guess: its experts
/// are the token's row of the table.
fn guess_next_layer(ctx: &StoreCtx, token: u32, x: &[f32], eps: f32, s: &mut MoeScratch) {
    let Some((next_layer, next, norm)) = ctx.next else {
        return;
    };
    if let Routing::Scored {
        choice: Choice::Hash(table),
        ..
    } = &next.routing
    {
        let (k, t) = (next.top_k, token as usize);
        s.order.clear();
        s.order
            .extend(table[t * k..(t + 1) * k].iter().map(|&e| e as usize));
        let want = k.min(ctx.store.cap());
        ctx.store.prefetch(next_layer, &s.order[..want], false);
        return;
    }
    if !ctx.store.speculation_due(next.top_k) {
        return;
    }
    let (ne, h) = (next.experts.len(), x.len());
    grow(&mut s.prefetch_logits, ne);
    grow(&mut s.prefetch_x, h);
    rms_norm(x, norm, eps, &mut s.prefetch_x[..h]);
    next.router
        .forward(&s.prefetch_x[..h], 1, &mut s.prefetch_logits[..ne]);
    match &next.routing {
        Routing::GroupedSigmoid { bias, .. } => {
            for (l, b) in s.prefetch_logits[..ne].iter_mut().zip(bias) {
                *l = sigmoid(*l) + b;
            }
        }
        Routing::Scored {
            score,
            choice: Choice::Biased(bias),
            ..
        } => {
            grow(&mut s.probs, ne);
            score.apply(&s.prefetch_logits[..ne], &mut s.probs[..ne]);
            for ((l, &p), b) in s.prefetch_logits[..ne]
                .iter_mut()
                .zip(&s.probs[..ne])
                .zip(bias)
            {
                *l = p + b;
            }
        }
        _ => {}
    }
    let want = next.top_k.min(ctx.store.cap());
    let top = coli_kernels::routing::top_k_indices(&s.prefetch_logits[..ne], want, &mut s.order);
    ctx.store.prefetch(next_layer, top, true);
}

mod load;
pub use load::{check_routed_scaling, check_top_k, load_experts, SigmoidMoeConfig};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_scores_follow_their_definitions() {
        let logits = [-30.0f32, -1.5, 0.0, 0.25, 3.0, 25.0];
        let f = |x: f64| -> [f64; 3] {
            let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
            [softplus.sqrt(), 1.0 / (1.0 + (-x).exp()), x]
        };
        let mut out = [0.0f32; 6];
        for (which, score) in [(0, ScoreFn::SqrtSoftplus), (1, ScoreFn::Sigmoid)] {
            score.apply(&logits, &mut out);
            for (&o, &l) in out.iter().zip(&logits) {
                let want = f(l as f64)[which];
                assert!(
                    (o as f64 - want).abs() <= 1e-6 * want.max(1.0),
                    "{score:?} {l}"
                );
            }
        }
        ScoreFn::Softmax.apply(&logits, &mut out);
        let max = 25.0f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        for (&o, &l) in out.iter().zip(&logits) {
            let want = (l as f64 - max).exp() / sum;
            assert!((o as f64 - want).abs() < 1e-7, "softmax {l}");
        }
    }
}
