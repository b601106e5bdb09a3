//! `coli`: run Mixture-of-Experts models larger than RAM. A thin layer over coli-models.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use coli_models::expert_store::{CacheSize, Placement, StoreStats};
use coli_models::tokenizer::ChatMessage;
use coli_models::{registry, Sampler, SamplingParams, Session, TextTokenizer};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "coli",
    version,
    about = "Run huge Mixture-of-Experts models on ordinary machines, token-exact."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streams to stdout).
    Run(RunArgs),
    /// Teacher-forced forward over a token sequence: per-position argmax and NLL.
    Eval(EvalArgs),
    /// List supported model types, or describe a model.
    Info(InfoArgs),
    /// Convert a Llama-architecture GGUF file into a model directory (bf16 safetensors).
    ImportGguf(ImportArgs),
    /// Will it run here, how fast, with which settings (from headers, config and measured
    /// bandwidths).
    Plan(PlanArgs),
    /// Measure settings (threads, prefetch, O_DIRECT) on a calibration prompt; keep the
    /// fastest whose tokens equal the baseline's if it gains enough; save the profile that
    /// `coli run --auto-tier` applies.
    Tune(TuneArgs),
    /// Read-only readiness checks of a model directory (exit 1 if any check fails).
    Doctor(DoctorArgs),
    /// Write a quantized container: experts int4/int8/bf16, dense bf16/int8, each expert's
    /// matrices adjacent (one read per expert).
    Convert(ConvertArgs),
}

#[derive(Args)]
struct PlanArgs {
    /// Model directory. Default: $COLI_MODEL, else the demo model.
    #[arg(long, env = "COLI_MODEL")]
    model: Option<PathBuf>,
    /// RAM budget in GB (default: available memory).
    #[arg(long)]
    ram: Option<f64>,
    /// Context length to budget the KV cache for.
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Concurrent sequences (one KV cache each).
    #[arg(long, default_value_t = 1)]
    kv_slots: usize,
    /// Measure memory and disk bandwidth again instead of using the cached probe.
    #[arg(long)]
    reprobe: bool,
    /// Print the plan as JSON (schema version 1; see README).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TuneArgs {
    /// Model directory. Default: $COLI_MODEL, else the demo model.
    #[arg(long, env = "COLI_MODEL")]
    model: Option<PathBuf>,
    /// Calibration prompt ids (default: 16 fixed ids).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Decode tokens per trial.
    #[arg(long, default_value_t = 16)]
    tokens: usize,
    /// Interleaved rounds (each candidate's best counts).
    #[arg(long, default_value_t = 2)]
    runs: usize,
    /// Minimum gain over the baseline to adopt a candidate (0.05 = 5%).
    #[arg(long, default_value_t = 0.05)]
    min_gain: f64,
    /// Cached experts per layer during the trials (default: what `coli plan` gives).
    #[arg(long)]
    cap: Option<usize>,
    /// Print the trials and the profile as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct DoctorArgs {
    /// Model directory. Default: $COLI_MODEL, else the demo model.
    #[arg(long, env = "COLI_MODEL")]
    model: Option<PathBuf>,
    /// Also validate every header, the shard numbering, the index against the headers and
    /// the family's required tensors.
    #[arg(long)]
    deep: bool,
    /// RAM budget in GB (default: available memory).
    #[arg(long)]
    ram: Option<f64>,
    /// Print the checks as JSON (`{"version": 1, "status", "checks": [{id, status, summary}]}`).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ConvertArgs {
    /// Source model directory.
    #[arg(long)]
    model: PathBuf,
    /// Output directory (must not exist).
    #[arg(long)]
    out: PathBuf,
    /// Precision of the routed experts.
    #[arg(long, value_name = "int4|int8|bf16", default_value = "int8")]
    experts: String,
    /// Precision of the dense matrices.
    #[arg(long, value_name = "bf16|int8", default_value = "bf16")]
    dense: String,
    /// Shard size in GB.
    #[arg(long, default_value_t = 4.0)]
    shard_gb: f64,
}

