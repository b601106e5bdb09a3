//! The expert store: routed experts live on disk and in a per-layer RAM cache.
//!
//! The dense part of the model is resident; a routed expert is read with `pread` (optionally
//! `O_DIRECT`) into a reusable 4096-aligned buffer the first time a token needs it, kept
//! while the cache policy ([`super::policy`]) keeps it, and evicted after. Pinned experts
//! are never evicted. Nothing on this path goes through the file mapping, so the page
//! cache holds no expert on our behalf and RSS stays within the budget.
//!
//! In place: when the cache holds every expert of every layer and reads go through the
//! page cache (no `--direct`), copying each expert into a buffer of its own only costs time
//! (zeroing fresh pages, then copying them) and doubles the memory. The store then serves
//! experts from the shards' mappings: "reading" one faults its pages in (on an I/O thread
//! for a prefetch), and the kernels read the mapping. Same bytes, same tokens. The cost is
//! the mapped reader's usual one: a shard truncated by another process while coli runs
//! kills it with SIGBUS when a truncated page is touched, where the copying path reports
//! an error. `COLI_EXPERTS_IN_PLACE=0` (or `--direct`) keeps the copying path.
//!
//! Prefetch: while layer L computes, the caller may name experts layer L+1 will probably
//! need; a bounded pool of I/O threads reads them into the cache. A prefetched expert is
//! waited for, never used half-read. A failed read or allocation on an I/O thread reaches
//! the token waiting for it as an error.
//!
//! Allocation: a hit allocates nothing. A miss or a prefetch allocates one `Arc` (the
//! buffer's handle) and, while the buffer pool is cold, one arena of 8 buffers; a prefetch
//! also allocates its `Pending` and sends one channel message.
//!
//! The bytes of an expert are the same whichever way they arrive, and the model computes
//! with them identically, so placement changes speed, never tokens.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use coli_kernels::matmul::{BlockScales, ScaleData};
use coli_kernels::MatRef;

pub use super::config::{
    available_memory, CacheSize, Placement, Prefetch, StoreConfig, StoreStats,
};
pub use super::io::{ExpertLocation, MatrixLocation, ScaleKind, ScaleLocation};

use super::buffers::{BufPool, ExpertBuf};
use super::config::Counters;
use super::io::{in_place_allowed, map_shards, open, ExpertLoc, Shared};
use super::policy::{Admission, LayerCache, Use};
use crate::error::{ModelError, Result};

/// Alignment of expert buffers and of `O_DIRECT` reads.
pub const ALIGN: usize = 4096;

/// A borrowed expert: its three matrices as kernel matrices.
pub struct ExpertHandle<'a> {
    buf: Arc<ExpertBuf>,
    loc: &'a ExpertLoc,
}

impl ExpertHandle<'_> {
    /// Matrix `i`, in the expert's order (SwiGLU: 0 gate, 1 up, 2 down; gpt-oss: 0
    /// gate_up, 1 down).
    pub fn mat(&self, i: usize) -> MatRef<'_> {
        let p = &self.loc.parts[i];
        let bytes = self.buf.part(i, p.len);
        let m = MatRef::new(p.fmt, bytes, p.rows, p.cols);
        match (&p.scales, p.streamed) {
            (_, Some((j, block_rows, block_cols))) => {
                let part = &self.loc.parts[j];
                let bytes = self.buf.part(j, part.len);
                let scales = match part.is_scales {
                    // 4-byte aligned: at an aligned file offset (checked at load), in a
                    // page-aligned buffer or mapping (`ExpertLoc::new` coalesces only
                    // reads that keep it so).
                    Some(ScaleKind::F32) => ScaleData::F32(bytemuck::cast_slice(bytes)),
                    _ => ScaleData::E8M0(bytes),
                };
                m.with_scales(BlockScales {
                    scales,
                    block_rows,
                    block_cols,
                })
            }
            (Some(s), None) => m.with_scales(s.block_scales()),
            (None, None) => m,
        }
    }
}

type ReadResult = std::result::Result<Arc<ExpertBuf>, String>;

/// A read in flight.
struct Pending {
    result: Mutex<Option<ReadResult>>,
    done: Condvar,
}

impl Pending {
    fn new() -> Arc<Pending> {
        Arc::new(Pending {
            result: Mutex::new(None),
            done: Condvar::new(),
        })
    }

