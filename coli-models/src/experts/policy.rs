//! The cache policy of one layer, apart from I/O: which experts are held, which one to
//! evict, what counts as used. Recency is bumped in one place ([`LayerCache::use_now`]).
//!
//! Rules: at most `cap` unpinned entries; pinned entries are never evicted; the victim is
//! the least recently used unpinned entry, except that an expert prefetched because the
//! current step needs it (not a speculative guess) is evicted only when nothing else can
//! be, so it is not thrown away before its use; eviction reports prefetches that were
//! never used (the cost of guessing).

/// Marker for "no slot" in [`LayerCache`]'s index.
const NONE: u32 = u32::MAX;

/// Why an entry is in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Read because a token needed it now (a miss).
    Demand,
    /// Loaded at start and kept for good.
    Pinned,
    /// Read ahead for experts the current step routed to.
    Prefetch,
    /// Read ahead on a guess of the next layer's routing.
    Speculative,
}

/// One cached expert with the state `S` the store keeps for it.
#[derive(Debug)]
pub struct Entry<S> {
    /// Expert index within the layer.
    pub expert: usize,
    /// The store's state (bytes ready, or a read in flight).
    pub state: S,
    last_use: u64,
    pinned: bool,
    /// Prefetched and not used yet (`Some(speculative)`).
    unused_prefetch: Option<bool>,
}

/// What eviction threw away unused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Prefetched entries evicted before any use.
    pub wasted_prefetches: u64,
    /// Of those, speculative guesses.
    pub wasted_speculative: u64,
}

/// The outcome of using a cached entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// It was in the cache before this step asked (or already used since its prefetch).
    Cached,
    /// First use of a prefetched entry (`speculative`: it was a guess).
    Prefetched {
        /// The prefetch was a guess of the next layer's routing.
        speculative: bool,
    },
}

/// One layer's cache: at most `cap` unpinned entries plus the pinned ones.
#[derive(Debug)]
pub struct LayerCache<S> {
    slot_of: Vec<u32>,
    entries: Vec<Entry<S>>,
    tick: u64,
}

impl<S> LayerCache<S> {
    /// An empty cache of a layer with `experts` experts.
    pub fn new(experts: usize) -> LayerCache<S> {
        LayerCache {
            slot_of: vec![NONE; experts],
            entries: Vec::new(),
            tick: 0,
        }
    }

    /// Experts the layer has.
    pub fn experts(&self) -> usize {
        self.slot_of.len()
    }

    /// The entry index of `expert`, if cached.
    pub fn lookup(&self, expert: usize) -> Option<usize> {
        match self.slot_of.get(expert) {
            None | Some(&NONE) => None,
            Some(&i) => Some(i as usize),
        }
    }

    /// Entry `i`.
    pub fn entry(&self, i: usize) -> &Entry<S> {
        &self.entries[i]
    }

    /// Entry `i`, mutably (its state).
    pub fn entry_mut(&mut self, i: usize) -> &mut Entry<S> {
        &mut self.entries[i]
    }

    /// Cached entries (pinned included) and how many of them are pinned.
    pub fn counts(&self) -> (usize, usize) {
        let pinned = self.entries.iter().filter(|e| e.pinned).count();
        (self.entries.len(), pinned)
    }

    /// Starts a new use: one tick of recency shared by everything the caller touches now.
    pub fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Marks entry `i` as used at `tick`; says whether this was a prefetch's first use.
    pub fn use_now(&mut self, i: usize, tick: u64) -> Use {
        let e = &mut self.entries[i];
        e.last_use = tick;
        match e.unused_prefetch.take() {
            Some(speculative) => Use::Prefetched { speculative },
            None => Use::Cached,
        }
    }

    /// Marks the cached ones among `experts` as used now (they are needed by this step),
    /// so that making room for the others cannot evict them. Does not count as a use of
    /// a prefetch.
    pub fn touch(&mut self, experts: &[usize]) {
        let tick = self.next_tick();
        for &expert in experts {
            if let Some(i) = self.lookup(expert) {
                self.entries[i].last_use = tick;
            }
        }
    }

    /// Pins a cached entry.
    pub fn pin(&mut self, i: usize) {
        self.entries[i].pinned = true;
    }

    /// Drops entry `i` (a failed read).
    pub fn remove(&mut self, i: usize) {
        let e = self.entries.swap_remove(i);
        self.slot_of[e.expert] = NONE;
        if i < self.entries.len() {
            self.slot_of[self.entries[i].expert] = i as u32;
        }
    }

    /// Evicts until one more unpinned entry fits under `cap` (see the module doc).
    pub fn make_room(&mut self, cap: usize) -> Evicted {
        let mut out = Evicted::default();
        while self.entries.iter().filter(|e| !e.pinned).count() >= cap {
            let Some(i) = self.victim() else { break };
            if let Some(speculative) = self.entries[i].unused_prefetch {
                out.wasted_prefetches += 1;
                out.wasted_speculative += speculative as u64;
            }
            self.remove(i);
        }
        out
    }