#[derive(Args)]
struct ModelArg {
    /// Model directory (Hugging Face layout). Default: $COLI_MODEL, else the demo model.
    #[arg(long, env = "COLI_MODEL")]
    model: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// RAM for routed experts, in GB over all layers; "all" keeps every expert cached,
    /// "off" copies every expert into RAM at load (no streaming). Default: what the
    /// available RAM allows.
    #[arg(long, value_name = "GB|all|off")]
    expert_cache: Option<String>,
    /// Cached experts per MoE layer (instead of --expert-cache).
    #[arg(long, conflicts_with = "expert_cache")]
    cap: Option<usize>,
    /// Read experts with O_DIRECT (bypass the page cache).
    #[arg(long)]
    direct: bool,
    /// Expert reads ahead of use: "on" (default) reads a layer's missing experts in parallel
    /// and guesses the next layer's while this one computes; "layer" only the former; "off"
    /// reads each expert when it is needed.
    #[arg(long, value_name = "on|layer|off")]
    prefetch: Option<String>,
    /// Apply `coli plan`'s cache size and the saved `coli tune` profile for this machine,
    /// model and engine; flags given explicitly win.
    #[arg(long)]
    auto_tier: bool,
    /// Pin this many GB of the historically hottest experts (from .coli_usage) at start.
    #[arg(long, value_name = "GB", default_value_t = 0.0)]
    pin: f64,
    /// Do not add this run's routing to the model directory's .coli_usage
    /// (also: COLI_NO_USAGE=1).
    #[arg(long, env = "COLI_NO_USAGE", value_parser = clap::builder::FalseyValueParser::new())]
    no_usage: bool,
}

const GB: f64 = 1e9;

/// The placement the flags ask for.
fn placement(m: &ModelArg, dir: &std::path::Path) -> Result<Placement, String> {
    let profile = if m.auto_tier {
        coli_plan::tune::load_profile(dir)
    } else {
        None
    };
    let gb = |flag: &str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok((v * GB) as u64)
        } else {
            Err(format!(
                "{flag} must be a non-negative number of GB, got {v}"
            ))
        }
    };
    let cache = match (m.cap, m.expert_cache.as_deref()) {
        (Some(0), _) => return Err("--cap must be at least 1".into()),
        (Some(n), _) => CacheSize::Slots(n),
        (None, None) if m.auto_tier => {
            let req = coli_plan::plan::PlanRequest {
                ram: None,
                ctx: 4096,
                kv_slots: 1,
            };
            match coli_plan::plan::plan(dir, &req, false) {
                Ok(p) if p.moe_layers > 0 => CacheSize::Slots(p.cap_per_layer.max(1)),
                _ => CacheSize::Auto,
            }
        }
        (None, None) => CacheSize::Auto,
        (None, Some("all")) => CacheSize::Slots(usize::MAX),
        (None, Some("off")) => CacheSize::Off,
        (None, Some(v)) => {
            let x: f64 = v.parse().map_err(|_| {
                format!("--expert-cache takes a number of GB, \"all\" or \"off\", got {v:?}")
            })?;
            CacheSize::Bytes(gb("--expert-cache", x)?)
        }
    };
    let chosen = m
        .prefetch
        .clone()
        .or_else(|| profile.as_ref().map(|p| p.settings.prefetch.clone()))
        .unwrap_or_else(|| "on".into());
    let (prefetch, speculate) = match chosen.as_str() {
        "on" => (true, true),
        "layer" => (true, false),
        "off" => (false, false),
        other => return Err(format!("--prefetch takes on, layer or off, got {other:?}")),
    };
    Ok(Placement {
        cache,
        direct: m.direct || profile.as_ref().is_some_and(|p| p.settings.direct),
        prefetch,
        speculate,
        pin_bytes: match &profile {
            Some(prof) if m.pin == 0.0 => (prof.settings.pin_gb * GB) as u64,
            _ => gb("--pin", m.pin)?,
        },
    })
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    m: ModelArg,
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids (needs no tokenizer).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Maximum new tokens.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    json: bool,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    ignore_eos: bool,
    /// Constrain the output to a GBNF grammar (llama.cpp dialect) read from this file.
    #[arg(long, value_name = "FILE.gbnf", conflicts_with = "json_schema")]
    grammar: Option<PathBuf>,
    /// Constrain the output to JSON valid against this JSON Schema file.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// Under a grammar, sample grammar-forced tokens one at a time instead of drafting
    /// them in one batched forward (same output, slower).
    #[arg(long)]
    no_drafts: bool,
}

