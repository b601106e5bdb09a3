//! GGUF through the binary: split parts (found beside the first or through
//! `COLI_MODEL_DIRS`), `doctor --deep` on a GGUF, and every kind of bad GGUF refused with a
//! clear error and exit code 2. The parts are written at test time from a committed
//! fixture, as `gguf-split` lays them out (`coli_core::fuzzing::split_gguf`).

use std::path::Path;
use std::process::Command;

use coli_core::fuzzing::{rewrite_gguf, split_gguf};
use coli_core::gguf::GgufValue;
use coli_tests::{compare_logits, floats, ids, Reference};
use serde_json::Value;

use crate::cli::{coli, csv, expect_error, last_json, path_str};

const FIXTURE: &str = "gguf_qwen3_moe_mixed";
const STEM: &str = "tiny-moe-Q4_K_M";

fn fixture_bytes() -> Vec<u8> {
    std::fs::read(Reference::load(FIXTURE).dir.join("model.gguf")).unwrap()
}

fn part_name(k: usize, n: usize) -> String {
    format!("{STEM}-{k:05}-of-{n:05}.gguf")
}

/// The fixture as `parts` written into `dir`, named `{STEM}-0000k-of-0000n.gguf`; the path
/// of the first.
fn write_parts(dir: &Path, parts: &[Vec<u8>]) -> std::path::PathBuf {
    for (k, p) in parts.iter().enumerate() {
        std::fs::write(dir.join(part_name(k + 1, parts.len())), p).unwrap();
    }
    dir.join(part_name(1, parts.len()))
}

/// `coli eval` on `model` matches the fixture's transformers logits.
fn eval_matches(model: &Path, envs: &[(&str, String)]) {
    eval_matches_fixture(FIXTURE, model, envs)
}

/// `coli eval` on `model` matches fixture `name`'s transformers logits.
fn eval_matches_fixture(name: &str, model: &Path, envs: &[(&str, String)]) {
    let r = Reference::load(name);
    let tmp = tempfile::tempdir().unwrap();
    let logits_path = tmp.path().join("logits.f32");
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["eval", "--model", path_str(model), "--ids", &csv(&r.ids())])
        .args(["--logits-out", path_str(&logits_path), "--json"])
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        ids(&last_json(&out)["tf_pred"]),
        ids(&r.json["tf_pred"]),
        "{}",
        model.display()
    );
    let got: Vec<f32> = std::fs::read(&logits_path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    compare_logits(
        &model.display().to_string(),
        &got,
        &r.logits,
        &floats(&r.json["top2_margin"]),
        r.vocab(),
        coli_tests::ORACLE_TOLERANCE,
    )
    .unwrap();
}

/// A GGUF split in three parts runs like the single file, named by its first part or by its
/// directory, with parts beside it or in `COLI_MODEL_DIRS`; `doctor --deep` passes on it.
#[test]
fn split_gguf_runs_like_the_single_file() {
    let parts = split_gguf(&fixture_bytes(), 3).unwrap();
    assert_eq!(parts.len(), 3);
    let t = tempfile::tempdir().unwrap();
    let first = write_parts(t.path(), &parts);
    eval_matches(&first, &[]);
    eval_matches(t.path(), &[]);
    // Parts 2 and 3 elsewhere, found through COLI_MODEL_DIRS.
    let elsewhere = tempfile::tempdir().unwrap();
    for k in [2, 3] {
        let n = part_name(k, 3);
        std::fs::rename(t.path().join(&n), elsewhere.path().join(&n)).unwrap();
    }
    let dirs = format!("/nonexistent:{}", elsewhere.path().display());
    eval_matches(&first, &[("COLI_MODEL_DIRS", dirs)]);
    for k in [2, 3] {
        let n = part_name(k, 3);
        std::fs::rename(elsewhere.path().join(&n), t.path().join(&n)).unwrap();
    }
    let (code, v) = doctor(&first);
    assert_eq!(code, Some(0), "{v}");
    for id in [
        "config",
        "family",
        "shards",
        "headers",
        "numbering",
        "tensors",
    ] {
        assert_eq!(status_of(&v, id), "ok", "{id}: {v}");
    }
    assert!(summary_of(&v, "shards").contains("3 GGUF part"), "{v}");
    // The analysis sidecar is named after the file, beside it, and nothing else is written.
    let names: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".gguf"))
        .collect();
    assert_eq!(
        names,
        [format!(".{}.coli_analysis.json", part_name(1, 3))],
        "{names:?}"
    );
}

