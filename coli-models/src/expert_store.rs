//! The expert store: routed experts live on disk and in a per-layer RAM cache.
//!
//! The dense part of the model is resident; a routed expert is read with `pread` (optionally
//! `O_DIRECT`) into a reusable 4096-aligned buffer the first time a token needs it, kept
//! while it is among the layer's `cap` most recently used, and evicted after. Pinned
//! experts are never evicted. An expert whose three matrices are adjacent in one file is
//! fetched with one read, otherwise with one read per matrix. Nothing on this path goes
//! through the file mapping, so the page cache holds no expert on our behalf and RSS stays
//! within the budget.
//!
//! Prefetch: while layer L computes, the caller may name experts layer L+1 will probably
//! need; a bounded pool of I/O threads reads them into the cache. A prefetched expert is
//! waited for, never used half-read.
//!
//! The bytes of an expert are the same whichever way they arrive, and the model computes
//! with them identically, so placement changes speed, never tokens.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use coli_kernels::{MatRef, WFormat};

use crate::decoder::{Ffn, Mlp, Transformer};
use crate::error::{ModelError, Result};
use crate::weights::{Linear, Scales};

/// Alignment of expert buffers and of `O_DIRECT` reads.
pub const ALIGN: usize = 4096;

/// Two parts closer than this (bytes of other data between them) are read together.
const COALESCE_SLACK: u64 = 64 * 1024;

/// How the store places experts.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Cached (unpinned) experts per layer.
    pub cap: usize,
    /// Read with `O_DIRECT` (no page cache).
    pub direct: bool,
    /// I/O threads for prefetch; 0 disables prefetch.
    pub prefetch_threads: usize,
    /// Also guess the next layer's experts (besides reading the current layer's in parallel).
    pub speculate: bool,
    /// Experts `(layer, expert)` to load at start and never evict.
    pub pinned: Vec<(usize, usize)>,
}

/// Counters of one run (cumulative since the store was built).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Expert requests served from RAM (cached, pinned or prefetched).
    pub hits: u64,
    /// Requests that had to read from disk on the compute thread.
    pub misses: u64,
    /// Hits on experts a prefetch brought in (included in `hits`).
    pub prefetch_hits: u64,
    /// Prefetch reads issued.
    pub prefetches: u64,
    /// Prefetched experts evicted before any use (reads a guess wasted).
    pub wasted_prefetches: u64,
    /// Speculative (next-layer) guesses read / skipped because guesses have been poor.
    pub speculative: u64,
    /// Speculative guesses not issued: their measured accuracy was below the threshold.
    pub speculation_skipped: u64,
    /// Bytes read from disk (misses, prefetches, pins).
    pub bytes_read: u64,
    /// Time spent in reads, summed over threads, in nanoseconds.
    pub read_ns: u64,
    /// Time the compute thread waited for prefetches still in flight, nanoseconds.
    pub wait_ns: u64,
    /// Pinned experts.
    pub pinned: u64,
    /// Experts in the cache now (pinned included).
    pub cached: u64,
}

impl StoreStats {
    /// Hits ÷ requests (1 when nothing was requested).
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            1.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    prefetch_hits: AtomicU64,
    prefetches: AtomicU64,
    wasted_prefetches: AtomicU64,
    speculative: AtomicU64,
    speculative_used: AtomicU64,
    speculative_wasted: AtomicU64,
    speculation_skipped: AtomicU64,
    speculation_calls: AtomicU64,
    bytes_read: AtomicU64,
    read_ns: AtomicU64,
    wait_ns: AtomicU64,
}

/// Anonymous memory for several expert buffers, 2 MiB-aligned with transparent huge pages
/// requested (expert matrices are streamed through once per use; 4 KiB pages would cost a
/// TLB miss every 4 KiB). Buffers are packed back to back so huge pages cover them whole.
struct Arena {
    /// Keeps the mapping alive; accessed only through `base`.
    _map: memmap2::MmapMut,
    /// The first 2 MiB boundary inside the mapping.
    base: *mut u8,
}

// SAFETY: each buffer handed out owns a disjoint byte range of the arena (see `AlignedBuf`).
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

const HUGE_PAGE: usize = 2 << 20;