#[derive(Args)]
struct EvalArgs {
    #[command(flatten)]
    m: ModelArg,
    /// Token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    ids: Vec<u32>,
    /// Write the logits (little-endian f32, positions x vocab) here.
    #[arg(long)]
    logits_out: Option<PathBuf>,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct InfoArgs {
    /// Model directory to describe.
    #[arg(long)]
    model: Option<PathBuf>,
}

#[derive(Args)]
struct ImportArgs {
    /// The GGUF file.
    #[arg(long)]
    gguf: PathBuf,
    /// Output directory (must not exist).
    #[arg(long)]
    out: PathBuf,
}

/// A progress reporter for long work, drawn on stderr when it is a terminal.
pub fn progress_bar(label: &'static str) -> impl FnMut(usize, usize) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    move |done, total| {
        if tty {
            eprint!("\r{label}: {done}/{total}");
            if done == total {
                eprintln!();
            }
        } else if done == total {
            eprintln!("{label}: {done}/{total} done");
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let threads = match &cli.command {
        Command::Run(a) => auto_threads(&a.m),
        Command::Eval(a) => auto_threads(&a.m),
        _ => None,
    };
    // All work runs on a worker of one pool: its parallel loops then use the workers' own
    // queues and the decode loop allocates nothing per token.
    let result = build_pool(threads).and_then(|pool| {
        pool.install(|| match cli.command {
            Command::Run(a) => cmd_run(a),
            Command::Eval(a) => cmd_eval(a),
            Command::Info(a) => cmd_info(a),
            Command::Convert(a) => cmd_convert(a),
            Command::Doctor(a) => cmd_doctor(a),
            Command::Plan(a) => cmd_plan(a),
            Command::Tune(a) => cmd_tune(a),
            Command::ImportGguf(a) => {
                coli_models::gguf_import::import_gguf(&a.gguf, &a.out, progress_bar("import"))
                    .map_err(|e| e.to_string())
            }
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) if msg == DOCTOR_FOUND_ERRORS => ExitCode::from(1),
        Err(msg) => {
            eprintln!("coli: error: {msg}");
            ExitCode::from(2)
        }
    }
}

/// `--threads`, else (with `--auto-tier`) the tuned profile's.
fn auto_threads(m: &ModelArg) -> Option<usize> {
    m.threads.or_else(|| {
        let dir = m.model.as_ref()?;
        m.auto_tier
            .then(|| coli_plan::tune::load_profile(dir))
            .flatten()
            .map(|p| p.settings.threads)
    })
}

fn build_pool(threads: Option<usize>) -> Result<rayon::ThreadPool, String> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(n) = threads {
        if n == 0 {
            return Err("--threads must be at least 1".into());
        }
        b = b.num_threads(n);
    }
    b.build().map_err(|e| e.to_string())
}

fn model_dir(m: &ModelArg) -> Result<PathBuf, String> {
    match &m.model {
        Some(p) => Ok(p.clone()),
        None => coli_models::demo::ensure_demo_model(progress_bar("import")),
    }
}

/// The model directory, the loaded and placed model, the placement used, load seconds.
fn load(m: &ModelArg) -> Result<(PathBuf, coli_models::Transformer, Placement, f64), String> {
    let dir = model_dir(m)?;
    let t0 = Instant::now();
    let placement = placement(m, &dir)?;
    let mut model = registry::load(&dir).map_err(|e| e.to_string())?;
    model
        .place_experts(&dir, &placement)
        .map_err(|e| e.to_string())?;
    Ok((dir, model, placement, t0.elapsed().as_secs_f64()))
}

/// Expert-store figures of a run (`None` without a store). Decode-phase figures (from the
/// first generated token on, over `decode_tokens` steps taking `decode_s`): the cache hit
/// rate (experts already in RAM and not brought by a prefetch for this use), the prefetch
/// hit rate, bytes read from disk per token and the disk rate; plus whole-run totals.
fn store_stats(
    model: &coli_models::Transformer,
    start: &StoreStats,
    prefilled: &StoreStats,
    decode_tokens: usize,
    decode_s: f64,
) -> Option<serde_json::Value> {
    let st = model.store.as_ref()?;
    let now = st.stats();
    let d = |f: fn(&StoreStats) -> u64| f(&now) - f(prefilled);
    let (hits, misses, pf) = (d(|s| s.hits), d(|s| s.misses), d(|s| s.prefetch_hits));
    let requests = (hits + misses).max(1) as f64;
    let bytes = d(|s| s.bytes_read);
    let read_s = d(|s| s.read_ns) as f64 * 1e-9;
    Some(json!({
        "expert_hit_rate": if hits + misses == 0 { 1.0 } else { (hits - pf) as f64 / requests },
        "prefetch_hit_rate": pf as f64 / requests,
        "expert_hits": hits - pf,
        "prefetch_hits": pf,
        "expert_misses": misses,
        "prefetches": d(|s| s.prefetches),
        "wasted_prefetches": d(|s| s.wasted_prefetches),
        "speculative_prefetches": d(|s| s.speculative),
        "speculation_skipped": d(|s| s.speculation_skipped),
        "disk_bytes_per_token": bytes as f64 / decode_tokens.max(1) as f64,
        "disk_mb_s": bytes as f64 / 1e6 / decode_s.max(1e-9),
        "read_mb_s": if read_s > 0.0 { bytes as f64 / 1e6 / read_s } else { 0.0 },
        "prefetch_wait_ms": d(|s| s.wait_ns) as f64 * 1e-6,
        "prefill_disk_bytes": prefilled.bytes_read - start.bytes_read,
        "disk_bytes": now.bytes_read - start.bytes_read,
        "experts_pinned": now.pinned,
        "experts_cached": now.cached,
        "cap_per_layer": st.cap(),
    }))
}

/// Adds the run's routing to the model's history unless told not to; a directory that
/// cannot be written keeps no history (said once on stderr).
fn save_usage(model: &coli_models::Transformer, dir: &std::path::Path, skip: bool) {
    if skip {
        return;
    }
    if let Some(st) = &model.store {
        let run = st.usage();
        if !run.is_empty() {
            if let Err(e) = coli_models::usage::merge(dir, &run) {
                eprintln!(
                    "coli: note: routing history not saved in {}: {e}",
                    dir.display()
                );
            }
        }
    }
}

fn cmd_run(a: RunArgs) -> Result<(), String> {
    let (dir, model, placed, load_s) = load(&a.m)?;
    let tokenizer = if a.prompt_ids.is_some() && !dir.join("tokenizer.json").is_file() {
        None
    } else {
        Some(TextTokenizer::load(&dir).map_err(|e| e.to_string())?)
    };
    let prompt_ids = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, prompt) => {
            let tok = tokenizer.as_ref().expect("loaded above");
            let text = prompt
                .clone()
                .unwrap_or_else(|| "The capital of France is".into());
            let text = if a.chat {
                tok.apply_chat_template(
                    &[ChatMessage {
                        role: "user".into(),
                        content: text,
                    }],
                    true,
                )
                .map_err(|e| e.to_string())?
            } else {
                text
            };
            tok.encode(&text).map_err(|e| e.to_string())?
        }
    };
    let mut stop: Vec<u32> = model.info.eos_token_ids.clone();
    if let Some(id) = tokenizer.as_ref().and_then(TextTokenizer::eos_id) {
        if !stop.contains(&id) {
            stop.push(id);
        }
    }
    if a.ignore_eos {
        stop.clear();
    }
    let mut session = Session::new(&model, prompt_ids.len() + a.max_tokens);
    session
        .check_tokens(&prompt_ids)
        .map_err(|e| e.to_string())?;
    let mut sampler = Sampler::new(SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    });
    let cache = coli_grammar::GrammarCache::new(1);
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let compiled = match (&a.grammar, &a.json_schema) {
        (Some(path), _) => Some(
            cache
                .get(&read(path)?)
                .map_err(|e| format!("{}: {e}", path.display()))?,
        ),
        (None, Some(path)) => Some(
            cache
                .get_schema(&read(path)?)
                .map_err(|e| format!("{}: {e}", path.display()))?,
        ),
        (None, None) => None,
    };
    let mut constraint = match (&compiled, &tokenizer) {
        (Some(c), Some(tok)) => Some(
            coli_models::constrained::GrammarConstraint::new(c, tok.token_bytes(), stop.clone())
                .with_drafts(!a.no_drafts),
        ),
        (Some(_), None) => {
            return Err(
                "--grammar/--json-schema need the model's tokenizer.json (token bytes)".into(),
            )
        }
        _ => None,
    };
    let mut stream = tokenizer.as_ref().map(TextTokenizer::stream);
    let snapshot = || model.store.as_ref().map(|s| s.stats()).unwrap_or_default();
    let before = snapshot();
    let mut prefilled = None;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let on_token = |id: u32| {
        if prefilled.is_none() {
            prefilled = Some(snapshot());
        }
        if let Some(s) = stream.as_mut() {
            if let Ok(piece) = s.push(id) {
                let _ = out.write_all(piece.as_bytes());
                let _ = out.flush();
            }
        }
    };
    let g = match constraint.as_mut() {
        Some(c) => session.generate_constrained(
            &prompt_ids,
            a.max_tokens,
            &mut sampler,
            &stop,
            c,
            on_token,
        ),
        None => session.generate(&prompt_ids, a.max_tokens, &mut sampler, &stop, on_token),
    }
    .map_err(|e| e.to_string())?;
    let text = match &tokenizer {
        Some(t) => t
            .decode(&g.generated_ids, true)
            .map_err(|e| e.to_string())?,
        None => String::new(),
    };
    let _ = writeln!(out);
    let st = &g.stats;
    let prefilled = prefilled.unwrap_or_else(snapshot);
    let experts = store_stats(&model, &before, &prefilled, st.decode_tokens, st.decode_s);
    save_usage(&model, &dir, a.m.no_usage);
    if a.json {
        let v = json!({
            "prompt_ids": g.prompt_ids,
            "generated_ids": g.generated_ids,
            "text": text,
            "finish_reason": g.finish_reason.as_str(),
            "stats": {
                "load_s": load_s,
                "ttft_ms": st.ttft_s * 1e3,
                "prefill_tok_s": st.prompt_tokens as f64 / st.prefill_s.max(1e-9),
                "decode_tok_s": if st.decode_tokens > 0 { st.decode_tokens as f64 / st.decode_s.max(1e-9) } else { 0.0 },
                "drafted_tokens": st.drafted_tokens,
            }
        });
        let mut v = v;
        v["stats"]["placement"] = json!({
            "threads": rayon::current_num_threads(),
            "prefetch": placed.prefetch_mode(),
            "direct": placed.direct,
        });
        if let Some(serde_json::Value::Object(e)) = experts {
            if let Some(serde_json::Value::Object(stats)) = v.get_mut("stats") {
                stats.extend(e);
            }
        }
        let _ = writeln!(out, "{v}");
    } else {
        eprintln!(
            "[{} prompt tokens, {} generated, finish={}, prefill {:.1} tok/s, decode {:.1} tok/s, load {:.2}s]",
            st.prompt_tokens,
            g.generated_ids.len(),
            g.finish_reason.as_str(),
            st.prompt_tokens as f64 / st.prefill_s.max(1e-9),
            st.decode_tokens as f64 / st.decode_s.max(1e-9),
            load_s
        );
        if let Some(e) = experts {
            eprintln!(
                "[experts while decoding: cache hit rate {:.1}%, prefetched {:.1}% ({} misses), {:.1} MB read per token at {:.0} MB/s; {} cached ({} per layer), {} pinned]",
                e["expert_hit_rate"].as_f64().unwrap_or(0.0) * 100.0,
                e["prefetch_hit_rate"].as_f64().unwrap_or(0.0) * 100.0,
                e["expert_misses"],
                e["disk_bytes_per_token"].as_f64().unwrap_or(0.0) / 1e6,
                e["disk_mb_s"].as_f64().unwrap_or(0.0),
                e["experts_cached"],
                e["cap_per_layer"],
                e["experts_pinned"],
            );
        }
    }
    Ok(())
}

