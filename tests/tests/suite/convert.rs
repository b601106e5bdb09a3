//! `coli convert`: deterministic containers (the committed oracle containers are exactly
//! what the converter writes today), lossless bf16, one read per expert, no overwrite.

use coli_models::convert::{convert, ConvertOptions, Target};
use coli_models::experts::{CacheSize, Placement};
use coli_tests::{fixtures_dir, placement};

fn opts(experts: Target, dense: Target) -> ConvertOptions {
    ConvertOptions {
        experts,
        dense,
        shard_bytes: 100_000,
    }
}

#[test]
fn the_committed_containers_are_what_convert_writes() {
    for (src, container, experts, dense) in [
        (
            "olmoe_norm_topk",
            "olmoe_int4_container",
            Target::Int4,
            Target::Int8,
        ),
        (
            "deepseek_v3_fp8_b128",
            "deepseek_v3_int8_container",
            Target::Int8,
            Target::Bf16,
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("c");
        convert(
            &fixtures_dir().join(src),
            &out,
            &opts(experts, dense),
            |_, _| {},
        )
        .unwrap();
        let want = fixtures_dir().join(container);
        for e in std::fs::read_dir(&out).unwrap() {
            let name = e.unwrap().file_name();
            let n = name.to_string_lossy();
            if n == "reference.json" || n == "logits.bin" {
                continue;
            }
            assert_eq!(
                std::fs::read(out.join(&name)).unwrap(),
                std::fs::read(want.join(&name)).unwrap(),
                "{container}/{n}"
            );
        }
    }
}

#[test]
fn bf16_to_bf16_is_lossless_and_every_expert_is_one_read() {
    let src = fixtures_dir().join("olmoe_gqa_clip");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let mut calls = 0;
    convert(
        &src,
        &out,
        &opts(Target::Bf16, Target::Bf16),
        |done, total| {
            assert!(done <= total);
            calls += 1;
        },
    )
    .unwrap();
    assert!(calls > 0);
    let seq: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 256).collect();
    let a = placement::trace(&coli_models::load(&src).unwrap(), &seq, 6).unwrap();
    let mut m = coli_models::load(&out).unwrap();
    let b = placement::trace(&m, &seq, 6).unwrap();
    assert_eq!(
        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    for experts in [Target::Int8, Target::Int4] {
        let out = tmp.path().join(experts.name());
        convert(&src, &out, &opts(experts, Target::Int8), |_, _| {}).unwrap();
        m = coli_models::load(&out).unwrap();
        m.place_experts(
            &out,
            &Placement {
                cache: CacheSize::Slots(1),
                ..Placement::default()
            },
        )
        .unwrap();
        let st = m.store.as_ref().unwrap();
        assert!(
            st.all_coalesced(),
            "{experts:?}: an expert needs more than one read"
        );
        // The shards say what they are.
        let shard = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .unwrap();
        let bytes = std::fs::read(&shard).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        assert_eq!(header["__metadata__"]["coli.format"], "1");
        assert_eq!(header["__metadata__"]["coli.experts"], experts.name());
    }
}

#[test]
fn an_existing_output_is_refused_and_left_alone() {
    let src = fixtures_dir().join("olmoe_gqa_clip");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("keep"), b"mine").unwrap();
    let err = convert(
        &src,
        tmp.path(),
        &opts(Target::Int8, Target::Bf16),
        |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("refusing to overwrite"), "{err}");
    assert_eq!(std::fs::read(tmp.path().join("keep")).unwrap(), b"mine");
    let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(names.len(), 1);
}

