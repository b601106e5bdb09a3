//! `coli run` and `coli eval`: build a request from the flags, hand it to the engine,
//! print what comes back.

use std::io::Write;
use std::path::{Path, PathBuf};

use coli_models::generate::{Completion, ExpertRunStats};
use coli_models::tokenizer::ChatMessage;
use coli_models::{Engine, GenerateRequest, MtpDrafting, OutputConstraint, Prompt, SamplingParams};
use serde_json::json;

use crate::args::{DraftArg, EvalArgs, ModelArg, RunArgs};
use crate::Outcome;

/// Resolves the placement and opens the engine, its MTP layer ready for `mtp`.
pub(crate) fn open(m: &ModelArg, mtp: MtpDrafting) -> Result<Engine, String> {
    let dir = crate::dir_or_demo(m.model.clone())?;
    let placement =
        coli_plan::tier::resolve(&m.placement_flags(), &dir).map_err(|e| e.to_string())?;
    let engine = Engine::open_drafting(&dir, &placement, mtp).map_err(|e| e.to_string())?;
    for n in &engine.model().info.notes {
        eprintln!("coli: note: {n}");
    }
    Ok(engine)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The request the flags describe, and the file a constraint came from.
fn request(a: &RunArgs) -> Result<(GenerateRequest, Option<&PathBuf>), String> {
    let prompt = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => Prompt::Ids(ids.clone()),
        (None, text) => {
            let text = text
                .clone()
                .unwrap_or_else(|| "The capital of France is".into());
            if a.chat {
                Prompt::Chat(vec![ChatMessage::new("user", text)])
            } else {
                Prompt::Text(text)
            }
        }
    };
    let (constraint, source) = match (&a.grammar, &a.json_schema) {
        (Some(p), _) => (OutputConstraint::Gbnf(read(p)?), Some(p)),
        (None, Some(p)) => (OutputConstraint::JsonSchema(read(p)?), Some(p)),
        (None, None) => (OutputConstraint::None, None),
    };
    let req = GenerateRequest {
        prompt,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        max_tokens: a.max_tokens,
        ignore_eos: a.ignore_eos,
        constraint,
        drafts: !a.no_drafts && a.drafts.draft != DraftArg::Off,
        lookup: a.drafts.lookup(),
        mtp: a.drafts.mtp(),
        mtp_depth: a.drafts.mtp_depth as usize,
    };
    Ok((req, source))
}

pub(crate) fn run(a: RunArgs) -> Outcome {
    let engine = open(&a.m, a.drafts.mtp())?;
    let (req, source) = request(&a)?;
    a.drafts.note_without_mtp(&engine);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let done = engine.generate(&req, |_, piece| {
        let _ = out.write_all(piece.as_bytes());
        let _ = out.flush();
    });
    let done = done.map_err(|e| match (e, source) {
        (coli_models::ModelError::Constraint(msg), Some(p)) => format!("{}: {msg}", p.display()),
        (e, _) => e.to_string(),
    })?;
    let _ = writeln!(out);
    for w in &done.constraint_warnings {
        eprintln!("coli: warning: {w}");
    }
    if !a.m.no_usage {
        if let Err(e) = engine.save_usage() {
            eprintln!(
                "coli: note: routing history not saved in {}: {e}",
                engine.dir().display()
            );
        }
    }
    if a.json {
        let _ = writeln!(out, "{}", run_json(&engine, &done));
    } else {
        print_summary(&engine, &done);
    }
    match &done.schema_violation {
        Some(v) => Err(v.clone()),
        None => Ok(0),
    }
}