fn cmd_eval(a: EvalArgs) -> Result<(), String> {
    let (_dir, model, _placed, _load_s) = load(&a.m)?;
    let ids = &a.ids;
    let vocab = model.info.vocab_size;
    let mut session = Session::new(&model, ids.len());
    let logits = session.forward(ids, true).map_err(|e| e.to_string())?;
    let tf_pred: Vec<u32> = logits
        .chunks_exact(vocab)
        .map(coli_models::sampling::argmax)
        .collect();
    let nll = if ids.len() > 1 {
        let total: f64 = (0..ids.len() - 1)
            .map(|p| {
                let row = &logits[p * vocab..(p + 1) * vocab];
                coli_models::sampling::log_sum_exp(row) - row[ids[p + 1] as usize] as f64
            })
            .sum();
        total / (ids.len() - 1) as f64
    } else {
        0.0
    };
    if let Some(path) = &a.logits_out {
        coli_core::write::write_atomic(path, |w| {
            for v in logits {
                w.write_all(&v.to_le_bytes())?;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    }
    let v = json!({"tf_pred": tf_pred, "nll": nll, "positions": ids.len(), "vocab_size": vocab});
    if a.json {
        println!("{v}");
    } else {
        println!("tf_pred: {tf_pred:?}\nnll: {nll:.6}");
    }
    Ok(())
}

/// `--model`, else the demo model (fetched on first use).
fn dir_or_demo(model: Option<PathBuf>) -> Result<PathBuf, String> {
    match model {
        Some(d) => Ok(d),
        None => coli_models::demo::ensure_demo_model(progress_bar("demo model"))
            .map_err(|e| e.to_string()),
    }
}

/// `--ram GB` in bytes.
fn ram_arg(ram: Option<f64>) -> Result<Option<u64>, String> {
    match ram {
        Some(x) if x.is_finite() && x > 0.0 => Ok(Some((x * GB) as u64)),
        Some(x) => Err(format!("--ram must be a positive number of GB, got {x}")),
        None => Ok(None),
    }
}

fn cmd_tune(a: TuneArgs) -> Result<(), String> {
    let dir = dir_or_demo(a.model)?;
    if a.tokens < 2 || a.runs == 0 || !(a.min_gain.is_finite() && a.min_gain >= 0.0) {
        return Err("--tokens must be at least 2, --runs at least 1, --min-gain >= 0".into());
    }
    let cache = match a.cap {
        Some(0) => return Err("--cap must be at least 1".into()),
        Some(n) => CacheSize::Slots(n),
        None => {
            let req = coli_plan::plan::PlanRequest {
                ram: None,
                ctx: 4096,
                kv_slots: 1,
            };
            match coli_plan::plan::plan(&dir, &req, false) {
                Ok(p) if p.moe_layers > 0 => CacheSize::Slots(p.cap_per_layer.max(1)),
                _ => CacheSize::Auto,
            }
        }
    };
    let prompt = a
        .prompt_ids
        .unwrap_or_else(|| (0..16).map(|i| 1 + i * 7).collect());
    let (profile, trials) =
        coli_plan::tune::tune(&dir, cache, &prompt, a.tokens, a.runs, a.min_gain, |msg| {
            eprintln!("tune: {msg}")
        })?;
    if a.json {
        println!(
            "{}",
            json!({"version": 1, "profile": profile, "trials": trials})
        );
    } else {
        for t in &trials {
            println!(
                "{:>8.2} tok/s  threads {} prefetch {:<5} direct {:<5} pin {:.2} GB {}",
                t.tok_s,
                t.settings.threads,
                t.settings.prefetch,
                t.settings.direct,
                t.settings.pin_gb,
                if t.same_tokens {
                    ""
                } else {
                    "DISQUALIFIED: tokens differ"
                }
            );
        }
        println!(
            "profile {}: threads {} prefetch {} direct {} ({:.2} vs baseline {:.2} tok/s); applied by coli run --auto-tier",
            profile.fingerprint,
            profile.settings.threads,
            profile.settings.prefetch,
            profile.settings.direct,
            profile.tuned_tok_s,
            profile.baseline_tok_s
        );
    }
    Ok(())
}

fn cmd_plan(a: PlanArgs) -> Result<(), String> {
    let dir = dir_or_demo(a.model)?;
    let ram = ram_arg(a.ram)?;
    if a.ctx == 0 || a.kv_slots == 0 {
        return Err("--ctx and --kv-slots must be at least 1".into());
    }
    let req = coli_plan::plan::PlanRequest {
        ram,
        ctx: a.ctx,
        kv_slots: a.kv_slots,
    };
    let p = coli_plan::plan::plan(&dir, &req, a.reprobe)?;
    if a.json {
        println!("{}", serde_json::to_string(&p).map_err(|e| e.to_string())?);
        return Ok(());
    }
    let gb = |b: u64| format!("{:.2} GB", b as f64 / 1e9);
    println!(
        "{} ({}) in {} of RAM:",
        p.family,
        p.model_type,
        gb(p.ram_bytes)
    );
    println!(
        "  resident {}: weights {}, KV {} ({} x {} positions), working {}, runtime {}",
        gb(p.resident_bytes),
        gb(p.resident_weight_bytes),
        gb(p.kv_bytes),
        a.kv_slots,
        a.ctx,
        gb(p.working_bytes),
        gb(p.runtime_reserve_bytes)
    );
    if p.moe_layers > 0 {
        println!(
            "  experts: {} layers x {} of {} each; cache {} = {} slots per layer; projected hit rate {:.1}% ({})",
            p.moe_layers,
            p.experts_per_layer,
            gb(p.expert_bytes),
            gb(p.expert_cache_bytes),
            p.cap_per_layer,
            p.projected_hit_rate * 100.0,
            p.hit_rate_basis
        );
    }
    println!(
        "  per token: {} from RAM at {:.1} GB/s, {} from disk at {}; bottleneck: {}",
        gb(p.ram_bytes_per_token),
        p.probe.memory_gb_s,
        gb(p.disk_bytes_per_token),
        p.probe
            .disk_gb_s
            .map_or("unknown".to_string(), |d| format!("{d:.2} GB/s")),
        p.bottleneck
    );
    match p.projected_decode_tok_s {
        Some(t) => println!("  projected decode: {t:.2} tok/s"),
        None => println!("  projected decode: none"),
    }
    if !p.settings.is_empty() {
        println!("  settings: coli run {}", p.settings.join(" "));
    }
    for n in &p.notes {
        println!("  note: {n}");
    }
    if !p.fits {
        return Err("the model does not fit in this budget".into());
    }
    Ok(())
}

/// `cmd_doctor`'s way of asking for exit code 1 (errors found, already reported).
const DOCTOR_FOUND_ERRORS: &str = "\u{0}doctor-found-errors";

fn cmd_doctor(a: DoctorArgs) -> Result<(), String> {
    use coli_plan::doctor::{run, Status};
    let dir = dir_or_demo(a.model)?;
    let ram = ram_arg(a.ram)?;
    let checks = run(&dir, a.deep, ram);
    let worst = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
    if a.json {
        println!(
            "{}",
            json!({"version": 1, "model": dir.display().to_string(), "status": worst, "checks": checks})
        );
    } else {
        for c in &checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warning => "warn",
                Status::Error => "FAIL",
            };
            println!("{tag} {:<10} {}", c.id, c.summary);
        }
    }
    if worst == Status::Error {
        Err(DOCTOR_FOUND_ERRORS.into())
    } else {
        Ok(())
    }
}

fn cmd_convert(a: ConvertArgs) -> Result<(), String> {
    use coli_models::convert::{convert, ConvertOptions, Target};
    let experts = Target::parse(&a.experts)
        .ok_or_else(|| format!("--experts takes int4, int8 or bf16, got {:?}", a.experts))?;
    let dense = match Target::parse(&a.dense) {
        Some(t @ (Target::Bf16 | Target::Int8)) => t,
        _ => return Err(format!("--dense takes bf16 or int8, got {:?}", a.dense)),
    };
    if !(a.shard_gb.is_finite() && a.shard_gb > 0.0) {
        return Err(format!("--shard-gb must be positive, got {}", a.shard_gb));
    }
    let opts = ConvertOptions {
        experts,
        dense,
        shard_bytes: (a.shard_gb * GB) as u64,
    };
    let mut bar = progress_bar("convert (%)");
    let mut shown = None;
    convert(&a.model, &a.out, &opts, |done, total| {
        let pct = (done * 100 / total.max(1)) as usize;
        if shown != Some(pct) {
            shown = Some(pct);
            bar(pct, 100);
        }
    })
    .map_err(|e| e.to_string())?;
    eprintln!("converted {} -> {}", a.model.display(), a.out.display());
    Ok(())
}

fn cmd_info(a: InfoArgs) -> Result<(), String> {
    match a.model {
        None => {
            println!("supported model types:");
            for f in registry::FAMILIES {
                println!(
                    "  {:<22} {:<12} {:?}",
                    f.model_types.join(", "),
                    f.display_name,
                    f.capabilities
                );
            }
            println!(
                "weight formats: f32, bf16, f16; float8_e4m3fn with block scales \
                 (quantization_config.weight_block_size, weight_scale_inv)"
            );
        }
        Some(dir) => {
            let model = registry::load(&dir).map_err(|e| e.to_string())?;
            println!("{:#?}", model.info);
        }
    }
    Ok(())
}
