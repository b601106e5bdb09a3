//! Many conversations over one model, advanced together: a [`Slot`] is a KV cache kept
//! between requests (with the tokens it holds, so a request that shares a prefix with the
//! last one only computes the rest), a [`Decoding`] is one request in flight on a slot,
//! and [`Engine::step`] advances every running decoding by one token in **one** batched
//! forward: the dense weights are read once per step for the whole batch, and a MoE layer
//! reads the union of the batch's experts once.
//!
//! Batching never changes tokens: every row of a batched forward computes what the same
//! token computes alone (the kernels keep one reduction order whatever the rows), each
//! sequence attends only to its own KV cache, and each request samples with its own
//! seeded sampler. `tests/tests/suite/batching.rs` checks it byte for byte.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;

use coli_grammar::schema::SchemaOptions;
use coli_grammar::{Compiled, GrammarCache};

use crate::arch::Scratch;
use crate::constrained::GrammarConstraint;
use crate::drafts::{first_draft, DraftAt, Drafter, Forced, Lookup};
use crate::error::{ModelError, Result};
use crate::generate::{check_output, Engine, GenerateRequest, OutputConstraint};
use crate::sampling::{log_sum_exp, Sampler};
use crate::session::{
    draft_sources, pick, Constraint, FinishReason, GenStats, PromptLookup, Session, Unconstrained,
};
use crate::tokenizer::{TextTokenizer, TokenStream};

/// Compiled grammars a slot keeps: a client resending one schema every turn (an agent)
/// lands on the slot holding its conversation and compiles it once.
const SLOT_GRAMMARS: usize = 4;

/// A KV cache that outlives requests, with the tokens whose keys and values it holds.
pub struct Slot<'e> {
    session: Session<'e>,
    tokens: Vec<u32>,
    grammars: GrammarCache,
}

impl Slot<'_> {
    /// The tokens held in the KV cache (the last conversation's prompt and answer).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions the slot can hold.
    pub fn capacity(&self) -> usize {
        self.session.capacity()
    }

    /// How many leading tokens of `prompt` this slot already holds and can reuse. A model
    /// with a recurrent state (linear attention) reuses its history only whole: a prompt
    /// that leaves it part of the way shares nothing.
    pub fn common_prefix(&self, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        if self.reuses_whole_history_only() && common < self.tokens.len() {
            0
        } else {
            common
        }
    }

    /// Whether the model keeps a recurrent state, so that only a whole history can be
    /// continued (see [`Slot::common_prefix`]).
    pub fn reuses_whole_history_only(&self) -> bool {
        self.session.kv().has_states()
    }

    /// The slot's grammar compile cache (hits and misses).
    pub fn grammars(&self) -> &GrammarCache {
        &self.grammars
    }

    /// Turns on drafting by the model's MTP layer, `depth` tokens at a time, for the
    /// requests that ask for it; false (nothing changes) when the model has none. Call on
    /// an empty slot: the layer reads every position the slot feeds from then on.
    pub fn enable_mtp(&mut self, depth: usize) -> bool {
        if !self.session.enable_mtp() {
            return false;
        }
        if let Some(d) = &mut self.session.mtp {
            d.depth = depth.max(1);
        }
        true
    }

    /// Forgets what the slot holds.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.session.reset();
    }

    /// Writes the tokens the slot holds and their KV rows (little-endian): the token
    /// count (u64), the tokens (u32 each), then per layer the keys, values and indexer keys
    /// of those positions (f32 each), then each linear-attention layer's recurrent state
    /// (f32 each; none for attention-only models), then each ring layer's rings
    /// and entries.
    pub fn save_state(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let kv = self.session.kv();
        // Only fed tokens have KV rows; a recurrent state is the state after all of them,
        // and rings hold only the last positions.
        let mut n = self.tokens.len().min(self.session.len());
        if (kv.has_states() && n != self.session.len()) || n < kv.floor() {
            n = 0;
        }
        w.write_all(&(n as u64).to_le_bytes())?;
        for t in &self.tokens[..n] {
            w.write_all(&t.to_le_bytes())?;
        }
        kv.write(n, w)
    }

    /// Reads what [`Slot::save_state`] wrote for a model of this shape. On any error the
    /// slot is left empty.
    pub fn load_state(&mut self, r: &mut dyn Read) -> Result<()> {
        let result = self.read_state(r);
        if result.is_err() {
            self.clear();
        }
        result
    }

    fn read_state(&mut self, r: &mut dyn Read) -> Result<()> {
        let bad = |e: std::io::Error| ModelError::Inconsistent(format!("slot state: {e}"));
        self.clear();
        let mut b8 = [0u8; 8];
        r.read_exact(&mut b8).map_err(bad)?;
        let n = u64::from_le_bytes(b8);
        let capacity = self.capacity();
        if n as usize >= capacity {
            return Err(ModelError::ContextFull {
                needed: n as usize + 1,
                capacity,
            });
        }
        let n = n as usize;
        let mut b4 = [0u8; 4];
        let mut tokens = Vec::with_capacity(n);
        for _ in 0..n {
            r.read_exact(&mut b4).map_err(bad)?;
            tokens.push(u32::from_le_bytes(b4));
        }
        self.session.check_tokens(&tokens)?;
        self.session.kv_mut().read(n, r).map_err(bad)?;
        if r.read(&mut b4).map_err(bad)? != 0 {
            return Err(ModelError::Inconsistent(
                "slot state: bytes after the last layer (another model's shape)".into(),
            ));
        }
        self.session.truncate(0);
        // The states just read are the state after these `n` positions.
        self.session.restored(n);
        self.tokens = tokens;
        Ok(())
    }
}