fn doctor(model: &Path) -> (Option<i32>, Value) {
    let out = coli(&["doctor", "--model", path_str(model), "--deep", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), v)
}

fn check_of<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["id"] == id))
        .unwrap_or(&Value::Null)
}

fn status_of(v: &Value, id: &str) -> String {
    check_of(v, id)["status"].as_str().unwrap_or("").to_string()
}

fn summary_of(v: &Value, id: &str) -> String {
    check_of(v, id)["summary"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// `coli run --prompt-ids` on `model` fails with exit 2 and `needle` in the message.
fn expect_refused(model: &Path, needle: &str) {
    expect_error(
        &[
            "run",
            "--model",
            path_str(model),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2",
        ],
        needle,
    );
}

/// Missing, misnumbered and truncated parts, a part named instead of the first, two GGUFs
/// in one directory, an unknown architecture, a missing key, an unknown type and a
/// stacked-expert tensor of the wrong rank: each an error that names what is wrong, exit 2;
/// `doctor --deep` fails the check it belongs to.
#[test]
fn bad_gguf_files_are_refused_by_name() {
    let bytes = fixture_bytes();
    let parts = split_gguf(&bytes, 3).unwrap();
    // A missing part.
    let t = tempfile::tempdir().unwrap();
    let first = write_parts(t.path(), &parts);
    std::fs::remove_file(t.path().join(part_name(2, 3))).unwrap();
    expect_refused(
        &first,
        &format!("part 2 of 3 ({}) is missing", part_name(2, 3)),
    );
    let (code, v) = doctor(&first);
    assert_eq!(code, Some(1));
    assert_eq!(status_of(&v, "shards"), "error", "{v}");
    // A later part named instead of the first.
    let t = tempfile::tempdir().unwrap();
    write_parts(t.path(), &parts);
    expect_refused(
        &t.path().join(part_name(3, 3)),
        &format!("open the first part ({})", part_name(1, 3)),
    );
    // Parts swapped: part 2's file says it is part 3.
    let t = tempfile::tempdir().unwrap();
    let first = write_parts(t.path(), &parts);
    std::fs::write(t.path().join(part_name(2, 3)), &parts[2]).unwrap();
    std::fs::write(t.path().join(part_name(3, 3)), &parts[1]).unwrap();
    expect_refused(&first, "split.no = Some(2), expected 1");
    let (code, v) = doctor(&first);
    assert_eq!(code, Some(1));
    assert_eq!(status_of(&v, "numbering"), "error", "{v}");
    // A truncated last part: the error names the tensor whose data is cut.
    let t = tempfile::tempdir().unwrap();
    let first = write_parts(t.path(), &parts);
    let last = t.path().join(part_name(3, 3));
    std::fs::write(&last, &parts[2][..parts[2].len() - 100]).unwrap();
    expect_refused(&first, "runs past the end of the file");
    let (code, v) = doctor(&first);
    assert_eq!(code, Some(1));
    assert!(summary_of(&v, "numbering").contains("tensor \"blk."), "{v}");
    // The split count in the metadata disagrees with the names.
    let t = tempfile::tempdir().unwrap();
    let mut two = parts.clone();
    two.truncate(2);
    let first = write_parts(t.path(), &two);
    expect_refused(
        &first,
        "split.count = Some(3) but the file name says 2 parts",
    );
    // A directory with two GGUF models and no config.json.
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("a.gguf"), &bytes).unwrap();
    std::fs::write(t.path().join("b.gguf"), &bytes).unwrap();
    expect_refused(t.path(), "2 GGUF models (a.gguf, b.gguf)");
    // Damaged metadata, written as a single file.
    let damaged = |edit: &dyn Fn(&mut std::collections::BTreeMap<String, GgufValue>)| {
        let t = tempfile::tempdir().unwrap();
        let out = rewrite_gguf(&bytes, 1, edit).unwrap();
        std::fs::write(t.path().join("model.gguf"), &out[0]).unwrap();
        t
    };
    let t = damaged(&|m| {
        m.insert(
            "general.architecture".into(),
            GgufValue::Str("zeta9".into()),
        );
    });
    expect_refused(&t.path().join("model.gguf"), "zeta9");
    let t = damaged(&|m| {
        m.remove("qwen3moe.block_count");
    });
    expect_refused(&t.path().join("model.gguf"), "qwen3moe.block_count");
    let (code, v) = doctor(&t.path().join("model.gguf"));
    assert_eq!(code, Some(1));
    assert_eq!(status_of(&v, "config"), "error", "{v}");
    // Stacked experts that disagree with the expert count (one more than the file has).
    let t = damaged(&|m| {
        let n = m["qwen3moe.expert_count"].as_u64().unwrap();
        m.insert(
            "qwen3moe.expert_count".into(),
            GgufValue::Int(n as i128 + 1),
        );
    });
    expect_refused(&t.path().join("model.gguf"), "but qwen3moe.expert_count is");
    // An unknown ggml type id in the tensor directory: patch the first tensor's type.
    let (_, tensors) = coli_core::gguf::parse(&bytes).unwrap();
    let t = tempfile::tempdir().unwrap();
    let mut bad = bytes.clone();
    let at = type_id_offset(&bytes, &tensors[0].name);
    bad[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(t.path().join("model.gguf"), &bad).unwrap();
    expect_refused(
        &t.path().join("model.gguf"),
        &format!("tensor \"{}\": ggml type 99", tensors[0].name),
    );
    // Stacked experts stored with two dims instead of three.
    let exps = tensors
        .iter()
        .find(|t| t.name.ends_with("ffn_up_exps.weight"))
        .unwrap();
    let mut b = coli_core::fuzzing::GgufBuilder::new();
    let (meta, _) = coli_core::gguf::parse(&bytes).unwrap();
    for (k, v) in &meta {
        b = b.value(k, v);
    }
    for x in &tensors {
        let mut dims: Vec<u64> = x.dims.iter().map(|&d| d as u64).collect();
        if x.name == exps.name {
            dims = vec![dims[0], dims[1] * dims[2]];
        }
        b = b.tensor(&x.name, &dims, x.ty.id(), bytes[x.range.clone()].to_vec());
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("model.gguf"), b.build()).unwrap();
    expect_refused(
        &t.path().join("model.gguf"),
        &format!("tensor \"{}\": stacked experts need 3 dims", exps.name),
    );
}

/// Where tensor `name`'s ggml type id is in a GGUF's tensor directory: after its name
/// (u64 length + bytes), its dim count (u32) and dims (u64 each).
fn type_id_offset(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .unwrap()
        + key.len();
    let nd = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * nd
}

/// The demo model's GGUF run in place, with no tokenizer.json beside it: the tokenizer and
/// the chat template come from its metadata. Against transformers' own GGUF loader and
/// tokenizer on the same file (`oracle/gguf_models.py demo`): the prompt's ids, the
/// greedy continuation, and the ids of the rendered chat prompt.
#[test]
fn demo_gguf_runs_in_place_with_the_tokenizer_and_template_of_its_metadata() {
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(coli_tests::fixtures_dir().join("demo_gguf/reference.json"))
            .unwrap(),
    )
    .unwrap();
    let gguf = coli_models::demo::ensure_demo_gguf().expect("demo GGUF");
    let beside = gguf.parent().unwrap();
    assert!(!beside.join("tokenizer.json").exists());
    let mut want = ids(&reference["greedy_ids"]);
    // transformers ran on past <|im_end|> (id 2, the eos); coli stops there.
    if let Some(stop) = want.iter().position(|&t| t == 2) {
        want.truncate(stop + 1);
    }
    let n = want.len().to_string();
    let out = coli(&[
        "run",
        "--model",
        path_str(&gguf),
        "--prompt",
        reference["prompt"].as_str().unwrap(),
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
    assert_eq!(ids(&v["prompt_ids"]), ids(&reference["prompt_ids"]));
    assert_eq!(ids(&v["generated_ids"]), want, "greedy ids vs transformers");
    let out = coli(&[
        "run",
        "--model",
        path_str(&gguf),
        "--chat",
        "--prompt",
        reference["chat_user"].as_str().unwrap(),
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
        ids(&reference["chat_ids"]),
        "chat prompt {:?}",
        reference["chat_rendered"]
    );
}

/// A DeepSeek-V3 GGUF as converters wrote it before llama.cpp split `kv_b_proj`: one
/// `attn_kv_b` tensor and the head sizes in `key_length`/`value_length` (no `_mla` keys).
/// Made from the split fixture by putting each head's key rows (`attn_k_b` transposed)
/// and value rows (`attn_v_b`) back together, as f32 values of the same weights: the
/// logits stay those of transformers.
#[test]
fn deepseek_gguf_with_one_kv_b_tensor_runs_like_the_split_one() {
    use coli_core::gguf::{dequantize, parse};
    let r = Reference::load("gguf_deepseek_v3_q4_k_m");
    let bytes = std::fs::read(r.dir.join("model.gguf")).unwrap();
    let (meta, tensors) = parse(&bytes).unwrap();
    let key = |k: &str| meta[&format!("deepseek2.{k}")].as_u64().unwrap() as usize;
    let (nh, rank, rope) = (
        key("attention.head_count"),
        key("attention.kv_lora_rank"),
        key("rope.dimension_count"),
    );
    let (nope, v) = (
        key("attention.key_length_mla") - rope,
        key("attention.value_length_mla"),
    );
    let mut b = coli_core::fuzzing::GgufBuilder::new();
    for (k, val) in &meta {
        match k.as_str() {
            "deepseek2.attention.key_length_mla" | "deepseek2.attention.value_length_mla" => {}
            "deepseek2.attention.key_length" => b = b.u32(k, (nope + rope) as u32),
            "deepseek2.attention.value_length" => b = b.u32(k, v as u32),
            _ => b = b.value(k, val),
        }
    }
    let values = |name: &str| {
        let t = tensors.iter().find(|t| t.name == name).unwrap();
        let mut out = vec![0.0f32; t.numel()];
        dequantize(t.ty, &bytes[t.range.clone()], &mut out).unwrap();
        out
    };
    let mut merged = 0;
    for t in &tensors {
        if t.name.ends_with(".attn_v_b.weight") {
            continue;
        }
        let Some(layer) = t.name.strip_suffix(".attn_k_b.weight") else {
            let dims: Vec<u64> = t.dims.iter().map(|&d| d as u64).collect();
            b = b.tensor(&t.name, &dims, t.ty.id(), bytes[t.range.clone()].to_vec());
            continue;
        };
        // k_b[h][c][d] = kv_b[h * (nope + v) + d][c]; v_b[h][j][c] = kv_b[h * (nope + v) + nope + j][c].
        let (kb, vb) = (values(&t.name), values(&format!("{layer}.attn_v_b.weight")));
        let mut kv = vec![0.0f32; nh * (nope + v) * rank];
        for h in 0..nh {
            for c in 0..rank {
                for d in 0..nope {
                    kv[(h * (nope + v) + d) * rank + c] = kb[(h * rank + c) * nope + d];
                }
                for j in 0..v {
                    kv[(h * (nope + v) + nope + j) * rank + c] = vb[(h * v + j) * rank + c];
                }
            }
        }
        let dims = [rank as u64, (nh * (nope + v)) as u64];
        b = b.tensor_f32(&format!("{layer}.attn_kv_b.weight"), &dims, &kv);
        merged += 1;
    }
    assert_eq!(merged, 2, "both layers' kv_b put back together");
    let t = tempfile::tempdir().unwrap();
    let model = t.path().join("model.gguf");
    std::fs::write(&model, b.build()).unwrap();
    eval_matches_fixture("gguf_deepseek_v3_q4_k_m", &model, &[]);
}
