//! Expert placement and usage history, `coli convert`, `doctor`, the analysis cache,
//! `plan` and `tune` through the binary.

use std::path::Path;
use std::process::Command;

use coli_tests::{ids, Reference, TINY_FIXTURES};
use serde_json::Value;

use crate::cli::{
    coli, coli_usage, copy_fixture, csv, expect_error, last_json, output_ok, path_str,
};

/// The expert store through the CLI: stats in --json, the routing history written to the
/// model directory, placement flags that do not change the tokens, bad values refused.
#[test]
fn expert_placement_flags_stats_and_usage_history() {
    let r = Reference::load("olmoe_gqa_clip");
    let t = copy_fixture("olmoe_gqa_clip");
    let want = ids(&r.json["greedy"]);
    let n = want.len().to_string();
    let prompt = csv(&ids(&r.json["greedy_prompt"]));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            path_str(t.path()),
            "--prompt-ids",
            &prompt,
            "--max-tokens",
            &n,
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = coli_usage(&args, true);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        last_json(&out)
    };
    for extra in [
        &["--cap", "1"][..],
        &["--cap", "2", "--prefetch", "off"],
        &["--expert-cache", "0.000001", "--direct"],
        &["--expert-cache", "all"],
        &["--expert-cache", "off"],
        &["--cap", "1", "--pin", "0.001"],
    ] {
        let v = run(extra);
        assert_eq!(ids(&v["generated_ids"]), want, "{extra:?}");
        if extra[1] != "off" {
            let s = &v["stats"];
            let rate = s["expert_hit_rate"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&rate), "{extra:?}: {s}");
            assert!(s["disk_bytes_per_token"].as_f64().unwrap() >= 0.0);
            assert!(s["experts_cached"].as_u64().is_some());
        }
    }
    let v = run(&["--cap", "1", "--prefetch", "off"]);
    assert!(v["stats"]["expert_misses"].as_u64().unwrap() > 0);
    // The runs above left a routing history: version line, then layer expert count.
    let hist = std::fs::read_to_string(t.path().join(".coli_usage")).unwrap();
    let u = coli_models::experts::usage::parse(&hist).expect("valid history");
    assert_eq!(u.keys().map(|k| k.0).max(), Some(1));
    // --no-usage leaves it alone.
    run(&["--cap", "1", "--no-usage"]);
    assert_eq!(
        std::fs::read_to_string(t.path().join(".coli_usage")).unwrap(),
        hist
    );
    for (flags, needle) in [
        (&["--cap", "0"][..], "--cap must be at least 1"),
        (
            &["--expert-cache", "lots"],
            "--expert-cache takes a number of GB",
        ),
        (
            &["--expert-cache=-1"],
            "must be a non-negative number of GB",
        ),
        (&["--pin=-2"], "--pin must be a non-negative number of GB"),
        (
            &["--prefetch", "maybe"],
            "--prefetch takes on, layer or off",
        ),
    ] {
        let mut args = vec!["run", "--model", path_str(t.path()), "--prompt-ids", "1,2"];
        args.extend_from_slice(flags);
        expect_error(&args, needle);
    }
}

