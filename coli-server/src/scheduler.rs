//! The scheduler: one thread owns the slots and advances every running request by one
//! token per step, in one batched forward (continuous batching: requests join and leave
//! between steps). Requests beyond the slots wait in a bounded FIFO queue.
//!
//! A request goes to the free slot whose KV cache holds the longest common prefix with
//! its prompt (a conversation's next turn lands where its previous turn is), else to the
//! least recently used free slot.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use coli_models::session::GenStats;
use coli_models::{
    Batch, Decoding, Engine, FinishReason, GenerateRequest, Slot, SlotOptions, TokenEvent,
};

use crate::kvfile;
use crate::metrics::Metrics;

/// One request handed to the scheduler.
pub struct Job {
    /// What to generate (the prompt as ids).
    pub req: GenerateRequest,
    /// Log-probabilities.
    pub opts: SlotOptions,
    /// Where its events go; a closed channel cancels the request.
    pub events: tokio::sync::mpsc::UnboundedSender<Event>,
    /// Set by the front end to stop the request at the next step (a stop string matched).
    pub cancel: Arc<AtomicBool>,
}

/// What a request hears back.
#[derive(Debug)]
pub enum Event {
    /// It got a slot and its prompt is prefilled.
    Started {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Prompt tokens whose KV the slot already held.
        cached_tokens: usize,
    },
    /// A generated token.
    Token(TokenEvent),
    /// It ended.
    Done(Box<Finished>),
    /// It was refused before starting: the request is at fault (a 400), and `param`
    /// names the field when one is (a schema or grammar: `response_format`).
    Refused {
        /// The request field at fault.
        param: Option<&'static str>,
        /// Why.
        message: String,
    },
    /// It failed (an engine error: a 500).
    Error(String),
}

/// The end of a request.
#[derive(Debug)]
pub struct Finished {
    /// Why it ended.
    pub finish: FinishReason,
    /// The generated ids.
    pub generated: Vec<u32>,
    /// Timings.
    pub stats: GenStats,
    /// Whether it was stopped early (a stop string, a client that left).
    pub cancelled: bool,
    /// The constraint's notes (ignored or relaxed schema keywords).
    pub warnings: Vec<String>,
    /// Where the finished output breaks the schema (never silent: the front end answers
    /// with an error).
    pub violation: Option<String>,
}

/// The shared counters the HTTP side reads.
pub struct Shared {
    /// Requests waiting for a slot.
    pub waiting: AtomicUsize,
    /// Requests holding a slot.
    pub running: AtomicUsize,
    /// Most requests allowed to wait.
    pub queue_cap: usize,
    /// Slots.
    pub slots: usize,
    /// Positions per slot.
    pub ctx: usize,
    /// Tokens held by the slots' KV caches, summed.
    pub kv_tokens: AtomicUsize,
    /// Per-slot grammar cache hits and misses, summed.
    pub grammar_hits: AtomicU64,
    /// See `grammar_hits`.
    pub grammar_misses: AtomicU64,
    /// Counters for /metrics.
    pub metrics: Metrics,
}

/// The handle the HTTP side submits jobs through.
#[derive(Clone)]
pub struct Scheduler {
    tx: Sender<Job>,
    /// The counters.
    pub shared: Arc<Shared>,
}

/// Why a job was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum Rejected {
    /// The queue is full.
    QueueFull,
    /// The scheduler has stopped.
    Stopped,
}

impl Scheduler {
    /// Queues `job`, or says why not (the queue is full: the caller answers 429).
    pub fn submit(&self, job: Job) -> Result<(), Rejected> {
        let s = &self.shared;
        let mut cur = s.waiting.load(Ordering::SeqCst);
        loop {
            if cur >= s.queue_cap + free_slots(s) {
                return Err(Rejected::QueueFull);
            }
            match s
                .waiting
                .compare_exchange(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        self.tx.send(job).map_err(|_| {
            s.waiting.fetch_sub(1, Ordering::SeqCst);
            Rejected::Stopped
        })
    }
}

fn free_slots(s: &Shared) -> usize {
    s.slots.saturating_sub(s.running.load(Ordering::SeqCst))
}

/// Where slots are saved between runs, and the model they belong to.
#[derive(Clone, Debug)]
pub struct Persist {
    /// The directory of slot files.
    pub dir: std::path::PathBuf,
    /// The model's fingerprint (a file of another model is ignored).
    pub fingerprint: u64,
}

/// Starts the scheduler thread over `engine` with `slots`; the model computes on `pool`.
/// The thread ends when every [`Scheduler`] handle is dropped, after saving the slots when
/// `persist` is set.
pub fn start(
    engine: Arc<Engine>,
    pool: rayon::ThreadPool,
    slots: Slots,
    queue_cap: usize,
    persist: Option<Persist>,
) -> (Scheduler, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared {
        waiting: AtomicUsize::new(0),
        running: AtomicUsize::new(0),
        queue_cap,
        slots: slots.count,
        ctx: slots.ctx,
        kv_tokens: AtomicUsize::new(0),
        grammar_hits: AtomicU64::new(0),
        grammar_misses: AtomicU64::new(0),
        metrics: Metrics::default(),
    });
    let sh = shared.clone();
    let handle = std::thread::Builder::new()
        .name("coli-scheduler".into())
        .spawn(move || pool.install(|| run(&engine, slots, rx, &sh, persist)))
        .expect("spawn the scheduler thread");
    (Scheduler { tx, shared }, handle)
}

struct Running<'e> {
    job: Job,
    dec: Decoding<'e>,
}

