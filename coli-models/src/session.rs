//! A conversation with a model: KV cache, batched prefill, step-by-step decode.

use std::time::Instant;

use crate::arch::{KvCache, LogitsFor, PositionLoop, Scratch, Transformer};
use crate::drafts::{first_draft, DraftAt, Drafter, Forced, Lookup};
use crate::error::{ModelError, Result};
use crate::mtp_drafts::MtpDrafts;
use crate::sampling::Sampler;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was produced.
    Stop,
    /// `max_tokens` reached (or the context is full).
    Length,
}

impl FinishReason {
    /// The OpenAI-style spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Timings of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Seconds spent in the prompt's forward pass.
    pub prefill_s: f64,
    /// Seconds from the start until the first generated token was known.
    pub ttft_s: f64,
    /// Tokens produced by single-token decode steps.
    pub decode_tokens: usize,
    /// Seconds spent in those steps.
    pub decode_s: f64,
    /// Of the decoded tokens, those that came from drafts (grammar-forced or prompt
    /// lookup) confirmed in a batched forward: the accepted drafts.
    pub drafted_tokens: usize,
    /// Draft tokens proposed (accepted or not).
    pub draft_proposed: usize,
    /// Batched forwards that verified drafts.
    pub draft_forwards: usize,
}

/// Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the
/// context's last n-gram (n from `max_ngram` down to `min_ngram`) are proposed as the next
/// ones. Costs no model work; pays on text that repeats its prompt (code edits, RAG,
/// JSON keys). Verified like every draft, so the output is what decoding without it gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest n-gram matched.
    pub max_ngram: usize,
    /// Shortest n-gram matched.
    pub min_ngram: usize,
    /// Most tokens proposed at once (the length adapts below it: doubled after a fully
    /// accepted draft, cut to what was accepted plus one after a rejection).
    pub max_draft: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup {
            max_ngram: 3,
            min_ngram: 2,
            max_draft: 8,
        }
    }
}

impl PromptLookup {
    /// Up to `k` tokens that followed the latest earlier match of `context`'s last n-gram.
    pub fn propose(&self, context: &[u32], k: usize) -> Vec<u32> {
        let len = context.len();
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if len <= n {
                continue;
            }
            let tail = &context[len - n..];
            // Latest match first; a match must leave at least one token after it.
            for start in (0..len - n).rev() {
                if &context[start..start + n] == tail {
                    let from = start + n;
                    return context[from..(from + k).min(len)].to_vec();
                }
            }
        }
        Vec::new()
    }
}

/// The result of [`Session::generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// The prompt.
    pub prompt_ids: Vec<u32>,
    /// New tokens, including a final end-of-sequence token if one was produced.
    pub generated_ids: Vec<u32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Timings.
    pub stats: GenStats,
}

/// A model plus its KV cache and reusable buffers.
pub struct Session<'m> {
    model: &'m Transformer,
    kv: KvCache,
    scratch: Scratch,
    pos: usize,
    /// How per-position RoPE and KV writes are scheduled (same bits either way).
    pub positions: PositionLoop,
    /// Prompt-lookup drafting (off by default).
    pub lookup: Option<PromptLookup>,
    /// Drafting by the model's MTP layer (off by default; [`Session::enable_mtp`]). Tried
    /// after grammar-forced tokens and prompt lookup.
    pub mtp: Option<MtpDrafts>,
    /// Recurrent states saved before a draft's verification (linear-attention models).
    saved_states: Vec<f32>,
}