/// gpt-oss: the MXFP4 expert tensors (every expert of a layer in one tensor) are copied
/// byte for byte and reported; `--dense bf16` keeps the rest lossless, so the container
/// gives the source's bits.
#[test]
fn gpt_oss_keeps_its_mxfp4_experts_and_reports_them() {
    let src = fixtures_dir().join("gpt_oss_window_yarn");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let report = convert(&src, &out, &opts(Target::Int8, Target::Bf16), |_, _| {}).unwrap();
    assert_eq!(report.fused_experts_kept.len(), 8, "{report:?}");
    assert!(report
        .fused_experts_kept
        .iter()
        .all(|n| n.ends_with("_proj_blocks")));
    let (a, b) = (
        coli_core::ModelDir::open(&src).unwrap(),
        coli_core::ModelDir::open(&out).unwrap(),
    );
    for n in &report.fused_experts_kept {
        assert_eq!(
            a.tensor(n).unwrap().bytes(),
            b.tensor(n).unwrap().bytes(),
            "{n}"
        );
    }
    let seq: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 256).collect();
    let x = placement::trace(&coli_models::load(&src).unwrap(), &seq, 6).unwrap();
    let y = placement::trace(&coli_models::load(&out).unwrap(), &seq, 6).unwrap();
    assert_eq!(
        x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// Qwen3.5's fused BF16 experts are cut per expert (as transformers fuses them: the gates'
/// rows, then the up projections'), and gpt-oss' input-major ones transposed per expert,
/// and converted like any other expert; bf16 → bf16 is
/// lossless, the linear-attention tensors (a 3-D convolution, A_log, dt_bias) travel as
/// they are, and every quantized expert is one read. Qwen3-Next's per-expert layout too,
/// and DeepSeek-V4 in both spellings (its hyper-connection tensors, position biases, sinks
/// and integer token tables travel as they are).
#[test]
fn fused_bf16_experts_are_written_per_expert_and_hybrids_convert_losslessly() {
    for name in [
        "qwen3_5_moe_hub_fused",
        "qwen3_next_hybrid",
        "deepseek_v4_hash_csa",
        "deepseek_v4_hub_yarn",
        "deepseek_v4_fp4_release",
        "gpt_oss_bf16_fused",
    ] {
        let src = fixtures_dir().join(name);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("bf16");
        let report = convert(&src, &out, &opts(Target::Bf16, Target::Bf16), |_, _| {}).unwrap();
        assert!(report.fused_experts_kept.is_empty(), "{report:?}");
        let d = coli_core::ModelDir::open(&out).unwrap();
        let names = d.tensor_names();
        assert!(!names.iter().any(|n| n.ends_with("gate_up_proj")), "{name}");
        let (p, projs) = match name {
            n if n.starts_with("qwen3_5") => (
                "model.language_model.layers.2.mlp.experts.7",
                ["gate_proj", "up_proj", "down_proj"],
            ),
            "deepseek_v4_hub_yarn" | "deepseek_v4_fp4_release" => {
                ("layers.2.ffn.experts.7", ["w1", "w3", "w2"])
            }
            // Input-major gate_up [hidden, 2 inter] written [2 inter, hidden].
            "gpt_oss_bf16_fused" => (
                "model.layers.1.mlp.experts.7",
                ["gate_up_proj", "down_proj", "down_proj"],
            ),
            _ => (
                "model.layers.2.mlp.experts.7",
                ["gate_proj", "up_proj", "down_proj"],
            ),
        };
        for proj in projs {
            assert!(d.has(&format!("{p}.{proj}.weight")), "{name}: {p}.{proj}");
        }
        let seq: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 256).collect();
        let x = placement::trace(&coli_models::load(&src).unwrap(), &seq, 6).unwrap();
        let y = placement::trace(&coli_models::load(&out).unwrap(), &seq, 6).unwrap();
        assert_eq!(
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{name}"
        );
        let q = tmp.path().join("int4");
        convert(&src, &q, &opts(Target::Int4, Target::Int8), |_, _| {}).unwrap();
        if name.starts_with("deepseek_v4") {
            // The grouped output projection (read as row blocks) is converted whole.
            let d = coli_core::ModelDir::open(&q).unwrap();
            let names = d.tensor_names();
            let o_a = names
                .iter()
                .find(|n| n.ends_with("o_a_proj.weight") || n.ends_with("wo_a.weight"))
                .unwrap();
            assert_eq!(d.tensor(o_a).unwrap().dtype_name, "I8", "{name}: {o_a}");
        }
        let mut m = coli_models::load(&q).unwrap();
        m.place_experts(
            &q,
            &Placement {
                cache: CacheSize::Slots(1),
                ..Placement::default()
            },
        )
        .unwrap();
        assert!(m.store.as_ref().unwrap().all_coalesced(), "{name}");
    }
}
