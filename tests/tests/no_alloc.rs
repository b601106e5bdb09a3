//! The decode hot path allocates nothing per token: all buffers live in the session.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

#[test]
fn decode_steps_allocate_nothing() {
    // Generation runs on a worker of the pool (as `coli run` does): jobs submitted from outside
    // a pool go through rayon's global injector, whose queue allocates a block every 63 jobs.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(decode_without_allocation);
}

fn decode_without_allocation() {
    for name in [
        "llama_gqa",
        "olmoe_gqa_clip",
        "qwen2_moe_shared",
        "deepseek_v3_group_yarn",
        "glm4_moe_group_mtp",
        "glm5_dsa_full",
    ] {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let ids = r.ids();
        let mut s = Session::new(&model, ids.len() + 40);
        let mut sampler = Sampler::new(SamplingParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            seed: 3,
        });
        let mut next = sampler.sample(s.forward(&ids, false).unwrap());
        // Warm-up step: first use of the thread pool may allocate its own bookkeeping once.
        next = sampler.sample(s.forward(&[next], false).unwrap());
        // Rayon's own queues may allocate now and then when workers steal under load; the
        // model code must not allocate at all. Per-token or per-layer allocations fail every
        // attempt; scheduler noise cannot fail all three.
        let mut attempts = Vec::new();
        for _ in 0..3 {
            ALLOCS.store(0, Ordering::SeqCst);
            COUNTING.store(true, Ordering::SeqCst);
            for _ in 0..10 {
                next = sampler.sample(s.forward(&[next], false).unwrap());
            }
            COUNTING.store(false, Ordering::SeqCst);
            attempts.push(ALLOCS.load(Ordering::SeqCst));
        }
        assert!(
            attempts.contains(&0),
            "{name}: allocations in three runs of 10 decode steps: {attempts:?}"
        );
        assert!(
            attempts.iter().all(|&n| n < 10),
            "{name}: allocations per 10 decode steps: {attempts:?}"
        );
    }
}