impl<'m> Session<'m> {
    /// A session that can hold `capacity` positions. Everything decode needs is allocated here.
    pub fn new(model: &'m Transformer, capacity: usize) -> Session<'m> {
        Session::with_ring_slack(model, capacity, crate::arch::ring::RING_SLACK)
    }

    /// [`Session::new`] whose ring layers (DeepSeek-V4, sliding windows) keep `slack` positions beyond what they
    /// read ([`KvCache::with_slack`]): less memory, shallower cuts and shorter pieces.
    pub fn with_ring_slack(model: &'m Transformer, capacity: usize, slack: usize) -> Session<'m> {
        let mut scratch = Scratch::default();
        model.reserve(&mut scratch, 1, capacity, 1);
        Session {
            model,
            kv: KvCache::with_slack(model, capacity, slack),
            scratch,
            pos: 0,
            positions: PositionLoop::Parallel,
            lookup: None,
            mtp: None,
            saved_states: Vec::new(),
        }
    }

    /// Turns on drafting by the model's MTP layer; false (and nothing changes) when the
    /// model has none. Call before the first forward: the layer reads every position.
    pub fn enable_mtp(&mut self) -> bool {
        self.mtp = MtpDrafts::new(self.model, self.kv.capacity);
        self.mtp.is_some()
    }

    /// Positions consumed so far.
    pub fn len(&self) -> usize {
        self.pos
    }

    /// Whether nothing has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    /// Positions the session can hold.
    pub fn capacity(&self) -> usize {
        self.kv.capacity
    }

    /// The tokens the MTP layer drafts (up to `max`, and its depth) for the positions after
    /// `next`, the token that follows what was fed; nothing is fed. Empty without MTP
    /// drafting on ([`Session::enable_mtp`]). The draft is what generation would verify.
    pub fn mtp_draft(&mut self, next: u32, max: usize) -> Result<Vec<u32>> {
        self.check_tokens(&[next])?;
        let room = self.kv.capacity.saturating_sub(self.pos + 1);
        match &mut self.mtp {
            Some(d) => d.draft(self.model, self.pos, next, max.min(room)),
            None => Ok(Vec::new()),
        }
    }

    /// Forgets the conversation (keeps the buffers).
    pub fn reset(&mut self) {
        self.pos = 0;
        self.kv.forget_checkpoint_after(0);
    }

    /// Keeps the first `len` positions and forgets the rest (a shared prefix is reused:
    /// the positions after it are recomputed, with the same bits as the first time).
    /// A model with a recurrent state (linear attention) cannot go back to an earlier
    /// position: it keeps everything when `len` covers it, else starts over. Ring layers
    /// keep only their last positions: a cut below [`KvCache::floor`] goes back to
    /// the [`Session::checkpoint`] when that lies at or before `len` (the end of the last
    /// prompt: the next turn of a conversation), else starts over. With MTP
    /// drafting on, a cut into what the MTP layer has read keeps one position less (its
    /// hidden state is needed again). Returns the positions kept.
    pub fn truncate(&mut self, len: usize) -> usize {
        if len < self.pos {
            // The MTP layer may need one position less than asked.
            let target = match &mut self.mtp {
                Some(d) if !self.kv.has_states() => d.rewind(len),
                _ => len,
            };
            self.pos = if self.kv.has_states() {
                0
            } else if target < self.kv.floor() {
                let at = self.kv.back_to_checkpoint(target);
                if let (Some(d), Some(_)) = (&mut self.mtp, at) {
                    d.lose_track();
                }
                at.unwrap_or(0)
            } else {
                target
            };
            self.kv.forget_checkpoint_after(self.pos);
        }
        self.pos
    }

    /// The model.
    pub fn model(&self) -> &'m Transformer {
        self.model
    }

    /// The KV cache.
    pub(crate) fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// The KV cache (for a batched forward over several sessions).
    pub(crate) fn kv_mut(&mut self) -> &mut KvCache {
        &mut self.kv
    }

    /// After a failed forward: a recurrent state may be half advanced through the layers,
    /// so a model with one starts over; rings may have overwritten positions that
    /// continuing at the length needs, and then go back to the checkpoint or start over
    /// (an attention cache's rows past the length are simply rewritten).
    pub(crate) fn forget_if_stateful(&mut self) {
        if self.kv.has_states() {
            self.pos = 0;
        } else if self.kv.floor() > self.pos {
            // Rings the failed forward advanced past what continuing here needs: back to
            // the checkpoint if it lies before, else start over. Layers it did not reach
            // wrote nothing, so the floor is exact.
            self.pos = self.kv.back_to_checkpoint(self.pos).unwrap_or(0);
        }
        self.kv.forget_checkpoint_after(self.pos);
    }

    /// Marks `tokens` as fed after a batched forward wrote their KV, `x` holding their
    /// rows' residual states (before the final norm) for the MTP layer.
    pub(crate) fn advance(&mut self, tokens: &[u32], x: &[f32]) {
        if let Some(d) = &mut self.mtp {
            d.record(self.model, self.pos, tokens, x);
        }
        self.pos += tokens.len();
        debug_assert!(self.pos <= self.kv.capacity);
    }

    /// Marks `n` positions as fed by a restored KV file (the MTP layer, which has not read
    /// them, drafts nothing until the session starts over).
    pub(crate) fn restored(&mut self, n: usize) {
        if let Some(d) = &mut self.mtp {
            d.lose_track();
        }
        self.pos = n;
        self.kv.forget_checkpoint_after(0);
        debug_assert!(self.pos <= self.kv.capacity);
    }

    /// Marks the end of a prompt: the rings (DeepSeek-V4, sliding windows) are copied, so that the next turn
    /// of the conversation can go back here even when its template rewrites the answer
    /// (see [`Session::truncate`]).
    pub fn checkpoint(&mut self) {
        self.kv.checkpoint(self.pos);
    }

    /// After a batched forward that fed a token and `fed - 1` drafts at `base`, of which
    /// the first `kept` were accepted: keeps `base + 1 + kept` positions. A recurrent state
    /// is put back to `saved` ([`Session::save_states`]) and the kept tokens replayed.
    pub(crate) fn keep_verified(&mut self, base: usize, batch: &[u32], kept: usize) -> Result<()> {
        self.pos = base + 1 + kept;
        self.kv.forget_checkpoint_after(self.pos);
        if self.kv.has_states() && kept + 1 < batch.len() {
            self.kv.restore_states(&self.saved_states);
            self.pos = base;
            self.forward(&batch[..1 + kept], false)?;
        }
        Ok(())
    }

    /// The most drafts one verification may feed: a refused draft cuts the cache back by
    /// up to this many positions, which the rings must still hold.
    pub(crate) fn draft_limit(&self) -> usize {
        self.kv.cut_depth()
    }

    /// Keeps the recurrent states (linear-attention models) before a draft's verification.
    pub(crate) fn save_states(&mut self) {
        if self.kv.has_states() {
            self.kv.save_states(&mut self.saved_states);
        }
    }

    /// Checks ids against the vocabulary.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab_size = self.model.info.vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab_size) {
            Some(&id) => Err(ModelError::TokenOutOfVocab { id, vocab_size }),
            None => Ok(()),
        }
    }

    /// Feeds `tokens` after what was fed before. Returns the logits of the last position
    /// (`[vocab]`), or of every new position (`[n, vocab]`) when `all_logits`.
    pub fn forward(&mut self, tokens: &[u32], all_logits: bool) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        self.check_tokens(tokens)?;
        let needed = self.pos + tokens.len();
        if needed > self.kv.capacity {
            return Err(ModelError::ContextFull {
                needed,
                capacity: self.kv.capacity,
            });
        }
        let mode = if all_logits {
            LogitsFor::All
        } else {
            LogitsFor::Last
        };
        if let Err(e) = self.model.forward(
            tokens,
            self.pos,
            &mut self.kv,
            &mut self.scratch,
            mode,
            self.positions,
        ) {
            self.forget_if_stateful();
            return Err(e);
        }
        if let Some(d) = &mut self.mtp {
            d.record(self.model, self.pos, tokens, &self.scratch.x);
        }
        self.pos = needed;
        let rows = if all_logits { tokens.len() } else { 1 };
        Ok(&self.scratch.logits[..rows * self.model.info.vocab_size])
    }

    /// Prefills `prompt`, then samples up to `max_tokens` tokens, calling `on_token` for each.
    /// Stops after a token in `stop_ids`.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        sampler: &mut Sampler,
        stop_ids: &[u32],
        on_token: impl FnMut(u32),
    ) -> Result<Generation> {
        self.generate_constrained(
            prompt,
            max_tokens,
            sampler,
            stop_ids,
            &mut Unconstrained,
            on_token,
        )
    }

    /// [`Session::generate`] under a constraint: before each sample the constraint masks
    /// the logits (disallowed tokens set to -inf), after it the constraint is told the
    /// token; generation also ends when the constraint says the output is finished.
    pub fn generate_constrained(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        sampler: &mut Sampler,
        stop_ids: &[u32],
        constraint: &mut dyn Constraint,
        on_token: impl FnMut(u32),
    ) -> Result<Generation> {
        let t0 = Instant::now();
        let mut picker = Picker {
            sampler,
            masked: Vec::new(),
        };
        let first = picker.pick(self.forward(prompt, false)?, constraint)?;
        self.checkpoint();
        let mut run = Run {
            generated: Vec::with_capacity(max_tokens),
            stats: GenStats {
                prompt_tokens: prompt.len(),
                prefill_s: t0.elapsed().as_secs_f64(),
                ttft_s: t0.elapsed().as_secs_f64(),
                ..GenStats::default()
            },
            finish: FinishReason::Length,
            max_tokens,
            stop_ids,
            on_token,
            lookup: self.lookup.map(Lookup::new),
            history: prompt.to_vec(),
        };
        let t1 = Instant::now();
        let mut next = first;
        while let Some(n) = self.decode_step(next, &mut run, &mut picker, constraint)? {
            next = n;
        }
        run.stats.decode_s = t1.elapsed().as_secs_f64();
        Ok(Generation {
            prompt_ids: prompt.to_vec(),
            generated_ids: run.generated,
            finish_reason: run.finish,
            stats: run.stats,
        })
    }

    /// Emits `next` and computes the token after it (feeding the constraint's forced
    /// tokens as drafts in the same forward when it offers some). `None` when generation
    /// ends.
    fn decode_step<F: FnMut(u32)>(
        &mut self,
        next: u32,
        run: &mut Run<'_, F>,
        picker: &mut Picker<'_>,
        constraint: &mut dyn Constraint,
    ) -> Result<Option<u32>> {
        if run.generated.len() >= run.max_tokens || !run.emit(next, constraint) {
            return Ok(None);
        }
        let capacity = self.kv.capacity;
        if run.generated.len() == run.max_tokens || self.pos >= capacity {
            return Ok(None);
        }
        let room = (run.max_tokens - run.generated.len()).min(capacity - self.pos);
        let at = DraftAt {
            model: self.model,
            pos: self.pos,
            next,
            history: &run.history,
            max: room.saturating_sub(1).min(self.draft_limit()),
        };
        let found = {
            let mut forced = Forced(&mut *constraint);
            let mut sources = draft_sources(&mut forced, run.lookup.as_mut(), self.mtp.as_mut());
            first_draft(&mut sources, &at)
        };
        let Some((source, draft)) = found else {
            let logits = self.forward(&[next], false)?;
            run.stats.decode_tokens += 1;
            return picker.pick(logits, constraint).map(Some);
        };
        let before = run.stats.drafted_tokens;
        let after = self.verify_draft(next, &draft, run, picker, constraint)?;
        let kept = run.stats.drafted_tokens - before;
        let mut forced = Forced(&mut *constraint);
        let mut sources = draft_sources(&mut forced, run.lookup.as_mut(), self.mtp.as_mut());
        if let Some(d) = &mut sources[source] {
            d.verified(draft.len(), kept);
        }
        Ok(after)
    }

    /// Tokens the constraint forces, fed with `next` in one batch; each is kept while
    /// sampling its row picks it (the same picks, in the same order, as one token at a
    /// time: batched logits equal single ones bit for bit).
    fn verify_draft<F: FnMut(u32)>(
        &mut self,
        next: u32,
        draft: &[u32],
        run: &mut Run<'_, F>,
        picker: &mut Picker<'_>,
        constraint: &mut dyn Constraint,
    ) -> Result<Option<u32>> {
        let vocab = self.model.info.vocab_size;
        let base = self.pos;
        let mut batch = Vec::with_capacity(draft.len() + 1);
        batch.push(next);
        batch.extend_from_slice(draft);
        // A recurrent state cannot be cut back: keep the state before the batch, to
        // replay the kept tokens from it if a draft is refused.
        self.save_states();
        let rows = self.forward(&batch, true)?.to_vec();
        run.stats.draft_proposed += draft.len();
        run.stats.draft_forwards += 1;
        let mut kept = 0;
        let after = loop {
            let t = picker.pick(&rows[kept * vocab..(kept + 1) * vocab], constraint)?;
            run.stats.decode_tokens += 1;
            if kept < draft.len() && t == draft[kept] {
                kept += 1;
                run.stats.drafted_tokens += 1;
                if !run.emit(t, constraint) || run.generated.len() == run.max_tokens {
                    break None;
                }
            } else {
                break Some(t);
            }
        };
        self.keep_verified(base, &batch, kept)?;
        Ok(after)
    }
}

