//! The management commands: `plan`, `tune`, `doctor`, `convert`, `info`, `import-gguf`.

use coli_models::experts::CacheSize;
use serde_json::json;

use crate::args::*;
use crate::{dir_or_demo, progress_bar, Outcome};

const GB: f64 = 1e9;

/// `--ram GB` in bytes.
fn ram_arg(ram: Option<f64>) -> Result<Option<u64>, String> {
    match ram {
        Some(x) if x.is_finite() && x > 0.0 => Ok(Some((x * GB) as u64)),
        Some(x) => Err(format!("--ram must be a positive number of GB, got {x}")),
        None => Ok(None),
    }
}

pub(crate) fn tune(a: TuneArgs) -> Outcome {
    let dir = dir_or_demo(a.model)?;
    if a.tokens < 2 || a.runs == 0 || !(a.min_gain.is_finite() && a.min_gain >= 0.0) {
        return Err("--tokens must be at least 2, --runs at least 1, --min-gain >= 0".into());
    }
    let cache = match a.cap {
        Some(0) => return Err("--cap must be at least 1".into()),
        Some(n) => CacheSize::Slots(n),
        None => coli_plan::tier::planned_cache(&dir),
    };
    let prompt = a
        .prompt_ids
        .unwrap_or_else(|| (0..16).map(|i| 1 + i * 7).collect());
    let (profile, trials) =
        coli_plan::tune::tune(&dir, cache, &prompt, a.tokens, a.runs, a.min_gain, |msg| {
            eprintln!("tune: {msg}")
        })
        .map_err(|e| e.to_string())?;
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
    Ok(0)
}

pub(crate) fn plan(a: PlanArgs) -> Outcome {
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
    let p = coli_plan::plan::plan(&dir, &req, a.reprobe).map_err(|e| e.to_string())?;
    if a.json {
        println!("{}", serde_json::to_string(&p).map_err(|e| e.to_string())?);
        return Ok(0);
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
    Ok(0)
}

pub(crate) fn doctor(a: DoctorArgs) -> Outcome {
    use coli_plan::doctor::{run, Status};
    let dir = dir_or_demo(a.model)?;
    let ram = ram_arg(a.ram)?;
    let checks = run(&dir, a.deep, ram);
    let worst = coli_plan::doctor::worst(&checks);
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
    Ok(coli_plan::doctor::exit_code(&checks))
}

pub(crate) fn convert(a: ConvertArgs) -> Outcome {
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
    let report = convert(&a.model, &a.out, &opts, |done, total| {
        let pct = (done * 100 / total.max(1)) as usize;
        if shown != Some(pct) {
            shown = Some(pct);
            bar(pct, 100);
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(first) = report.fused_experts_kept.first() {
        eprintln!(
            "note: {} tensors hold every expert of a layer (e.g. {first}); they are kept as stored, --experts {} applies to per-expert tensors only",
            report.fused_experts_kept.len(),
            a.experts
        );
    }
    eprintln!("converted {} -> {}", a.model.display(), a.out.display());
    Ok(0)
}

pub(crate) fn info(a: InfoArgs) -> Outcome {
    match a.model {
        None => {
            println!("supported model types:");
            for f in coli_models::families::FAMILIES {
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
            let model = coli_models::families::load(&dir).map_err(|e| e.to_string())?;
            println!("{:#?}", model.info);
        }
    }
    Ok(0)
}

pub(crate) fn import_gguf(a: ImportArgs) -> Outcome {
    coli_models::gguf_import::import_gguf(&a.gguf, &a.out, progress_bar("import"))
        .map_err(|e| e.to_string())?;
    Ok(0)
}