/// The log-probability of a sampled token and of the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The sampled token's log-probability under the model (before any mask).
    pub logprob: f64,
    /// The most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f64)>,
}

/// One generated token.
#[derive(Clone, Debug)]
pub struct TokenEvent {
    /// The token.
    pub id: u32,
    /// The text it completes (may be empty).
    pub text: String,
    /// Its log-probabilities, when asked for.
    pub logprob: Option<TokenLogprob>,
}

/// One request in flight on a slot.
pub struct Decoding<'e> {
    sampler: Sampler,
    masked: Vec<f32>,
    constraint: Option<GrammarConstraint>,
    stop: Vec<u32>,
    max_tokens: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    generated: Vec<u32>,
    finish: Option<FinishReason>,
    stream: Option<TokenStream<'e>>,
    tokenizer: Option<&'e TextTokenizer>,
    logprobs: Option<usize>,
    stats: GenStats,
    events: VecDeque<TokenEvent>,
    /// Prompt-lookup drafting, when the request asks for it.
    lookup: Option<Lookup>,
    /// Whether the slot's MTP layer drafts for this request.
    mtp: bool,
}

impl Decoding<'_> {
    /// Why it ended, once it has.
    pub fn finish(&self) -> Option<FinishReason> {
        self.finish
    }

    /// The tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// Prompt tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Prompt tokens whose KV came from the slot (not recomputed).
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    /// Timings so far.
    pub fn stats(&self) -> &GenStats {
        &self.stats
    }

    /// The oldest token produced and not taken yet (a step makes one, or more when drafts
    /// were accepted); `None` when all were taken.
    pub fn take_event(&mut self) -> Option<TokenEvent> {
        self.events.pop_front()
    }

    /// `ids` as text (special tokens skipped), when the model has a tokenizer.
    pub fn decode(&self, ids: &[u32]) -> Option<String> {
        self.tokenizer.and_then(|t| t.decode(ids, true).ok())
    }

    /// Ends the request early (a client went away, a stop string appeared).
    pub fn cancel(&mut self) {
        if self.finish.is_none() {
            self.finish = Some(FinishReason::Stop);
        }
    }

    /// The constraint's notes and, for an output that finished, the full validator's
    /// verdict on `text` (see [`crate::Completion::schema_violation`]).
    pub fn check_output(&self, text: &str) -> (Vec<String>, Option<String>) {
        match &self.constraint {
            Some(c) => check_output(
                c.grammar(),
                text,
                self.finish.unwrap_or(FinishReason::Length),
            ),
            None => (Vec::new(), None),
        }
    }

    /// Runs `f` on this request's draft sources (grammar-forced tokens, prompt lookup, the
    /// slot's MTP layer when the request drafts with it), in the order they are asked.
    fn with_sources<R>(
        &mut self,
        mtp: Option<&mut crate::mtp_drafts::MtpDrafts>,
        f: impl FnOnce(&mut [Option<&mut dyn Drafter>]) -> R,
    ) -> R {
        let mut none = Unconstrained;
        let c: &mut dyn Constraint = match self.constraint.as_mut() {
            Some(c) => c,
            None => &mut none,
        };
        let mut forced = Forced(c);
        let mtp = if self.mtp { mtp } else { None };
        f(&mut draft_sources(&mut forced, self.lookup.as_mut(), mtp))
    }

    /// Samples from `logits` and records the token (ending the request on a stop id, a
    /// complete grammar, `max_tokens` or a full context at `pos`).
    fn pick_and_emit(&mut self, logits: &[f32], pos: usize, capacity: usize) -> Result<()> {
        let mut none = Unconstrained;
        let c: &mut dyn Constraint = match self.constraint.as_mut() {
            Some(c) => c,
            None => &mut none,
        };
        let id = pick(&mut self.sampler, &mut self.masked, logits, c)?;
        let logprob = self.logprobs.map(|n| logprob_of(logits, id, n));
        self.generated.push(id);
        let text = match self.stream.as_mut() {
            Some(s) => s.push(id)?,
            None => String::new(),
        };
        self.events.push_back(TokenEvent { id, text, logprob });
        let complete = match self.constraint.as_mut() {
            Some(c) => !c.accept(id),
            None => false,
        };
        if self.stop.contains(&id) || complete {
            self.finish = Some(FinishReason::Stop);
        } else if self.generated.len() >= self.max_tokens || pos >= capacity {
            self.finish = Some(FinishReason::Length);
        }
        Ok(())
    }
}

