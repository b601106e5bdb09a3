//! The decode hot path allocates nothing per token: all buffers live in the session.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use coli_models::experts::{CacheSize, Placement};
use coli_models::{Sampler, SamplingParams, Session};
use coli_tests::Reference;

struct Counting;

thread_local! {
    /// Set on the pool's worker threads, where the decode runs: only their allocations count
    /// (the test harness's own threads may allocate at any time).
    static IN_POOL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed) && IN_POOL.with(|c| c.get())
}
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A pool like `coli run`'s whose workers are marked, so their allocations count. One for
/// the whole binary: a dropped pool's exiting workers free their thread-locals (and
/// crossbeam allocates then), which would be counted against whatever test runs next.
fn marked_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .start_handler(|_| IN_POOL.with(|c| c.set(true)))
            .build()
            .unwrap()
    })
}

/// The tests share the counter and the pool: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Allocations over three runs of 10 decode steps of fixture `name` (after a warm-up
/// step), run on a marked pool worker as `coli run` does; `placed`: experts through the
/// expert store with every one of them cached; `extra` runs once per step inside the
/// counted region.
fn decode_allocations(name: &str, placed: bool, extra: &(dyn Fn() + Sync)) -> Vec<usize> {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    marked_pool().install(|| {
        assert!(
            IN_POOL.with(|c| c.get()),
            "the decode must run on a marked worker"
        );
        let r = Reference::load(name);
        let mut model = coli_models::load(&r.dir).unwrap();
        if placed {
            let all = Placement {
                cache: CacheSize::Slots(usize::MAX),
                ..Placement::default()
            };
            model.place_experts(&r.dir, &all).unwrap();
            assert!(model.store.is_some(), "{name}: no expert store");
        }
        let ids = r.ids();
        let mut s = Session::new(&model, ids.len() + 40);
        let mut sampler = Sampler::new(SamplingParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            seed: 3,
        });
        let mut next = sampler.sample(s.forward(&ids, false).unwrap());
        // Warm-up steps: first use of the pool, the store's first guesses.
        for _ in 0..2 {
            next = sampler.sample(s.forward(&[next], false).unwrap());
        }
        let mut attempts = Vec::new();
        for _ in 0..3 {
            ALLOCS.store(0, Ordering::SeqCst);
            COUNTING.store(true, Ordering::SeqCst);
            for _ in 0..10 {
                next = sampler.sample(s.forward(&[next], false).unwrap());
                extra();
            }
            COUNTING.store(false, Ordering::SeqCst);
            attempts.push(ALLOCS.load(Ordering::SeqCst));
        }
        attempts
    })
}

/// Rayon's own queues may allocate now and then when workers steal under load; the model
/// code must not allocate at all. Per-token or per-layer allocations fail every attempt;
/// scheduler noise cannot fail all three.
fn assert_no_allocation(name: &str, attempts: &[usize]) {
    assert!(
        attempts.contains(&0),
        "{name}: allocations in three runs of 10 decode steps: {attempts:?}"
    );
    assert!(
        attempts.iter().all(|&n| n < 10),
        "{name}: allocations per 10 decode steps: {attempts:?}"
    );
}

const FIXTURES: [&str; 7] = [
    "llama_gqa",
    "olmoe_gqa_clip",
    "qwen2_moe_shared",
    "deepseek_v3_group_yarn",
    "glm4_moe_group_mtp",
    "glm5_dsa_full",
    "deepseek_v4_hash_csa",
];

#[test]
fn decode_steps_allocate_nothing() {
    for name in FIXTURES {
        assert_no_allocation(name, &decode_allocations(name, false, &|| {}));
    }
}

/// What `coli run` does on a MoE model that fits: experts placed through the store, all
/// cached. A hit allocates nothing (a miss may: see the expert store's module doc).
#[test]
fn placed_decode_with_every_expert_cached_allocates_nothing() {
    for name in FIXTURES.into_iter().filter(|n| *n != "llama_gqa") {
        assert_no_allocation(name, &decode_allocations(name, true, &|| {}));
    }
}

/// The counter counts: one `Vec` per decode step (the mutation this test exists to catch)
/// fails the check.
#[test]
#[should_panic(expected = "allocations")]
fn a_per_token_vec_is_caught() {
    let per_token = || {
        std::hint::black_box(vec![0u8; 64]);
    };
    assert_no_allocation(
        "llama_gqa",
        &decode_allocations("llama_gqa", false, &per_token),
    );
}
