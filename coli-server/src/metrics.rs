//! Counters for `GET /metrics`, rendered in the Prometheus text format: coli's own names,
//! and the gauges a Kubernetes inference gateway (Gateway API Inference Extension, llm-d)
//! reads from a model server, under the names vLLM uses.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use coli_models::experts::StoreStats;
use coli_models::session::GenStats;

/// Counters updated by the HTTP side and the scheduler.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    decode_tokens: AtomicU64,
    decode_us: AtomicU64,
    steps: AtomicU64,
    batch_rows: AtomicU64,
    step_tokens: AtomicU64,
    draft_proposed: AtomicU64,
    draft_accepted: AtomicU64,
    expert_hits: AtomicU64,
    expert_misses: AtomicU64,
    expert_bytes: AtomicU64,
}

/// The scheduler's state when the metrics are read.
pub struct Gauges {
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Requests holding a slot.
    pub running: usize,
    /// Slots.
    pub slots: usize,
    /// Positions per slot.
    pub ctx: usize,
    /// Tokens held by the slots' KV caches.
    pub kv_tokens: usize,
    /// Per-slot grammar compile cache hits, summed.
    pub grammar_hits: u64,
    /// Per-slot grammar compile cache misses, summed.
    pub grammar_misses: u64,
}

impl Metrics {
    /// An answered request.
    pub fn record_request(&self, endpoint: &'static str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((endpoint, status)).or_default() += 1;
    }

    /// A finished generation.
    pub fn record_tokens(&self, prompt: usize, generated: usize, stats: &GenStats) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
        self.decode_tokens
            .fetch_add(stats.decode_tokens as u64, Ordering::Relaxed);
        self.decode_us
            .fetch_add((stats.decode_s * 1e6) as u64, Ordering::Relaxed);
        self.draft_proposed
            .fetch_add(stats.draft_proposed as u64, Ordering::Relaxed);
        self.draft_accepted
            .fetch_add(stats.drafted_tokens as u64, Ordering::Relaxed);
    }

    /// Prompt tokens served from a slot's KV cache.
    pub fn record_cached(&self, cached: usize) {
        self.cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
    }

    /// A decode step over `rows` requests.
    pub fn record_batch(&self, rows: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.batch_rows.fetch_add(rows as u64, Ordering::Relaxed);
    }

    /// Tokens a decode step produced (more than its rows when drafts were accepted).
    pub fn record_step_tokens(&self, tokens: usize) {
        self.step_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// The expert store's counters before and after a step.
    pub fn record_store(&self, before: &StoreStats, after: &StoreStats) {
        let d = |f: fn(&StoreStats) -> u64| f(after).saturating_sub(f(before));
        self.expert_hits.fetch_add(d(|s| s.hits), Ordering::Relaxed);
        self.expert_misses
            .fetch_add(d(|s| s.misses), Ordering::Relaxed);
        self.expert_bytes
            .fetch_add(d(|s| s.bytes_read), Ordering::Relaxed);
    }

    /// The Prometheus text exposition of everything.
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::new();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut put = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let one = |v: f64| vec![(String::new(), v)];
        let requests: Vec<(String, f64)> = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((e, c), n)| (format!("{{endpoint=\"{e}\",code=\"{c}\"}}"), *n as f64))
            .collect();
        put(
            "coli_requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status.",
            &requests,
        );
        put(
            "coli_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished generations.",
            &one(load(&self.prompt_tokens) as f64),
        );
        put(
            "coli_prompt_cached_tokens_total",
            "counter",
            "Prompt tokens whose KV a slot already held (prefix reuse).",
            &one(load(&self.cached_tokens) as f64),
        );
        put(
            "coli_generation_tokens_total",
            "counter",
            "Generated tokens.",
            &one(load(&self.generated_tokens) as f64),
        );
        let decode_s = load(&self.decode_us) as f64 * 1e-6;
        let tok_s = if decode_s > 0.0 {
            load(&self.decode_tokens) as f64 / decode_s
        } else {
            0.0
        };
        put(
            "coli_decode_tokens_per_second",
            "gauge",
            "Decode tokens per second of request time, over all finished requests.",
            &one(tok_s),
        );
        put(
            "coli_batch_steps_total",
            "counter",
            "Batched decode steps.",
            &one(load(&self.steps) as f64),
        );
        put(
            "coli_batch_rows_total",
            "counter",
            "Requests advanced by decode steps, summed (rows / steps = mean batch).",
            &one(load(&self.batch_rows) as f64),
        );
        put(
            "coli_draft_tokens_proposed_total",
            "counter",
            "Draft tokens (grammar-forced, prompt lookup, MTP) fed to verification, over finished requests.",
            &one(load(&self.draft_proposed) as f64),
        );
        put(
            "coli_draft_tokens_accepted_total",
            "counter",
            "Draft tokens the model confirmed (accepted / proposed = acceptance rate).",
            &one(load(&self.draft_accepted) as f64),
        );
        put(
            "coli_queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            &one(g.waiting as f64),
        );
        put(
            "coli_slots",
            "gauge",
            "Slots (sessions over the one loaded model).",
            &one(g.slots as f64),
        );
        put(
            "coli_slots_busy",
            "gauge",
            "Slots running a request.",
            &one(g.running as f64),
        );
        let (hits, misses) = (load(&self.expert_hits), load(&self.expert_misses));
        let hit_rate = if hits + misses > 0 {
            hits as f64 / (hits + misses) as f64
        } else {
            1.0
        };
        put(
            "coli_expert_hit_rate",
            "gauge",
            "Expert requests served from RAM during decode steps.",
            &one(hit_rate),
        );
        put(
            "coli_expert_disk_bytes_total",
            "counter",
            "Expert bytes read from disk during decode steps.",
            &one(load(&self.expert_bytes) as f64),
        );
        let per_token = load(&self.expert_bytes) as f64 / load(&self.step_tokens).max(1) as f64;
        put(
            "coli_expert_disk_bytes_per_token",
            "gauge",
            "Expert bytes read during decode steps per token they produced (accepted drafts included).",
            &one(per_token),
        );
        put(
            "coli_grammar_cache_hits_total",
            "counter",
            "Per-slot grammar compile cache hits (a schema resent by the same conversation).",
            &one(g.grammar_hits as f64),
        );
        put(
            "coli_grammar_cache_misses_total",
            "counter",
            "Per-slot grammar compile cache misses (compiles).",
            &one(g.grammar_misses as f64),
        );
        // The model-server protocol of Kubernetes inference gateways, under vLLM's names.
        put(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting to be processed.",
            &one(g.waiting as f64),
        );
        put(
            "vllm:num_requests_running",
            "gauge",
            "Requests currently running.",
            &one(g.running as f64),
        );
        let usage = g.kv_tokens as f64 / (g.slots * g.ctx).max(1) as f64;
        put(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage (1 means 100 percent).",
            &one(usage),
        );
        put(
            "vllm:gpu_cache_usage_perc",
            "gauge",
            "KV-cache usage under its older name.",
            &one(usage),
        );
        put(
            "vllm:cache_config_info",
            "gauge",
            "KV-cache configuration (block size in tokens, blocks).",
            &[(
                format!(
                    "{{block_size=\"1\",num_gpu_blocks=\"{}\"}}",
                    g.slots * g.ctx
                ),
                1.0,
            )],
        );
        out
    }
}