    fn wait(&self) -> ReadResult {
        let mut r = self
            .result
            .lock()
            .map_err(|_| "an I/O thread failed".to_string())?;
        while r.is_none() {
            r = self
                .done
                .wait(r)
                .map_err(|_| "an I/O thread failed".to_string())?;
        }
        r.clone().unwrap_or_else(|| Err("read vanished".into()))
    }

    fn set(&self, v: ReadResult) {
        if let Ok(mut r) = self.result.lock() {
            *r = Some(v);
        }
        self.done.notify_all();
    }
}

/// A cached expert: its bytes, or a read in flight.
enum State {
    Ready(Arc<ExpertBuf>),
    Loading(Arc<Pending>),
}

struct Job {
    layer: usize,
    expert: usize,
    pending: Arc<Pending>,
}

/// The expert store of one model.
pub struct ExpertStore {
    shared: Arc<Shared>,
    caches: Vec<Mutex<LayerCache<State>>>,
    cap: usize,
    prefetch: Prefetch,
    jobs: Option<mpsc::Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    /// Routing counts per (layer, expert), for the usage history.
    usage: Vec<Vec<AtomicU64>>,
}

impl std::fmt::Debug for ExpertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertStore")
            .field("cap", &self.cap)
            .field("direct", &self.shared.direct)
            .field("stats", &self.stats())
            .finish()
    }
}

impl ExpertStore {
    /// Builds a store over `locations` (per decoder layer, its routed experts; empty for
    /// dense layers): opens the shards for `pread`, starts the I/O threads and loads the
    /// pinned experts.
    pub fn new(locations: &[Vec<ExpertLocation>], cfg: &StoreConfig) -> Result<ExpertStore> {
        let mut paths = Vec::new();
        let locs: Vec<Vec<ExpertLoc>> = locations
            .iter()
            .map(|l| l.iter().map(|e| ExpertLoc::new(e, &mut paths)).collect())
            .collect();
        let size = locs
            .iter()
            .flatten()
            .map(ExpertLoc::buffer_len)
            .max()
            .unwrap_or(ALIGN);
        let files = paths
            .iter()
            .map(|p| open(p, cfg.direct))
            .collect::<Result<Vec<File>>>()?;
        let most = locs.iter().map(Vec::len).max().unwrap_or(0);
        // In place needs the stored layout to be the kernels' (no input-major matrix).
        let stored_as_used = locs
            .iter()
            .flatten()
            .all(|l| l.parts.iter().all(|p| !p.transposed));
        let maps = if !cfg.direct && cfg.cap >= most && stored_as_used && in_place_allowed() {
            Some(map_shards(&files, &paths)?)
        } else {
            None
        };
        let shared = Arc::new(Shared {
            files,
            maps,
            paths,
            direct: cfg.direct,
            pool: Arc::new(BufPool {
                free: Mutex::new(Vec::new()),
                size,
            }),
            counters: Counters::default(),
            locs,
        });
        let caches = shared
            .locs
            .iter()
            .map(|l| Mutex::new(LayerCache::new(l.len())))
            .collect();
        let usage = shared
            .locs
            .iter()
            .map(|l| (0..l.len()).map(|_| AtomicU64::new(0)).collect())
            .collect();
        let (jobs, workers) = start_io_threads(&shared, cfg.prefetch.io_threads())?;
        let store = ExpertStore {
            shared,
            caches,
            cap: cfg.cap.max(1),
            prefetch: cfg.prefetch,
            jobs,
            workers,
            usage,
        };
        for &(layer, expert) in &cfg.pinned {
            store.pin(layer, expert)?;
        }
        Ok(store)
    }

    fn check(&self, layer: usize, expert: usize) -> Result<()> {
        if self
            .shared
            .locs
            .get(layer)
            .is_none_or(|l| expert >= l.len())
        {
            return Err(ModelError::ExpertRead(format!(
                "no routed expert {expert} in layer {layer}"
            )));
        }
        Ok(())
    }