/// Samples under a constraint, masking into a reused buffer.
struct Picker<'s> {
    sampler: &'s mut Sampler,
    masked: Vec<f32>,
}

impl Picker<'_> {
    fn pick(&mut self, logits: &[f32], c: &mut dyn Constraint) -> Result<u32> {
        pick(self.sampler, &mut self.masked, logits, c)
    }
}

/// Samples `logits` under `c` (masking into `masked`, a reused buffer).
pub(crate) fn pick(
    sampler: &mut Sampler,
    masked: &mut Vec<f32>,
    logits: &[f32],
    c: &mut dyn Constraint,
) -> Result<u32> {
    if !c.active() {
        return Ok(sampler.sample(logits));
    }
    masked.clear();
    masked.extend_from_slice(logits);
    c.mask(masked);
    if masked.iter().all(|v| *v == f32::NEG_INFINITY) {
        return Err(ModelError::Tokenizer(
            "the grammar allows no token here (no vocabulary token continues it)".into(),
        ));
    }
    Ok(sampler.sample(masked))
}

/// What one generation has produced so far.
struct Run<'a, F> {
    generated: Vec<u32>,
    stats: GenStats,
    finish: FinishReason,
    max_tokens: usize,
    stop_ids: &'a [u32],
    on_token: F,
    /// Prompt-lookup drafting and its current length.
    lookup: Option<Lookup>,
    /// Prompt and generated tokens.
    history: Vec<u32>,
}