/// Log-probabilities of `id` and of the `n` most likely tokens.
fn logprob_of(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let lse = log_sum_exp(logits);
    let mut top: Vec<(u32, f64)> = Vec::with_capacity(n + 1);
    if n > 0 {
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let by = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let k = n.min(order.len());
        order.select_nth_unstable_by(k - 1, by);
        order.truncate(k);
        order.sort_unstable_by(by);
        top = order
            .into_iter()
            .map(|t| (t, logits[t as usize] as f64 - lse))
            .collect();
    }
    TokenLogprob {
        logprob: logits[id as usize] as f64 - lse,
        top,
    }
}

/// The buffers of batched decode steps (sized for the largest batch seen).
#[derive(Default)]
pub struct Batch {
    scratch: Scratch,
    tokens: Vec<u32>,
    rows: Vec<Rows>,
}

impl Batch {
    /// Empty buffers.
    pub fn new() -> Batch {
        Batch::default()
    }
}

/// Extra options of a request started on a slot.
#[derive(Clone, Debug, Default)]
pub struct SlotOptions {
    /// Report the sampled token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
}

impl Engine {
    /// A slot able to hold `capacity` positions (allocated now; decode never allocates).
    pub fn slot(&self, capacity: usize) -> Slot<'_> {
        Slot {
            session: Session::new(self.model(), capacity.max(1)),
            tokens: Vec::new(),
            grammars: GrammarCache::new(SLOT_GRAMMARS),
        }
    }

    fn compile_in(
        &self,
        cache: &GrammarCache,
        c: &OutputConstraint,
    ) -> Result<Option<Arc<Compiled>>> {
        let compiled = match c {
            OutputConstraint::None => return Ok(None),
            OutputConstraint::Gbnf(text) => cache.get(text).map_err(|e| e.to_string()),
            OutputConstraint::JsonSchema(text) => cache
                .get_schema_with(text, SchemaOptions::GENERATION)
                .map_err(|e| e.to_string()),
        };
        compiled.map(Some).map_err(ModelError::Constraint)
    }

    /// Starts `req` on `slot`: reuses the longest prefix of the prompt the slot holds,
    /// prefills the rest and samples the first token (see [`Decoding::take_event`]).
    /// `max_tokens` is clamped to the room left in the slot. The request's draft sources
    /// are used by [`Engine::step`] (the MTP layer only on a slot that has it on:
    /// [`Slot::enable_mtp`]).
    pub fn begin<'e>(
        &'e self,
        slot: &mut Slot<'e>,
        req: &GenerateRequest,
        opts: &SlotOptions,
    ) -> Result<Decoding<'e>> {
        let started = Instant::now();
        let prompt = self.prompt_ids(&req.prompt)?;
        if prompt.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        let capacity = slot.capacity();
        if prompt.len() >= capacity {
            return Err(ModelError::ContextFull {
                needed: prompt.len() + 1,
                capacity,
            });
        }
        let stop = if req.ignore_eos {
            Vec::new()
        } else {
            self.eos_ids()
        };
        let constraint = match self.compile_in(&slot.grammars, &req.constraint)? {
            Some(c) => {
                let (trie, bytes) = self.vocabulary()?;
                Some(
                    GrammarConstraint::with_trie(c, trie.clone(), bytes.clone(), stop.clone())
                        .with_drafts(req.drafts),
                )
            }
            None => None,
        };
        // At least the last prompt token is recomputed: its logits give the first token.
        let reuse = slot.common_prefix(&prompt).min(prompt.len() - 1);
        // A linear-attention model keeps a prefix only when it is the whole history.
        let reuse = slot.session.truncate(reuse);
        slot.tokens.truncate(reuse);
        let mut d = Decoding {
            sampler: Sampler::new(req.sampling.clone()),
            masked: Vec::new(),
            constraint,
            stop,
            max_tokens: req.max_tokens.min(capacity - prompt.len()),
            prompt_tokens: prompt.len(),
            cached_tokens: reuse,
            generated: Vec::new(),
            finish: None,
            stream: self.tokenizer.as_ref().map(|t| t.stream()),
            tokenizer: self.tokenizer.as_ref(),
            logprobs: opts.logprobs,
            stats: GenStats {
                prompt_tokens: prompt.len(),
                ..GenStats::default()
            },
            events: VecDeque::new(),
            lookup: req.lookup.then(|| Lookup::new(PromptLookup::default())),
            mtp: self.wants_mtp(req) && slot.session.mtp.is_some(),
        };
        if d.mtp {
            if let Some(m) = &mut slot.session.mtp {
                m.depth = req.mtp_depth;
            }
        }
        let logits = match slot.session.forward(&prompt[reuse..], false) {
            Ok(l) => l,
            Err(e) => {
                // What the session still holds (nothing, if a recurrent state was lost).
                slot.tokens.truncate(slot.session.len());
                return Err(e);
            }
        };
        slot.tokens.extend_from_slice(&prompt[reuse..]);
        d.stats.prefill_s = started.elapsed().as_secs_f64();
        if d.max_tokens == 0 {
            slot.session.checkpoint();
            d.finish = Some(FinishReason::Length);
            return Ok(d);
        }
        d.pick_and_emit(logits, prompt.len(), capacity)?;
        // The end of the prompt: the next turn can come back here (the rings of DeepSeek-V4 and sliding windows).
        slot.session.checkpoint();
        d.stats.ttft_s = started.elapsed().as_secs_f64();
        Ok(d)
    }

    /// Advances every unfinished decoding of `batch` in one forward over all of them (each
    /// row at its own position, attending to its own slot's cache): by one token, or by
    /// more when the request's draft sources proposed tokens after it that sampling then
    /// picked (a decoding's drafts are rows of the same forward, verified in order: the
    /// tokens are those of decoding without drafts). Each produced token is then available
    /// from [`Decoding::take_event`].
    pub fn step<'e>(
        &'e self,
        buffers: &mut Batch,
        batch: &mut [(&mut Slot<'e>, &mut Decoding<'e>)],
    ) -> Result<()> {
        let model = self.model();
        buffers.tokens.clear();
        buffers.rows.clear();
        for (i, (slot, d)) in batch.iter_mut().enumerate() {
            if d.finish.is_some() {
                continue;
            }
            let Some(&last) = d.generated.last() else {
                continue;
            };
            let pos = slot.session.len();
            slot.tokens.push(last);
            let room = (d.max_tokens - d.generated.len()).min(slot.capacity().saturating_sub(pos));
            let at = DraftAt {
                model,
                pos,
                next: last,
                history: &slot.tokens,
                max: room.saturating_sub(1).min(slot.session.draft_limit()),
            };
            let found = d.with_sources(slot.session.mtp.as_mut(), |s| first_draft(s, &at));
            let (source, draft) = found.unwrap_or_default();
            buffers.rows.push(Rows {
                slot: i,
                first: buffers.tokens.len(),
                base: pos,
                source,
                drafts: draft.len(),
            });
            buffers.tokens.push(last);
            buffers.tokens.extend_from_slice(&draft);
        }
        if buffers.rows.is_empty() {
            return Ok(());
        }
        let vocab = model.info.vocab_size;
        let t0 = Instant::now();
        {
            let mut sessions: Vec<(&mut Session<'e>, usize)> =
                Vec::with_capacity(buffers.rows.len());
            let mut rows = buffers.rows.iter().peekable();
            for (i, (slot, _)) in batch.iter_mut().enumerate() {
                if let Some(r) = rows.next_if(|r| r.slot == i) {
                    sessions.push((&mut slot.session, 1 + r.drafts));
                }
            }
            forward_batch(&mut buffers.scratch, &buffers.tokens, &mut sessions)?;
        }
        let dt = t0.elapsed().as_secs_f64();
        for r in &buffers.rows {
            let (slot, d) = &mut batch[r.slot];
            let fed = &buffers.tokens[r.first..r.first + 1 + r.drafts];
            let capacity = slot.capacity();
            d.stats.decode_s += dt;
            if r.drafts > 0 {
                d.stats.draft_proposed += r.drafts;
                d.stats.draft_forwards += 1;
            }
            // Row j's pick is kept; it continues into row j + 1 while it is that row's draft.
            let (mut kept, mut accepted) = (0, 0);
            loop {
                let row = r.first + kept;
                let logits = &buffers.scratch.logits[row * vocab..(row + 1) * vocab];
                d.stats.decode_tokens += 1;
                d.pick_and_emit(logits, r.base + 1 + kept, capacity)?;
                let t = *d.generated.last().expect("a token was just picked");
                let matched = kept < r.drafts && t == fed[1 + kept];
                if matched {
                    accepted += 1;
                    d.stats.drafted_tokens += 1;
                }
                if !matched || d.finish.is_some() {
                    break;
                }
                kept += 1;
                slot.tokens.push(t);
            }
            if r.drafts > 0 {
                d.with_sources(slot.session.mtp.as_mut(), |s| {
                    if let Some(src) = &mut s[r.source] {
                        src.verified(r.drafts, accepted);
                    }
                });
            }
            slot.session.keep_verified(r.base, fed, kept)?;
        }
        Ok(())
    }

    /// Whether `req` drafts with the MTP layer (on a slot that has it on).
    fn wants_mtp(&self, req: &GenerateRequest) -> bool {
        req.mtp_depth > 0
            && match req.mtp {
                crate::MtpDrafting::Off => false,
                crate::MtpDrafting::On => true,
                crate::MtpDrafting::Auto => self.mtp_by_default(),
            }
    }
}