struct SlotState<'e> {
    slot: Slot<'e>,
    last_used: u64,
    running: Option<Running<'e>>,
}

/// The slots a scheduler keeps.
#[derive(Clone, Copy, Debug)]
pub struct Slots {
    /// How many.
    pub count: usize,
    /// Positions each holds.
    pub ctx: usize,
    /// With MTP drafting on: the tokens its layer drafts at a time.
    pub mtp_depth: Option<usize>,
}

fn run(engine: &Engine, cfg: Slots, rx: Receiver<Job>, shared: &Shared, persist: Option<Persist>) {
    let mut slots: Vec<SlotState<'_>> = (0..cfg.count)
        .map(|_| {
            let mut slot = engine.slot(cfg.ctx);
            if let Some(depth) = cfg.mtp_depth {
                slot.enable_mtp(depth);
            }
            SlotState {
                slot,
                last_used: 0,
                running: None,
            }
        })
        .collect();
    let mut library = persist
        .as_ref()
        .map(|p| kvfile::Library::open(&p.dir, p.fingerprint, SAVED_CONVERSATIONS));
    publish_kv(&slots, shared);
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut batch = Batch::new();
    let mut tick = 0u64;
    let mut open = true;
    while open || !queue.is_empty() || slots.iter().any(|s| s.running.is_some()) {
        let idle = queue.is_empty() && slots.iter().all(|s| s.running.is_none());
        // Wait for work when idle; otherwise only collect what has arrived.
        if idle && open {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(job) => queue.push_back(job),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(job) => queue.push_back(job),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        admit(
            engine,
            &mut slots,
            &mut queue,
            shared,
            &mut tick,
            library.as_mut(),
        );
        step(engine, &mut slots, &mut batch, shared);
        publish_kv(&slots, shared);
    }
    if let Some(lib) = library.as_mut() {
        for (i, s) in slots.iter().enumerate() {
            if let Err(e) = lib.save(&s.slot) {
                eprintln!("coli serve: could not save slot {i}: {e}");
            }
        }
    }
}

/// Conversations kept in `--kv-dir` (the oldest is deleted past this).
const SAVED_CONVERSATIONS: usize = 64;

fn publish_kv(slots: &[SlotState<'_>], shared: &Shared) {
    let held: usize = slots.iter().map(|s| s.slot.tokens().len()).sum();
    shared.kv_tokens.store(held, Ordering::Relaxed);
    let (hits, misses) = slots.iter().fold((0, 0), |(h, m), s| {
        (h + s.slot.grammars().hits(), m + s.slot.grammars().misses())
    });
    shared.grammar_hits.store(hits, Ordering::Relaxed);
    shared.grammar_misses.store(misses, Ordering::Relaxed);
}

/// Gives queued jobs free slots (FIFO), best prefix first.
fn admit<'e>(
    engine: &'e Engine,
    slots: &mut [SlotState<'e>],
    queue: &mut VecDeque<Job>,
    shared: &Shared,
    tick: &mut u64,
    mut library: Option<&mut kvfile::Library>,
) {
    while let Some(job) = queue.front() {
        if job.events.is_closed() {
            // The client left while waiting.
            queue.pop_front();
            shared.waiting.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let prompt = match &job.req.prompt {
            coli_models::Prompt::Ids(ids) => ids.clone(),
            other => match engine.prompt_ids(other) {
                Ok(ids) => ids,
                Err(e) => {
                    let job = queue.pop_front().expect("front exists");
                    shared.waiting.fetch_sub(1, Ordering::SeqCst);
                    let _ = job.events.send(refusal(e));
                    continue;
                }
            },
        };
        let Some(i) = choose_slot(slots, &prompt) else {
            return;
        };
        let job = queue.pop_front().expect("front exists");
        shared.waiting.fetch_sub(1, Ordering::SeqCst);
        *tick += 1;
        let st = &mut slots[i];
        st.last_used = *tick;
        if let Some(lib) = library.as_deref_mut() {
            swap_in(lib, &mut st.slot, &prompt);
        }
        match engine.begin(&mut st.slot, &job.req, &job.opts) {
            Ok(mut dec) => {
                shared.running.fetch_add(1, Ordering::SeqCst);
                shared.metrics.record_cached(dec.cached_tokens());
                let _ = job.events.send(Event::Started {
                    prompt_tokens: dec.prompt_tokens(),
                    cached_tokens: dec.cached_tokens(),
                });
                forward_event(&job, &mut dec);
                st.running = Some(Running { job, dec });
                settle(st, shared);
            }
            Err(e) => {
                let _ = job.events.send(refusal(e));
            }
        }
    }
}

/// With `--kv-dir`: a slot about to lose (part of) its conversation saves it first, and a
/// saved conversation sharing a longer prefix with `prompt` than the slot holds is loaded
/// into it (a conversation that left its slot comes back with its KV).
fn swap_in(lib: &mut kvfile::Library, slot: &mut Slot<'_>, prompt: &[u32]) {
    let held = slot.common_prefix(prompt);
    let saved = lib
        .best(prompt, slot.reuses_whole_history_only())
        .map(|(p, n)| (p.to_path_buf(), n));
    if held < slot.tokens().len() {
        if let Err(e) = lib.save(slot) {
            eprintln!("coli serve: could not save an evicted conversation: {e}");
        }
    }
    if let Some((path, n)) = saved {
        if n > held {
            if let Err(e) = lib.restore(slot, &path) {
                eprintln!("coli serve: {e}; ignored");
            }
        }
    }
}

/// Why a request could not start, as the front end answers it: the request's fault, or
/// the engine's.
fn refusal(e: coli_models::ModelError) -> Event {
    use coli_models::ModelError as E;
    let param = match &e {
        E::Constraint(_) => Some("response_format"),
        E::TokenOutOfVocab { .. } | E::EmptyPrompt | E::ContextFull { .. } => Some("prompt"),
        E::Template(_) | E::Tokenizer(_) => Some("messages"),
        _ => return Event::Error(e.to_string()),
    };
    Event::Refused {
        param,
        message: e.to_string(),
    }
}

/// The free slot holding the longest prefix of `prompt`, ties to the least recently used.
fn choose_slot(slots: &[SlotState<'_>], prompt: &[u32]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.running.is_none())
        .max_by(|(_, a), (_, b)| {
            let (pa, pb) = (a.slot.common_prefix(prompt), b.slot.common_prefix(prompt));
            pa.cmp(&pb).then(b.last_used.cmp(&a.last_used))
        })
        .map(|(i, _)| i)
}

/// Sends the decoding's new tokens to the request; how many there were.
fn forward_event(job: &Job, dec: &mut Decoding<'_>) -> usize {
    let mut n = 0;
    while let Some(e) = dec.take_event() {
        n += 1;
        if job.events.send(Event::Token(e)).is_err() {
            dec.cancel();
        }
    }
    n
}

/// Ends the slot's request if it finished or was cancelled.
fn settle(st: &mut SlotState<'_>, shared: &Shared) {
    let Some(r) = &mut st.running else { return };
    let cancelled = r.job.cancel.load(Ordering::SeqCst) || r.job.events.is_closed();
    if cancelled {
        r.dec.cancel();
    }
    if r.dec.finish().is_none() {
        return;
    }
    let r = st.running.take().expect("checked above");
    shared.running.fetch_sub(1, Ordering::SeqCst);
    let stats = r.dec.stats().clone();
    shared
        .metrics
        .record_tokens(r.dec.prompt_tokens(), r.dec.generated().len(), &stats);
    let generated = r.dec.generated().to_vec();
    let (warnings, violation) = match engine_text(&r.dec, &generated) {
        Some(text) if !cancelled => r.dec.check_output(&text),
        _ => (Vec::new(), None),
    };
    let _ = r.job.events.send(Event::Done(Box::new(Finished {
        finish: r.dec.finish().expect("finished"),
        generated,
        stats,
        cancelled,
        warnings,
        violation,
    })));
}

/// The generated text as the validator reads it (special tokens skipped).
fn engine_text(dec: &Decoding<'_>, generated: &[u32]) -> Option<String> {
    dec.decode(generated)
}

/// One batched decode step over every running request.
fn step<'e>(engine: &'e Engine, slots: &mut [SlotState<'e>], batch: &mut Batch, shared: &Shared) {
    let before = engine.model().store.as_ref().map(|s| s.stats());
    let result = {
        let mut pairs: Vec<(&mut Slot<'e>, &mut Decoding<'e>)> = slots
            .iter_mut()
            .filter_map(|s| match &mut s.running {
                Some(r) if r.dec.finish().is_none() => Some((&mut s.slot, &mut r.dec)),
                _ => None,
            })
            .collect();
        if pairs.is_empty() {
            return;
        }
        shared.metrics.record_batch(pairs.len());
        engine.step(batch, &mut pairs)
    };
    if let (Some(b), Some(store)) = (before, engine.model().store.as_ref()) {
        shared.metrics.record_store(&b, &store.stats());
    }
    let mut produced = 0;
    for st in slots.iter_mut() {
        if let Some(r) = &mut st.running {
            match &result {
                Ok(()) => produced += forward_event(&r.job, &mut r.dec),
                Err(e) => {
                    let _ = r.job.events.send(Event::Error(e.to_string()));
                    r.dec.cancel();
                    st.slot.clear();
                }
            }
        }
        settle(st, shared);
    }
    shared.metrics.record_step_tokens(produced);
}