    /// The least recently used unpinned entry, sparing needed prefetches while possible.
    fn victim(&self) -> Option<usize> {
        let lru = |protect: bool| {
            self.entries
                .iter()
                .enumerate()
                .filter(|(_, e)| !(e.pinned || protect && e.unused_prefetch == Some(false)))
                .min_by_key(|(_, e)| e.last_use)
                .map(|(i, _)| i)
        };
        lru(true).or_else(|| lru(false))
    }

    /// Adds `expert` (not cached) as the most recently used entry.
    pub fn insert(&mut self, expert: usize, state: S, why: Admission) {
        let tick = self.next_tick();
        self.slot_of[expert] = self.entries.len() as u32;
        self.entries.push(Entry {
            expert,
            state,
            last_use: tick,
            pinned: why == Admission::Pinned,
            unused_prefetch: match why {
                Admission::Prefetch => Some(false),
                Admission::Speculative => Some(true),
                Admission::Demand | Admission::Pinned => None,
            },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(c: &LayerCache<()>) -> Vec<usize> {
        let mut v: Vec<usize> = (0..c.experts())
            .filter(|&e| c.lookup(e).is_some())
            .collect();
        v.sort();
        v
    }

    fn demand(c: &mut LayerCache<()>, cap: usize, e: usize) -> Evicted {
        match c.lookup(e) {
            Some(i) => {
                let t = c.next_tick();
                c.use_now(i, t);
                Evicted::default()
            }
            None => {
                let ev = c.make_room(cap);
                c.insert(e, (), Admission::Demand);
                ev
            }
        }
    }

    #[test]
    fn evicts_least_recently_used_first() {
        let mut c = LayerCache::new(8);
        for e in [0, 1, 2] {
            demand(&mut c, 3, e);
        }
        demand(&mut c, 3, 0); // 1 is now the oldest
        demand(&mut c, 3, 3);
        assert_eq!(cached(&c), vec![0, 2, 3]);
        demand(&mut c, 3, 4); // then 2
        assert_eq!(cached(&c), vec![0, 3, 4]);
    }

    #[test]
    fn capacity_is_respected_and_pins_come_on_top() {
        let mut c = LayerCache::new(16);
        c.insert(15, (), Admission::Pinned);
        for e in 0..10 {
            demand(&mut c, 4, e);
            let (all, pinned) = c.counts();
            assert!(all - pinned <= 4, "{all} entries, {pinned} pinned");
        }
        assert_eq!(c.counts(), (5, 1));
    }

    #[test]
    fn pinned_is_never_evicted() {
        let mut c = LayerCache::new(8);
        c.insert(7, (), Admission::Pinned);
        for e in 0..7 {
            demand(&mut c, 1, e);
            assert!(c.lookup(7).is_some());
        }
        // A demand entry pinned later stays too.
        let i = c.lookup(6).unwrap();
        c.pin(i);
        demand(&mut c, 1, 0);
        assert_eq!(cached(&c), vec![0, 6, 7]);
    }

    #[test]
    fn needed_prefetch_outlives_older_and_newer_entries_until_used() {
        let mut c = LayerCache::new(8);
        c.insert(0, (), Admission::Prefetch); // oldest, unused
        demand(&mut c, 3, 1);
        demand(&mut c, 3, 2);
        // A miss must make room: LRU would take 0, but it is a needed prefetch.
        demand(&mut c, 3, 3);
        assert!(c.lookup(0).is_some());
        assert_eq!(cached(&c), vec![0, 2, 3]);
        // Its first use is reported as a prefetch hit, later ones as plain hits.
        let i = c.lookup(0).unwrap();
        let t = c.next_tick();
        assert_eq!(c.use_now(i, t), Use::Prefetched { speculative: false });
        assert_eq!(c.use_now(i, t), Use::Cached);
    }

    #[test]
    fn unused_guesses_are_evicted_and_counted() {
        let mut c = LayerCache::new(8);
        c.insert(0, (), Admission::Speculative);
        c.insert(1, (), Admission::Prefetch);
        let ev = c.make_room(1);
        assert_eq!(
            ev,
            Evicted {
                wasted_prefetches: 2,
                wasted_speculative: 1
            }
        );
        assert_eq!(c.counts(), (0, 0));
    }

    #[test]
    fn touch_protects_from_eviction_without_counting_a_use() {
        let mut c = LayerCache::new(8);
        c.insert(0, (), Admission::Speculative);
        demand(&mut c, 2, 1);
        c.touch(&[0]);
        demand(&mut c, 2, 2); // evicts 1, the older
        assert_eq!(cached(&c), vec![0, 2]);
        let i = c.lookup(0).unwrap();
        let t = c.next_tick();
        assert_eq!(c.use_now(i, t), Use::Prefetched { speculative: true });
    }

    #[test]
    fn removal_keeps_the_index_consistent() {
        let mut c = LayerCache::new(4);
        for e in 0..4 {
            c.insert(e, e * 10, Admission::Demand);
        }
        c.remove(c.lookup(1).unwrap());
        for e in [0, 2, 3] {
            assert_eq!(c.entry(c.lookup(e).unwrap()).state, e * 10);
        }
        assert!(c.lookup(1).is_none());
        assert!(c.lookup(99).is_none());
    }
}
