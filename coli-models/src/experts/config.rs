//! What a run asks of the store (placement flags, cache size, prefetch mode) and what it
//! reports back (counters). One place decides the cache size: [`Placement::cap_per_layer`].

use std::sync::atomic::AtomicU64;

/// How the store places experts.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Cached (unpinned) experts per layer.
    pub cap: usize,
    /// Read with `O_DIRECT` (no page cache).
    pub direct: bool,
    /// Read-ahead mode.
    pub prefetch: Prefetch,
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

/// The store's live counters.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) prefetch_hits: AtomicU64,
    pub(crate) prefetches: AtomicU64,
    pub(crate) wasted_prefetches: AtomicU64,
    pub(crate) speculative: AtomicU64,
    pub(crate) speculative_used: AtomicU64,
    pub(crate) speculative_wasted: AtomicU64,
    pub(crate) speculation_skipped: AtomicU64,
    pub(crate) speculation_calls: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) read_ns: AtomicU64,
    pub(crate) wait_ns: AtomicU64,
}

/// How routed experts are read ahead (`--prefetch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Prefetch {
    /// Every miss is read on the compute thread when it is needed.
    Off,
    /// A layer's missing experts are read in parallel on I/O threads as soon as it is routed.
    Layer,
    /// As `Layer`, and the next layer's experts are guessed and read early (while the
    /// guesses prove right).
    #[default]
    On,
}

impl Prefetch {
    /// Every mode, in the order `tune` tries them.
    pub const ALL: [Prefetch; 3] = [Prefetch::On, Prefetch::Layer, Prefetch::Off];

    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Prefetch::Off => "off",
            Prefetch::Layer => "layer",
            Prefetch::On => "on",
        }
    }

    /// I/O threads the store starts for this mode.
    pub fn io_threads(self) -> usize {
        match self {
            Prefetch::Off => 0,
            Prefetch::Layer | Prefetch::On => PREFETCH_THREADS,
        }
    }
}

impl std::fmt::Display for Prefetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Prefetch {
    type Err = String;

    fn from_str(s: &str) -> Result<Prefetch, String> {
        match s {
            "off" => Ok(Prefetch::Off),
            "layer" => Ok(Prefetch::Layer),
            "on" => Ok(Prefetch::On),
            other => Err(format!("--prefetch takes on, layer or off, got {other:?}")),
        }
    }
}

impl serde::Serialize for Prefetch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Prefetch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Prefetch, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
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
    /// `O_DIRECT` reads. Without it they are still chosen for an automatic cache that
    /// cannot hold every expert ([`Placement::reads_direct`]).
    pub direct: bool,
    /// Read-ahead mode.
    pub prefetch: Prefetch,
    /// Bytes of historically hottest experts to pin at start (`.coli_usage`).
    pub pin_bytes: u64,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            cache: CacheSize::Auto,
            direct: false,
            prefetch: Prefetch::On,
            pin_bytes: 0,
        }
    }
}

impl Placement {
    /// Cached experts per layer for `moe_layers` layers of at most `experts_per_layer`
    /// experts of `expert_bytes` each: from the flag, else what `available` bytes of RAM
    /// allow after a reserve (1 GiB, or a quarter of `available` when that is smaller) and
    /// the pins (all of them when they fit). At least 1. `None`: no store ([`CacheSize::Off`]).
    pub fn cap_per_layer(
        &self,
        moe_layers: usize,
        experts_per_layer: usize,
        expert_bytes: u64,
        available: Option<u64>,
    ) -> Option<usize> {
        let per_slot = moe_layers as u64 * expert_bytes.max(1);
        let cap = match self.cache {
            CacheSize::Off => return None,
            CacheSize::Slots(n) => n,
            CacheSize::Bytes(b) => (b / per_slot) as usize,
            CacheSize::Auto => {
                // Leave room for everything else: 1 GiB, or a quarter of what is left in a
                // small container.
                let avail = available.unwrap_or(u64::MAX);
                let reserve = (1u64 << 30).min(avail / 4);
                let budget = avail.saturating_sub(reserve).saturating_sub(self.pin_bytes);
                (budget / per_slot) as usize
            }
        };
        Some(cap.clamp(1, experts_per_layer.max(1)))
    }
}

impl Placement {
    /// Whether experts are read with `O_DIRECT` when `cap` of `experts_per_layer` experts
    /// are cached per layer: when asked (`--direct`), and by default when the cache was
    /// sized automatically and still cannot hold every expert. RAM is then short, and the
    /// page cache would only compete with the expert cache for it (in a 3 GB memory
    /// cgroup, an OLMoE-geometry model decoded at 2.2 tok/s through the page cache and
    /// 3.5 with `O_DIRECT`, BENCHMARKS.md). An explicit cache size keeps the page cache:
    /// it may be small on purpose on a machine with RAM to spare.
    pub fn reads_direct(&self, cap: usize, experts_per_layer: usize) -> bool {
        self.direct || (matches!(self.cache, CacheSize::Auto) && cap < experts_per_layer)
    }
}

/// I/O threads for prefetch.
const PREFETCH_THREADS: usize = 4;

pub use super::memory::available_memory;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_automatic_cache_short_of_the_experts_reads_direct_by_default() {
        let with = |cache, direct| Placement {
            cache,
            direct,
            ..Placement::default()
        };
        // Automatic: direct exactly when the cache holds fewer than every expert.
        assert!(with(CacheSize::Auto, false).reads_direct(7, 64));
        assert!(!with(CacheSize::Auto, false).reads_direct(64, 64));
        // An explicit size keeps the page cache unless --direct says otherwise.
        assert!(!with(CacheSize::Slots(7), false).reads_direct(7, 64));
        assert!(!with(CacheSize::Bytes(1 << 30), false).reads_direct(7, 64));
        assert!(with(CacheSize::Slots(7), true).reads_direct(7, 64));
        assert!(with(CacheSize::Auto, true).reads_direct(64, 64));
    }
}