/// Buffers per arena.
const ARENA_BUFFERS: usize = 8;

/// One [`ALIGN`]-aligned buffer: a disjoint range of an arena.
struct AlignedBuf {
    arena: Arc<Arena>,
    offset: usize,
    len: usize,
}

impl AlignedBuf {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `offset..offset + len` lies inside the mapping past `base` and belongs to
        // this buffer alone; the mapping lives as long as the arena.
        unsafe { std::slice::from_raw_parts(self.arena.base.add(self.offset), self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes this the only access to the range.
        unsafe { std::slice::from_raw_parts_mut(self.arena.base.add(self.offset), self.len) }
    }
}

/// Free buffers, all of one size (the largest expert plus alignment slack).
struct BufPool {
    free: Mutex<Vec<AlignedBuf>>,
    size: usize,
}

impl BufPool {
    fn take(&self) -> AlignedBuf {
        let mut free = self.free.lock().expect("buffer pool");
        if let Some(b) = free.pop() {
            return b;
        }
        let stride = self.size.next_multiple_of(ALIGN);
        let mut map = memmap2::MmapMut::map_anon(stride * ARENA_BUFFERS + HUGE_PAGE)
            .unwrap_or_else(|e| panic!("allocating expert buffers ({stride} bytes each): {e}"));
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let start = (map.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - map.as_ptr() as usize;
        // SAFETY: start < HUGE_PAGE, inside the mapping.
        let base = unsafe { map.as_mut_ptr().add(start) };
        let arena = Arc::new(Arena { _map: map, base });
        for i in 1..ARENA_BUFFERS {
            free.push(AlignedBuf {
                arena: arena.clone(),
                offset: i * stride,
                len: self.size,
            });
        }
        AlignedBuf {
            arena,
            offset: 0,
            len: self.size,
        }
    }
}

/// One expert's bytes in RAM; immutable once read. Returns its buffer to the pool when
/// the last user lets go.
pub struct ExpertBuf {
    buf: Option<AlignedBuf>,
    pool: Arc<BufPool>,
    offsets: [usize; 3],
}

impl Drop for ExpertBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            if let Ok(mut free) = self.pool.free.lock() {
                free.push(b);
            }
        }
    }
}

/// One matrix of an expert on disk.
#[derive(Clone, Debug)]
struct Part {
    file: usize,
    offset: u64,
    len: usize,
    fmt: WFormat,
    rows: usize,
    cols: usize,
    scales: Option<Scales>,
}

/// Where an expert's gate, up and down matrices are.
#[derive(Clone, Debug)]
struct ExpertLoc {
    parts: [Part; 3],
    /// One read covers all three (same file, little else between them).
    coalesced: bool,
}

impl ExpertLoc {
    fn span(&self) -> (u64, u64) {
        let start = self.parts.iter().map(|p| p.offset).min().unwrap_or(0);
        let end = self
            .parts
            .iter()
            .map(|p| p.offset + p.len as u64)
            .max()
            .unwrap_or(0);
        (start, end)
    }

    /// Buffer bytes this expert needs, alignment slack included.
    fn buffer_len(&self) -> usize {
        if self.coalesced {
            let (s, e) = self.span();
            (e - s) as usize + 2 * ALIGN
        } else {
            self.parts.iter().map(|p| p.len + 2 * ALIGN).sum()
        }
    }
}

/// A borrowed expert: its three matrices as kernel matrices.
pub struct ExpertHandle<'a> {
    buf: Arc<ExpertBuf>,
    loc: &'a ExpertLoc,
}

impl ExpertHandle<'_> {
    /// Matrix `i` (0 gate, 1 up, 2 down).
    pub fn mat(&self, i: usize) -> MatRef<'_> {
        let p = &self.loc.parts[i];
        let bytes = &self.buf.buf.as_ref().expect("expert buffer").as_slice()
            [self.buf.offsets[i]..self.buf.offsets[i] + p.len];
        let m = MatRef::new(p.fmt, bytes, p.rows, p.cols);
        match &p.scales {
            None => m,
            Some(s) => m.with_scales(s.block_scales()),
        }
    }
}