/// One decoding's rows in a batched step.
#[derive(Clone, Copy, Debug)]
struct Rows {
    /// Its index in the batch.
    slot: usize,
    /// Its first row: the token picked last step; its drafts follow.
    first: usize,
    /// Its session's length before the step.
    base: usize,
    /// The draft source that proposed the drafts.
    source: usize,
    /// Draft rows after the first.
    drafts: usize,
}

/// One forward over several sessions: `sessions[q]` feeds `n` rows, consecutive in
/// `tokens`, at its next positions. Leaves row `r`'s logits in `scratch.logits[r * vocab..]`.
/// Each session keeps its recurrent states from before (for a refused draft) and records
/// the rows for its MTP layer.
fn forward_batch(
    scratch: &mut Scratch,
    tokens: &[u32],
    sessions: &mut [(&mut Session<'_>, usize)],
) -> Result<()> {
    let Some((first, _)) = sessions.first() else {
        return Ok(());
    };
    let model = first.model();
    let (mut starts, mut seqs) = (
        Vec::with_capacity(tokens.len()),
        Vec::with_capacity(tokens.len()),
    );
    let mut at = 0;
    for (q, (s, n)) in sessions.iter().enumerate() {
        s.check_tokens(&tokens[at..at + n])?;
        if s.len() + n > s.capacity() {
            return Err(ModelError::ContextFull {
                needed: s.len() + n,
                capacity: s.capacity(),
            });
        }
        starts.extend(s.len()..s.len() + n);
        seqs.extend(std::iter::repeat_n(q, *n));
        at += n;
    }
    for (s, n) in sessions.iter_mut() {
        if *n > 1 {
            s.save_states();
        }
    }
    {
        let mut kvs: Vec<&mut crate::arch::KvCache> =
            sessions.iter_mut().map(|(s, _)| s.kv_mut()).collect();
        if let Err(e) = model.forward_rows(tokens, &starts, &seqs, &mut kvs, scratch) {
            // Recurrent states may be half advanced: those sequences start over.
            for (s, _) in sessions.iter_mut() {
                s.forget_if_stateful();
            }
            return Err(e);
        }
    }
    let h = model.info.hidden_size;
    let mut at = 0;
    for (s, n) in sessions.iter_mut() {
        s.advance(&tokens[at..at + *n], &scratch.x[at * h..(at + *n) * h]);
        at += *n;
    }
    Ok(())
}