impl<F: FnMut(u32)> Run<'_, F> {
    /// Records `t`; false when it ends the generation (a stop id, or the constraint is
    /// complete).
    fn emit(&mut self, t: u32, constraint: &mut dyn Constraint) -> bool {
        self.generated.push(t);
        self.history.push(t);
        (self.on_token)(t);
        if self.stop_ids.contains(&t) || !constraint.accept(t) {
            self.finish = FinishReason::Stop;
            return false;
        }
        true
    }
}

/// Restricts which tokens may be sampled (a grammar, a schema).
pub trait Constraint {
    /// Whether it restricts anything (an inactive constraint costs nothing per token).
    fn active(&self) -> bool {
        true
    }
    /// Sets the logits of disallowed tokens to -inf.
    fn mask(&mut self, logits: &mut [f32]);
    /// Records the sampled token; false when the output is complete and must end.
    fn accept(&mut self, token: u32) -> bool;
    /// Tokens the constraint forces next (after the tokens accepted so far), to be fed in
    /// one batch and kept while sampling picks them; none by default.
    fn draft(&mut self) -> Vec<u32> {
        Vec::new()
    }
}

/// No constraint.
pub(crate) struct Unconstrained;

impl Constraint for Unconstrained {
    fn active(&self) -> bool {
        false
    }
    fn mask(&mut self, _: &mut [f32]) {}
    fn accept(&mut self, _: u32) -> bool {
        true
    }
}

/// The draft sources in the order they are asked: the constraint's forced tokens, prompt
/// lookup, the MTP layer (`None` for those that are off). No allocation.
pub(crate) fn draft_sources<'a>(
    forced: &'a mut Forced<'_>,
    lookup: Option<&'a mut Lookup>,
    mtp: Option<&'a mut MtpDrafts>,
) -> [Option<&'a mut dyn Drafter>; 3] {
    [
        Some(forced),
        lookup.map(|l| l as &mut dyn Drafter),
        mtp.map(|m| m as &mut dyn Drafter),
    ]
}