/// `coli convert` killed mid-way leaves no OUT at all (shards go to a partial sibling
/// directory first); the next convert to the same place clears the leftovers and succeeds.
#[test]
fn an_interrupted_convert_leaves_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let spec = coli_tests::synthetic::OlmoeSpec {
        layers: 12,
        experts: 32,
        hidden: 256,
        inter: 512,
        ..coli_tests::synthetic::OlmoeSpec::small()
    };
    coli_tests::synthetic::write_olmoe(&src, &spec, |_, _| {}).unwrap();
    let out = tmp.path().join("out");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_coli"))
        .args([
            "convert",
            "--model",
            path_str(&src),
            "--out",
            path_str(&out),
        ])
        .args(["--experts", "int4", "--shard-gb", "0.005"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let partial = tmp.path().join(format!(".out.coli-partial-{}", child.id()));
    let t0 = std::time::Instant::now();
    loop {
        let shards = std::fs::read_dir(&partial)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("model-"))
                    .count()
            })
            .unwrap_or(0);
        if shards > 0 {
            break;
        }
        assert!(t0.elapsed().as_secs() < 60, "no shard appeared");
        assert!(
            child.try_wait().unwrap().is_none(),
            "convert finished before the kill"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.exists(), "a killed convert left {}", out.display());
    assert!(partial.exists());
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_coli"))
        .args([
            "convert",
            "--model",
            path_str(&src),
            "--out",
            path_str(&out),
        ])
        .args(["--experts", "int4", "--shard-gb", "0.05"])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        !partial.exists(),
        "the stale partial directory was not cleared"
    );
    assert!(out.join("config.json").is_file());
    // It loads and runs like any checkpoint.
    let o = coli(&[
        "run",
        "--model",
        path_str(&out),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "3",
        "--no-usage",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // And refuses to write over it.
    expect_error(
        &[
            "convert",
            "--model",
            path_str(&src),
            "--out",
            path_str(&out),
        ],
        "refusing to overwrite",
    );
}

/// `coli doctor`: every check passes on a good sharded model; a corrupted header, a missing
/// shard, a gap in the shard numbering and an index that disagrees each fail their own
/// check with exit code 1; bad arguments exit 2.
#[test]
fn doctor_names_the_failing_check() {
    let doctor = |dir: &Path| {
        let out = coli(&["doctor", "--model", path_str(dir), "--deep", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code(), v)
    };
    let status_of = |v: &Value, id: &str| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .map(|c| c["status"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let t = copy_fixture("deepseek_v3_no_q_lora");
    let (code, v) = doctor(t.path());
    assert_eq!(code, Some(0), "{v}");
    for id in [
        "config",
        "family",
        "shards",
        "ram",
        "writable",
        "headers",
        "numbering",
        "index",
        "tensors",
    ] {
        assert_eq!(status_of(&v, id), "ok", "{id}: {v}");
    }
    let shard = |d: &Path, i: usize| d.join(format!("model-{i:05}-of-00004.safetensors"));
    // A corrupted header.
    let t = copy_fixture("deepseek_v3_no_q_lora");
    let mut bytes = std::fs::read(shard(t.path(), 2)).unwrap();
    bytes[8] = b'#';
    std::fs::write(shard(t.path(), 2), bytes).unwrap();
    let (code, v) = doctor(t.path());
    assert_eq!(code, Some(1));
    assert_eq!(status_of(&v, "headers"), "error", "{v}");
    // A missing shard.
    let t = copy_fixture("deepseek_v3_no_q_lora");
    std::fs::remove_file(shard(t.path(), 3)).unwrap();
    let (code, v) = doctor(t.path());
    assert_eq!(code, Some(1));
    assert_eq!(status_of(&v, "shards"), "error", "{v}");
    // A gap in the numbering (no index; shard 3 renamed to 5).
    let t = copy_fixture("deepseek_v3_no_q_lora");
    std::fs::remove_file(t.path().join("model.safetensors.index.json")).unwrap();
    std::fs::rename(shard(t.path(), 3), shard(t.path(), 5)).unwrap();
    let (code, v) = doctor(t.path());
    assert_eq!(code, Some(1));
    assert_eq!(status_of(&v, "numbering"), "error", "{v}");
    assert_eq!(status_of(&v, "tensors"), "ok", "{v}");
    // An index that puts a tensor in the wrong shard.
    let t = copy_fixture("deepseek_v3_no_q_lora");
    edit_index(t.path());
    let (code, v) = doctor(t.path());
    assert_eq!(code, Some(1));
    assert_eq!(status_of(&v, "index"), "error", "{v}");
    expect_error(
        &["doctor", "--model", path_str(t.path()), "--ram=-3"],
        "--ram must be a positive",
    );
    let out = coli(&["doctor", "--bogus"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Moves the first weight_map entry to another shard.
fn edit_index(dir: &Path) {
    let p = dir.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let map = v["weight_map"].as_object_mut().unwrap();
    let (name, file) = map
        .iter()
        .next()
        .map(|(k, f)| (k.clone(), f.as_str().unwrap().to_string()))
        .unwrap();
    let other = if file.contains("00001") {
        "model-00002-of-00004.safetensors"
    } else {
        "model-00001-of-00004.safetensors"
    };
    map.insert(name, other.into());
    std::fs::write(&p, v.to_string()).unwrap();
}

/// Many processes analysing the same model at once (each writes the sidecar) leave one
/// valid `.coli_analysis.json` and no temp files.
#[test]
fn concurrent_processes_leave_one_valid_analysis_cache() {
    let t = copy_fixture("glm4_moe_group_mtp");
    for _ in 0..3 {
        let _ = std::fs::remove_file(t.path().join(".coli_analysis.json"));
        let children: Vec<_> = (0..6)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_coli"))
                    .args(["doctor", "--model", path_str(t.path())])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().code().is_some_and(|c| c <= 1));
        }
        let (_, outcome) = coli_plan::analyze(t.path()).unwrap();
        assert_eq!(outcome, coli_plan::CacheOutcome::Hit);
        let leftovers: Vec<String> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

/// `coli plan --ram 1 --ctx CTX --json` on `dir`, which must succeed.
fn plan_json(dir: &Path, ctx: &str) -> Value {
    let args = [
        "plan",
        "--model",
        path_str(dir),
        "--ram",
        "1",
        "--ctx",
        ctx,
        "--json",
    ];
    let out = coli(&args);
    assert!(
        out.status.success(),
        "{}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    last_json(&out)
}

/// `coli plan`: a versioned JSON plan; a budget below the resident need exits 2 with the
/// reason; bad arguments are refused.
#[test]
fn plan_reports_and_refuses() {
    let t = copy_fixture("deepseek_v3_group_yarn");
    let v = plan_json(t.path(), "128");
    assert_eq!(v["version"], 2);
    assert_eq!(v["family"], "DeepSeek-V3");
    assert_eq!(v["fits"], true);
    assert_eq!(v["cap_per_layer"], v["experts_per_layer"]);
    assert!(v["projected_decode_tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["probe"]["memory_gb_s"].as_f64().unwrap() > 0.0);
    let out = coli(&["plan", "--model", path_str(t.path()), "--ram", "0.000001"]);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("needs at least"), "{text}");
    expect_error(
        &["plan", "--model", path_str(t.path()), "--ctx", "0"],
        "--ctx and --kv-slots must be at least 1",
    );
    expect_error(
        &["plan", "--model", path_str(t.path()), "--ram=-1"],
        "--ram must be a positive",
    );
}

/// The probe's kernel rates belong to the build that measured them: a cached probe of
/// this build is reused as it is, one another build wrote is measured again (an upgraded
/// coli does not project from its predecessor's kernels).
#[test]
fn kernel_rates_are_measured_again_by_another_build() {
    let t = copy_fixture("llama_gqa");
    let cache = tempfile::tempdir().unwrap();
    let file = cache.path().join("probe.json");
    let plan = || {
        let out = output_ok(
            Command::new(env!("CARGO_BIN_EXE_coli"))
                .args([
                    "plan",
                    "--model",
                    path_str(t.path()),
                    "--ram",
                    "1",
                    "--json",
                ])
                .env("COLI_CACHE_DIR", cache.path())
                .env("COLI_NO_USAGE", "1")
                .env_remove("COLI_MODEL"),
        );
        last_json(&out)["probe"].clone()
    };
    let first = plan();
    let build = first["kernels_build"].as_str().unwrap().to_string();
    assert!(build.contains("coli"), "{build}");
    let rewrite = |rate: f64, build: &str| {
        let mut p: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        for v in p["kernel_gb_s"].as_object_mut().unwrap().values_mut() {
            *v = rate.into();
        }
        p["kernels_build"] = build.into();
        std::fs::write(&file, serde_json::to_vec(&p).unwrap()).unwrap();
    };
    rewrite(1e-6, &build);
    assert_eq!(
        plan()["kernel_gb_s"]["BF16"],
        1e-6,
        "this build's rates are reused"
    );
    rewrite(1e-6, "another build");
    let again = plan();
    assert!(
        again["kernel_gb_s"]["BF16"].as_f64().unwrap() > 1e-3,
        "{again}"
    );
    assert_eq!(again["kernels_build"], build.as_str());
    assert_eq!(
        again["memory_gb_s"], first["memory_gb_s"],
        "the memory rate is the machine's"
    );
}

/// `coli tune` saves a profile under $XDG_CONFIG_HOME/coli/tuning/<fingerprint>.json whose
/// trials all kept the baseline's tokens; `coli run --auto-tier` applies it (explicit
/// flags win); touching the model's files changes the fingerprint, so the profile no
/// longer applies.
#[test]
fn tune_saves_a_profile_that_auto_tier_applies() {
    let t = copy_fixture("olmoe_gqa_clip");
    let cfg = tempfile::tempdir().unwrap();
    let with_cfg = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_coli"))
            .args(args)
            .env("XDG_CONFIG_HOME", cfg.path())
            .env("COLI_NO_USAGE", "1")
            .env_remove("COLI_MODEL")
            .output()
            .unwrap()
    };
    // A routing history first, so the cache split is among the candidates.
    let o = coli_usage(
        &[
            "run",
            "--model",
            path_str(t.path()),
            "--prompt-ids",
            "1,2,3,4",
            "--max-tokens",
            "8",
        ],
        true,
    );
    assert!(o.status.success());
    let out = with_cfg(&[
        "tune",
        "--model",
        path_str(t.path()),
        "--tokens",
        "6",
        "--runs",
        "1",
        "--cap",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = last_json(&out);
    let trials = v["trials"].as_array().unwrap();
    assert!(trials.len() >= 30, "{}", trials.len());
    assert!(trials
        .iter()
        .any(|t| t["settings"]["pin_gb"].as_f64().unwrap() > 0.0));
    assert!(trials.iter().all(|t| t["same_tokens"] == true), "{v}");
    let fp = v["profile"]["fingerprint"].as_str().unwrap().to_string();
    let saved = cfg.path().join(format!("coli/tuning/{fp}.json"));
    assert!(saved.is_file());
    // Pin the profile to something recognisable and check --auto-tier applies it.
    let mut p: Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    p["settings"] =
        serde_json::json!({"threads": 1, "prefetch": "layer", "direct": true, "pin_gb": 0.0});
    std::fs::write(&saved, p.to_string()).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            path_str(t.path()),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "3",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = with_cfg(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        last_json(&out)["stats"]["placement"].clone()
    };
    assert_eq!(
        run(&["--auto-tier"]),
        serde_json::json!({"threads": 1, "prefetch": "layer", "direct": true})
    );
    assert_eq!(
        run(&["--auto-tier", "--prefetch", "off", "--threads", "2"]),
        serde_json::json!({"threads": 2, "prefetch": "off", "direct": true})
    );
    assert_eq!(run(&[])["prefetch"], "on");
    // A changed model file: the profile is for another revision.
    let f = std::fs::File::options()
        .write(true)
        .open(t.path().join("config.json"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(9))
        .unwrap();
    drop(f);
    assert_eq!(run(&["--auto-tier"])["prefetch"], "on");
}

/// `coli plan` and `coli doctor --deep` succeed on every oracle fixture.
#[test]
fn plan_and_deep_doctor_pass_on_every_fixture() {
    for name in TINY_FIXTURES {
        let t = copy_fixture(name);
        let v = plan_json(t.path(), "256");
        assert_eq!(v["fits"], true, "{name}");
        let out = coli(&["doctor", "--model", path_str(t.path()), "--deep", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}: {v}");
        assert_ne!(v["status"], "error", "{name}");
    }
}