    fn cache(&self, layer: usize) -> Result<MutexGuard<'_, LayerCache<State>>> {
        self.caches[layer]
            .lock()
            .map_err(|_| ModelError::ExpertRead(format!("the cache of layer {layer} was poisoned")))
    }

    /// Whether experts are served from the shards' mappings (see the module docs).
    pub fn in_place(&self) -> bool {
        self.shared.maps.is_some()
    }

    /// Loads an expert now and keeps it for good.
    pub fn pin(&self, layer: usize, expert: usize) -> Result<()> {
        self.check(layer, expert)?;
        let mut c = self.cache(layer)?;
        if let Some(i) = c.lookup(expert) {
            c.pin(i);
            return Ok(());
        }
        let buf = self
            .shared
            .load(layer, expert)
            .map_err(ModelError::ExpertRead)?;
        c.insert(expert, State::Ready(Arc::new(buf)), Admission::Pinned);
        Ok(())
    }

    /// The expert's matrices, from the cache or read now (a miss).
    pub fn get(&self, layer: usize, expert: usize) -> Result<ExpertHandle<'_>> {
        self.check(layer, expert)?;
        let loc = &self.shared.locs[layer][expert];
        let counters = &self.shared.counters;
        let mut c = self.cache(layer)?;
        let tick = c.next_tick();
        if let Some(i) = c.lookup(expert) {
            let used = c.use_now(i, tick);
            let buf = match &c.entry(i).state {
                State::Ready(b) => b.clone(),
                State::Loading(p) => {
                    let p = p.clone();
                    let t0 = Instant::now();
                    let r = p.wait();
                    counters
                        .wait_ns
                        .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    match r {
                        Ok(b) => {
                            c.entry_mut(i).state = State::Ready(b.clone());
                            b
                        }
                        Err(msg) => {
                            c.remove(i);
                            return Err(ModelError::ExpertRead(msg));
                        }
                    }
                }
            };
            counters.hits.fetch_add(1, Ordering::Relaxed);
            if let Use::Prefetched { speculative } = used {
                counters.prefetch_hits.fetch_add(1, Ordering::Relaxed);
                if speculative {
                    counters.speculative_used.fetch_add(1, Ordering::Relaxed);
                }
            }
            return Ok(ExpertHandle { buf, loc });
        }
        counters.misses.fetch_add(1, Ordering::Relaxed);
        let buf = Arc::new(
            self.shared
                .load(layer, expert)
                .map_err(ModelError::ExpertRead)?,
        );
        self.make_room(&mut c);
        c.insert(expert, State::Ready(buf.clone()), Admission::Demand);
        Ok(ExpertHandle { buf, loc })
    }

    /// Evicts until one more expert fits, counting prefetches that were never used.
    fn make_room(&self, c: &mut LayerCache<State>) {
        let ev = c.make_room(self.cap);
        let counters = &self.shared.counters;
        counters
            .wasted_prefetches
            .fetch_add(ev.wasted_prefetches, Ordering::Relaxed);
        counters
            .speculative_wasted
            .fetch_add(ev.wasted_speculative, Ordering::Relaxed);
    }

    /// Starts reading experts of `layer` that are not in its cache (at most `cap` of them),
    /// on the I/O threads. No-op without prefetch threads.
    ///
    /// `speculative` marks guesses (the next layer's likely experts, issued when
    /// [`ExpertStore::speculation_due`] says so) rather than experts known to be needed.
    pub fn prefetch(&self, layer: usize, experts: &[usize], speculative: bool) {
        if !speculative {
            self.touch(layer, experts);
        }
        let Some(tx) = &self.jobs else { return };
        let Ok(mut c) = self.cache(layer) else { return };
        let counters = &self.shared.counters;
        let experts = &experts[..experts.len().min(self.cap)];
        let why = if speculative {
            Admission::Speculative
        } else {
            Admission::Prefetch
        };
        for &expert in experts {
            if expert >= c.experts() || c.lookup(expert).is_some() {
                continue;
            }
            self.make_room(&mut c);
            if speculative {
                counters.speculative.fetch_add(1, Ordering::Relaxed);
            }
            let pending = Pending::new();
            c.insert(expert, State::Loading(pending.clone()), why);
            counters.prefetches.fetch_add(1, Ordering::Relaxed);
            let job = Job {
                layer,
                expert,
                pending: pending.clone(),
            };
            if tx.send(job).is_err() {
                pending.set(Err("the I/O threads have stopped".into()));
            }
        }
    }

    /// Whether to guess the next layer's experts now (asked before computing the guess, so a
    /// step that will not guess does no work for it). Guesses evict cached experts and cost
    /// reads the disk could spend on needed ones, so they are made only while at least 4 in
    /// 5 of them have been used (`(used + 1) / (used + wasted + 2) >= 0.8`); every 16th call
    /// still guesses, to notice when guessing starts to pay. `guesses` is how many a guess
    /// would read (counted as skipped otherwise).
    pub fn speculation_due(&self, guesses: usize) -> bool {
        if self.jobs.is_none() || self.prefetch != Prefetch::On {
            return false;
        }
        let c = &self.shared.counters;
        let used = c.speculative_used.load(Ordering::Relaxed);
        let wasted = c.speculative_wasted.load(Ordering::Relaxed);
        let call = c.speculation_calls.fetch_add(1, Ordering::Relaxed);
        if 5 * (used + 1) < 4 * (used + wasted + 2) && !call.is_multiple_of(16) {
            c.speculation_skipped
                .fetch_add(guesses.min(self.cap) as u64, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Marks the cached ones among `experts` (all needed by the current step) as just used,
    /// so that making room for the others cannot evict them.
    pub fn touch(&self, layer: usize, experts: &[usize]) {
        if let Ok(mut c) = self.cache(layer) {
            c.touch(experts);
        }
    }

    /// Counts one routing of `expert` in `layer` (for the usage history).
    pub fn record(&self, layer: usize, expert: usize) {
        if let Some(c) = self.usage.get(layer).and_then(|l| l.get(expert)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// This run's routing counts `(layer, expert, count)`, nonzero only.
    pub fn usage(&self) -> Vec<(usize, usize, u64)> {
        let mut v = Vec::new();
        for (l, row) in self.usage.iter().enumerate() {
            for (e, c) in row.iter().enumerate() {
                let n = c.load(Ordering::Relaxed);
                if n > 0 {
                    v.push((l, e, n));
                }
            }
        }
        v
    }

    /// Cached experts allowed per layer (pinned ones come on top).
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Whether experts are read with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.shared.direct
    }

    /// Bytes of one expert of `layer` (the sum of its three matrices).
    pub fn expert_bytes(&self, layer: usize) -> u64 {
        self.shared.locs[layer]
            .first()
            .map_or(0, |l| l.parts.iter().map(|p| p.len as u64).sum())
    }

    /// Whether every expert is read with one `pread`.
    pub fn all_coalesced(&self) -> bool {
        self.shared.locs.iter().flatten().all(|l| l.coalesced)
    }

    /// The counters so far.
    pub fn stats(&self) -> StoreStats {
        let c = &self.shared.counters;
        let (mut pinned, mut cached) = (0, 0);
        for l in &self.caches {
            if let Ok(l) = l.lock() {
                let (all, p) = l.counts();
                pinned += p as u64;
                cached += all as u64;
            }
        }
        StoreStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            prefetch_hits: c.prefetch_hits.load(Ordering::Relaxed),
            prefetches: c.prefetches.load(Ordering::Relaxed),
            wasted_prefetches: c.wasted_prefetches.load(Ordering::Relaxed),
            speculative: c.speculative.load(Ordering::Relaxed),
            speculation_skipped: c.speculation_skipped.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            read_ns: c.read_ns.load(Ordering::Relaxed),
            wait_ns: c.wait_ns.load(Ordering::Relaxed),
            pinned,
            cached,
        }
    }
}

/// The job queue of the I/O threads (None without prefetch) and their handles.
type IoThreads = (Option<mpsc::Sender<Job>>, Vec<JoinHandle<()>>);

/// Starts `n` I/O threads taking jobs from one channel (none when `n` is 0). A worker that
/// panics still answers its job (as an error), so no token waits for ever.
fn start_io_threads(shared: &Arc<Shared>, n: usize) -> Result<IoThreads> {
    if n == 0 {
        return Ok((None, Vec::new()));
    }
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    let workers = (0..n)
        .map(|i| {
            let (rx, shared) = (rx.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("coli-io-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(r) => r.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let (layer, expert) = (job.layer, job.expert);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        shared.load(layer, expert).map(Arc::new)
                    }))
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "reading expert {expert} of layer {layer}: the I/O thread panicked"
                        ))
                    });
                    job.pending.set(r);
                })
                .map_err(|e| ModelError::ExpertRead(format!("starting I/O thread: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((Some(tx), workers))
}

impl Drop for ExpertStore {
    fn drop(&mut self) {
        self.jobs = None; // closes the channel: workers finish their job and exit
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