/// A read in flight.
struct Pending {
    result: Mutex<Option<std::result::Result<Arc<ExpertBuf>, String>>>,
    done: Condvar,
}

impl Pending {
    fn wait(&self) -> std::result::Result<Arc<ExpertBuf>, String> {
        let mut r = self.result.lock().expect("pending read");
        while r.is_none() {
            r = self.done.wait(r).expect("pending read");
        }
        r.clone().expect("set above")
    }
    fn set(&self, v: std::result::Result<Arc<ExpertBuf>, String>) {
        *self.result.lock().expect("pending read") = Some(v);
        self.done.notify_all();
    }
}

enum State {
    Ready(Arc<ExpertBuf>),
    Loading(Arc<Pending>),
}

struct Entry {
    expert: usize,
    state: State,
    last_use: u64,
    pinned: bool,
    prefetched: bool,
    speculative: bool,
}

/// One layer's cache: at most `cap` unpinned entries plus the pinned ones.
struct LayerCache {
    slot_of: Vec<u32>,
    entries: Vec<Entry>,
    tick: u64,
}

const NONE: u32 = u32::MAX;

impl LayerCache {
    fn lookup(&self, expert: usize) -> Option<usize> {
        match self.slot_of[expert] {
            NONE => None,
            i => Some(i as usize),
        }
    }

    fn remove(&mut self, i: usize) {
        let e = self.entries.swap_remove(i);
        self.slot_of[e.expert] = NONE;
        if i < self.entries.len() {
            self.slot_of[self.entries[i].expert] = i as u32;
        }
    }

    /// Evicts least recently used unpinned entries until one more fits under `cap`;
    /// returns how many of them were prefetched and never used.
    fn make_room(&mut self, cap: usize) -> (u64, u64) {
        let (mut wasted, mut spec) = (0, 0);
        loop {
            let unpinned = self.entries.iter().filter(|e| !e.pinned).count();
            if unpinned < cap {
                return (wasted, spec);
            }
            let victim = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.pinned)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(i, _)| i);
            match victim {
                Some(i) => {
                    wasted += self.entries[i].prefetched as u64;
                    spec += (self.entries[i].prefetched && self.entries[i].speculative) as u64;
                    self.remove(i)
                }
                None => return (wasted, spec),
            }
        }
    }

    fn insert(
        &mut self,
        expert: usize,
        state: State,
        pinned: bool,
        prefetched: bool,
        speculative: bool,
    ) {
        self.tick += 1;
        self.slot_of[expert] = self.entries.len() as u32;
        self.entries.push(Entry {
            expert,
            state,
            last_use: self.tick,
            pinned,
            prefetched,
            speculative,
        });
    }
}

/// What the I/O threads share with the compute thread.
struct Shared {
    files: Vec<File>,
    paths: Vec<PathBuf>,
    direct: bool,
    /// Per decoder layer: its experts' locations (empty for dense layers).
    locs: Vec<Vec<ExpertLoc>>,
    pool: Arc<BufPool>,
    counters: Counters,
}

impl Shared {
    /// Reads `[start, start + len)` of file `f` into `dst` (aligned); returns where in
    /// `dst` the first requested byte landed.
    fn read(&self, f: usize, start: u64, len: usize, dst: &mut [u8]) -> io::Result<usize> {
        let file = &self.files[f];
        if !self.direct {
            file.read_exact_at(&mut dst[..len], start)?;
            return Ok(0);
        }
        let a0 = start - start % ALIGN as u64;
        let need = (start + len as u64 - a0) as usize;
        let a_len = need.next_multiple_of(ALIGN);
        let mut got = 0;
        while got < need {
            let n = file.read_at(&mut dst[got..a_len], a0 + got as u64)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file ended before the expert's bytes",
                ));
            }
            got += n;
        }
        Ok((start - a0) as usize)
    }

    /// Reads one expert into a buffer from the pool.
    fn load(&self, layer: usize, expert: usize) -> std::result::Result<ExpertBuf, String> {
        let loc = &self.locs[layer][expert];
        let mut buf = self.pool.take();
        let t0 = Instant::now();
        let mut offsets = [0usize; 3];
        let mut bytes = 0u64;
        let dst = buf.as_mut_slice();
        let err = |p: &Part, e: io::Error| {
            format!(
                "reading expert {expert} of layer {layer} from {}: {e}",
                self.paths[p.file].display()
            )
        };
        if loc.coalesced {
            let (s, e) = loc.span();
            let at = self
                .read(loc.parts[0].file, s, (e - s) as usize, dst)
                .map_err(|e| err(&loc.parts[0], e))?;
            for (o, p) in offsets.iter_mut().zip(&loc.parts) {
                *o = at + (p.offset - s) as usize;
            }
            bytes += e - s;
        } else {
            let mut pos = 0;
            for (o, p) in offsets.iter_mut().zip(&loc.parts) {
                let at = self
                    .read(p.file, p.offset, p.len, &mut dst[pos..])
                    .map_err(|e| err(p, e))?;
                *o = pos + at;
                pos = (pos + at + p.len).next_multiple_of(ALIGN);
                bytes += p.len as u64;
            }
        }
        let c = &self.counters;
        c.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        c.read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(ExpertBuf {
            buf: Some(buf),
            pool: self.pool.clone(),
            offsets,
        })
    }
}