/// `coli run --json`'s last line.
fn run_json(engine: &Engine, g: &Completion) -> serde_json::Value {
    let mut v = json!({
        "prompt_ids": g.prompt_ids,
        "generated_ids": g.generated_ids,
        "text": g.text,
        "finish_reason": g.finish_reason.as_str(),
        "stats": {
            "load_s": engine.load_s(),
            "ttft_ms": g.stats.ttft_s * 1e3,
            "prefill_tok_s": g.prefill_tok_s(),
            "decode_tok_s": g.decode_tok_s(),
            "drafted_tokens": g.stats.drafted_tokens,
            "draft_proposed": g.stats.draft_proposed,
            "draft_forwards": g.stats.draft_forwards,
            "draft_acceptance": g.stats.drafted_tokens as f64 / g.stats.draft_proposed.max(1) as f64,
            "fast_int8": coli_kernels::fast::int8_activations(),
            "placement": {
                "threads": rayon::current_num_threads(),
                "prefetch": engine.placement().prefetch.as_str(),
                "direct": engine.reads_direct(),
            },
        }
    });
    if let (Some(e), Some(serde_json::Value::Object(stats))) = (&g.experts, v.get_mut("stats")) {
        if let serde_json::Value::Object(e) = expert_json(e) {
            stats.extend(e);
        }
    }
    v
}

/// The expert-store figures under the names `coli run --json` documents.
fn expert_json(e: &ExpertRunStats) -> serde_json::Value {
    let d = &e.decode;
    json!({
        "expert_hit_rate": e.hit_rate,
        "prefetch_hit_rate": e.prefetch_hit_rate,
        "expert_hits": d.hits - d.prefetch_hits,
        "prefetch_hits": d.prefetch_hits,
        "expert_misses": d.misses,
        "prefetches": d.prefetches,
        "wasted_prefetches": d.wasted_prefetches,
        "speculative_prefetches": d.speculative,
        "speculation_skipped": d.speculation_skipped,
        "disk_bytes_per_token": e.disk_bytes_per_token,
        "disk_mb_s": e.disk_mb_s,
        "read_mb_s": e.read_mb_s,
        "prefetch_wait_ms": d.wait_ns as f64 * 1e-6,
        "prefill_disk_bytes": e.prefill_disk_bytes,
        "disk_bytes": e.disk_bytes,
        "experts_pinned": e.pinned,
        "experts_cached": e.cached,
        "cap_per_layer": e.cap_per_layer,
    })
}

fn print_summary(engine: &Engine, g: &Completion) {
    let st = &g.stats;
    eprintln!(
        "[{} prompt tokens, {} generated, finish={}, prefill {:.1} tok/s, decode {:.1} tok/s, load {:.2}s]",
        st.prompt_tokens,
        g.generated_ids.len(),
        g.finish_reason.as_str(),
        g.prefill_tok_s(),
        st.decode_tokens as f64 / st.decode_s.max(1e-9),
        engine.load_s()
    );
    if st.draft_proposed > 0 {
        eprintln!(
            "[drafts: {} of {} proposed tokens accepted ({:.0}%) in {} batched forwards]",
            st.drafted_tokens,
            st.draft_proposed,
            100.0 * st.drafted_tokens as f64 / st.draft_proposed as f64,
            st.draft_forwards
        );
    }
    if let Some(e) = &g.experts {
        eprintln!(
            "[experts while decoding: cache hit rate {:.1}%, prefetched {:.1}% ({} misses), {:.1} MB read per token at {:.0} MB/s; {} cached ({} per layer), {} pinned]",
            e.hit_rate * 100.0,
            e.prefetch_hit_rate * 100.0,
            e.decode.misses,
            e.disk_bytes_per_token / 1e6,
            e.disk_mb_s,
            e.cached,
            e.cap_per_layer,
            e.pinned,
        );
    }
}

pub(crate) fn eval(a: EvalArgs) -> Outcome {
    let engine = open(&a.m, MtpDrafting::Off)?;
    let vocab = engine.model().info.vocab_size;
    let ev = engine.evaluate(&a.ids).map_err(|e| e.to_string())?;
    if let Some(path) = &a.logits_out {
        coli_core::write::write_atomic(path, |w| {
            for v in &ev.logits {
                w.write_all(&v.to_le_bytes())?;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    }
    let (tf_pred, nll) = (&ev.tf_pred, ev.nll);
    if a.json {
        let v =
            json!({"tf_pred": tf_pred, "nll": nll, "positions": a.ids.len(), "vocab_size": vocab});
        println!("{v}");
    } else {
        println!("tf_pred: {tf_pred:?}\nnll: {nll:.6}");
    }
    Ok(0)
}