struct Job {
    layer: usize,
    expert: usize,
    pending: Arc<Pending>,
}

/// The expert store of one model.
pub struct ExpertStore {
    shared: Arc<Shared>,
    caches: Vec<Mutex<LayerCache>>,
    cap: usize,
    speculate: bool,
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

fn part_of(l: &Linear, paths: &mut Vec<PathBuf>) -> Part {
    let v = l.view();
    let file = match paths.iter().position(|p| *p == v.file) {
        Some(i) => i,
        None => {
            paths.push(v.file.clone());
            paths.len() - 1
        }
    };
    let r = v.file_range();
    Part {
        file,
        offset: r.start,
        len: (r.end - r.start) as usize,
        fmt: l.format(),
        rows: l.rows,
        cols: l.cols,
        scales: l.scales().cloned(),
    }
}

fn locate(m: &Mlp, paths: &mut Vec<PathBuf>) -> ExpertLoc {
    let parts = [&m.gate_proj, &m.up_proj, &m.down_proj].map(|l| part_of(l, paths));
    let same_file = parts.iter().all(|p| p.file == parts[0].file);
    let total: u64 = parts.iter().map(|p| p.len as u64).sum();
    let mut loc = ExpertLoc {
        parts,
        coalesced: false,
    };
    let (s, e) = loc.span();
    loc.coalesced = same_file && e - s <= total + COALESCE_SLACK;
    loc
}

fn open(path: &Path, direct: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).map_err(|e| {
        let hint = if direct && e.raw_os_error() == Some(libc::EINVAL) {
            " (O_DIRECT is not supported on this filesystem; run without --direct)"
        } else {
            ""
        };
        ModelError::ExpertRead(format!("opening {}: {e}{hint}", path.display()))
    })
}

impl ExpertStore {
    /// Builds the store of a loaded model: locates every routed expert's bytes, opens the
    /// shards for `pread`, starts the I/O threads and loads the pinned experts.
    pub fn new(model: &Transformer, cfg: &StoreConfig) -> Result<ExpertStore> {
        let mut paths = Vec::new();
        let locs: Vec<Vec<ExpertLoc>> = model
            .layers
            .iter()
            .map(|l| match &l.ffn {
                Ffn::Moe(moe) => moe.experts.iter().map(|m| locate(m, &mut paths)).collect(),
                Ffn::Dense(_) => Vec::new(),
            })
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
            .collect::<Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            files,
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
            .map(|l| {
                Mutex::new(LayerCache {
                    slot_of: vec![NONE; l.len()],
                    entries: Vec::new(),
                    tick: 0,
                })
            })
            .collect();
        let usage = shared
            .locs
            .iter()
            .map(|l| (0..l.len()).map(|_| AtomicU64::new(0)).collect())
            .collect();
        let (jobs, workers) = if cfg.prefetch_threads > 0 {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            let workers = (0..cfg.prefetch_threads)
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
                            let r = shared.load(job.layer, job.expert).map(Arc::new);
                            job.pending.set(r);
                        })
                        .map_err(|e| ModelError::ExpertRead(format!("starting I/O thread: {e}")))
                })
                .collect::<Result<Vec<_>>>()?;
            (Some(tx), workers)
        } else {
            (None, Vec::new())
        };
        let store = ExpertStore {
            shared,
            caches,
            cap: cfg.cap.max(1),
            speculate: cfg.speculate,
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

    /// Loads an expert now and keeps it for good.
    pub fn pin(&self, layer: usize, expert: usize) -> Result<()> {
        self.check(layer, expert)?;
        let mut c = self.caches[layer].lock().expect("layer cache");
        if let Some(i) = c.lookup(expert) {
            c.entries[i].pinned = true;
            return Ok(());
        }
        let buf = self
            .shared
            .load(layer, expert)
            .map_err(ModelError::ExpertRead)?;
        c.insert(expert, State::Ready(Arc::new(buf)), true, false, false);
        Ok(())
    }

    /// The expert's matrices, from the cache or read now (a miss).
    pub fn get(&self, layer: usize, expert: usize) -> Result<ExpertHandle<'_>> {
        let loc = &self.shared.locs[layer][expert];
        let counters = &self.shared.counters;
        let mut c = self.caches[layer].lock().expect("layer cache");
        c.tick += 1;
        let tick = c.tick;
        if let Some(i) = c.lookup(expert) {
            let e = &mut c.entries[i];
            e.last_use = tick;
            let from_prefetch = std::mem::take(&mut e.prefetched);
            if from_prefetch && e.speculative {
                counters.speculative_used.fetch_add(1, Ordering::Relaxed);
            }
            let buf = match &e.state {
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
                            c.entries[i].state = State::Ready(b.clone());
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
            if from_prefetch {
                counters.prefetch_hits.fetch_add(1, Ordering::Relaxed);
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
        c.insert(expert, State::Ready(buf.clone()), false, false, false);
        Ok(ExpertHandle { buf, loc })
    }

    /// Evicts until one more expert fits, counting prefetches that were never used.
    fn make_room(&self, c: &mut LayerCache) {
        let (wasted, spec) = c.make_room(self.cap);
        let counters = &self.shared.counters;
        counters
            .wasted_prefetches
            .fetch_add(wasted, Ordering::Relaxed);
        counters
            .speculative_wasted
            .fetch_add(spec, Ordering::Relaxed);
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
        let counters = &self.shared.counters;
        let mut c = self.caches[layer].lock().expect("layer cache");
        let experts = &experts[..experts.len().min(self.cap)];
        for &expert in experts {
            if expert >= c.slot_of.len() || c.lookup(expert).is_some() {
                continue;
            }
            self.make_room(&mut c);
            if speculative {
                counters.speculative.fetch_add(1, Ordering::Relaxed);
            }
            let pending = Arc::new(Pending {
                result: Mutex::new(None),
                done: Condvar::new(),
            });
            c.insert(
                expert,
                State::Loading(pending.clone()),
                false,
                true,
                speculative,
            );
            self.shared
                .counters
                .prefetches
                .fetch_add(1, Ordering::Relaxed);
            if tx
                .send(Job {
                    layer,
                    expert,
                    pending: pending.clone(),
                })
                .is_err()
            {
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
        if self.jobs.is_none() || !self.speculate {
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
        let mut c = self.caches[layer].lock().expect("layer cache");
        c.tick += 1;
        let tick = c.tick;
        for &expert in experts {
            if expert < c.slot_of.len() {
                if let Some(i) = c.lookup(expert) {
                    c.entries[i].last_use = tick;
                }
            }
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
            let l = l.lock().expect("layer cache");
            pinned += l.entries.iter().filter(|e| e.pinned).count() as u64;
            cached += l.entries.len() as u64;
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

impl Drop for ExpertStore {
    fn drop(&mut self) {
        self.jobs = None; // closes the channel: workers finish their job and exit
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// How many routed experts each layer may cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheSize {
    /// What the machine's available RAM allows (all experts if they fit).
    Auto,
    /// No store: every expert copied into RAM at load, read in place (the baseline).
    Off,
    /// A byte budget over all layers.
    Bytes(u64),
    /// Slots per layer.
    Slots(usize),
}

/// Where routed experts go (the `coli run` placement flags).
#[derive(Clone, Debug)]
pub struct Placement {
    /// Cache size.
    pub cache: CacheSize,
    /// `O_DIRECT` reads.
    pub direct: bool,
    /// Read the current layer's missing experts in parallel on I/O threads.
    pub prefetch: bool,
    /// With `prefetch`, also guess and read the next layer's experts.
    pub speculate: bool,
    /// Bytes of historically hottest experts to pin at start (`.coli_usage`).
    pub pin_bytes: u64,
}

impl Placement {
    /// The `--prefetch` spelling of this placement.
    pub fn prefetch_mode(&self) -> &'static str {
        match (self.prefetch, self.speculate) {
            (false, _) => "off",
            (true, false) => "layer",
            (true, true) => "on",
        }
    }
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            cache: CacheSize::Auto,
            direct: false,
            prefetch: true,
            speculate: true,
            pin_bytes: 0,
        }
    }
}

/// I/O threads for prefetch.
const PREFETCH_THREADS: usize = 4;

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Shape of a model's routed experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertCensus {
    /// Layers with routed experts.
    pub moe_layers: usize,
    /// Most experts in one layer.
    pub experts_per_layer: usize,
    /// Bytes of the largest expert (its three matrices).
    pub expert_bytes: u64,
    /// Bytes of all routed experts.
    pub total_bytes: u64,
}

impl Transformer {
    /// Counts the routed experts and their bytes.
    pub fn expert_census(&self) -> ExpertCensus {
        let mut c = ExpertCensus {
            moe_layers: 0,
            experts_per_layer: 0,
            expert_bytes: 0,
            total_bytes: 0,
        };
        for l in &self.layers {
            if let Ffn::Moe(moe) = &l.ffn {
                c.moe_layers += 1;
                c.experts_per_layer = c.experts_per_layer.max(moe.experts.len());
                for m in &moe.experts {
                    let b: u64 = [&m.gate_proj, &m.up_proj, &m.down_proj]
                        .iter()
                        .map(|l| l.view().bytes().len() as u64)
                        .sum();
                    c.expert_bytes = c.expert_bytes.max(b);
                    c.total_bytes += b;
                }
            }
        }
        c
    }

    /// Copies every routed expert into resident memory (no store, no streaming).
    pub fn make_experts_resident(&mut self) -> Result<()> {
        self.copy_resident(true)
    }

    /// Applies a placement: builds the expert store (or makes experts resident for
    /// [`CacheSize::Off`]); `dir` holds the usage history for pinning. Dense models are
    /// left alone.
    pub fn place_experts(&mut self, dir: &Path, p: &Placement) -> Result<()> {
        let census = self.expert_census();
        if census.moe_layers == 0 {
            return Ok(());
        }
        let per_slot = census.moe_layers as u64 * census.expert_bytes.max(1);
        let cap = match p.cache {
            CacheSize::Off => return self.make_experts_resident(),
            CacheSize::Slots(n) => n,
            CacheSize::Bytes(b) => (b / per_slot) as usize,
            CacheSize::Auto => {
                // Leave 1 GiB and the pins for everything else.
                let avail = available_memory().unwrap_or(u64::MAX);
                let budget = avail.saturating_sub(1 << 30).saturating_sub(p.pin_bytes);
                (budget / per_slot) as usize
            }
        }
        .clamp(1, census.experts_per_layer.max(1));
        let pinned = if p.pin_bytes > 0 {
            let history = crate::usage::read(dir);
            let bytes = census.expert_bytes;
            crate::usage::hottest(&history, p.pin_bytes, |_| bytes)
                .into_iter()
                .filter(|&(l, e)| {
                    matches!(self.layers.get(l).map(|x| &x.ffn), Some(Ffn::Moe(m)) if e < m.experts.len())
                })
                .collect()
        } else {
            Vec::new()
        };
        let cfg = StoreConfig {
            cap,
            direct: p.direct,
            prefetch_threads: if p.prefetch { PREFETCH_THREADS } else { 0 },
            speculate: p.prefetch && p.speculate,
            pinned,
        };
        self.store = None;
        let store = ExpertStore::new(self, &cfg)?;
        self.store = Some(store);
        Ok(())
    }
}
