//! The cargo-fuzz targets' entry points (`coli_core::fuzzing`) on stable: the committed
//! seed corpus (`fuzz/seeds/<target>/`), then a fixed number of seeded mutations of
//! valid files (bit flips, truncations, length fields set to edge values, inserted,
//! deleted and duplicated runs, numbers in text replaced) and of random bytes. Every
//! input goes through the same function the fuzz target calls; a panic fails the test.
//!
//! `cargo test --release -p coli-core --test suite fuzz_seeded -- --ignored` rewrites the
//! seeds from the makers below.

use std::path::Path;

use coli_core::fuzzing::{self, mutate, safetensors_file, GgufBuilder, Rng};

/// Mutations per seed file.
const MUTATIONS: usize = 20_000;
/// Random inputs per target.
const RANDOM: usize = 5000;

/// Runs `entry` over the corpus, `MUTATIONS` mutants of each seed and `RANDOM` random
/// inputs. Every seed must be accepted, and enough mutants too (at least `min_accepted`
/// per thousand) that the accepting paths, not just the first check, are exercised.
fn run(target: &str, seed: u64, entry: fn(&[u8]) -> bool, min_accepted: usize) {
    run_n(target, seed, entry, min_accepted, MUTATIONS)
}

/// [`run`] with `mutations` per seed (an entry that writes a file per input takes fewer).
fn run_n(target: &str, seed: u64, entry: fn(&[u8]) -> bool, min_accepted: usize, mutations: usize) {
    let seeds = coli_core::fuzzing::seed_corpus(target);
    let mut rng = Rng::new(seed);
    let mut accepted = 0;
    for s in &seeds {
        assert!(entry(s), "a {target} seed is refused");
        for _ in 0..mutations {
            let m = mutate(&mut rng, s);
            // Mutants of mutants reach further from the seed.
            let m = if rng.below(4) == 0 {
                mutate(&mut rng, &m)
            } else {
                m
            };
            accepted += entry(&m) as usize;
        }
    }
    for _ in 0..RANDOM {
        let n = rng.below(300);
        entry(&rng.bytes(n));
    }
    let per_mille = accepted * 1000 / (seeds.len() * mutations);
    eprintln!(
        "{target}: {accepted} of {} mutants accepted",
        seeds.len() * mutations
    );
    assert!(
        per_mille >= min_accepted,
        "{target}: only {per_mille}‰ of mutants accepted (want ≥ {min_accepted}‰)"
    );
}

#[test]
fn safetensors_seeded() {
    run("safetensors", 1, fuzzing::safetensors, 10);
}

#[test]
fn safetensors_index_seeded() {
    run("safetensors_index", 2, fuzzing::safetensors_index, 10);
}

#[test]
fn gguf_seeded() {
    run("gguf", 3, fuzzing::gguf, 10);
}

#[test]
fn gguf_model_seeded() {
    run_n("gguf_model", 5, fuzzing::gguf_model, 10, 5000);
}

#[test]
fn config_seeded() {
    run("config", 4, fuzzing::config, 10);
}

/// The committed seeds are the makers' output (so the corpus stays valid as formats move).
#[test]
fn corpus_seeds_are_valid_files() {
    for (name, bytes) in seeds("safetensors") {
        assert!(
            coli_core::safetensors_header::parse_file_bytes(&bytes).is_ok(),
            "{name}"
        );
    }
    for (name, bytes) in seeds("gguf") {
        assert!(coli_core::gguf::parse(&bytes).is_ok(), "{name}");
    }
    for (name, bytes) in seeds("gguf_model") {
        assert!(fuzzing::gguf_model(&bytes), "{name} opens as a model");
    }
    for (name, bytes) in seeds("safetensors_index") {
        let p = Path::new("model.safetensors.index.json");
        assert!(
            coli_core::model_dir::parse_index(p, &bytes).is_ok(),
            "{name}"
        );
    }
    for target in [
        "safetensors",
        "gguf",
        "gguf_model",
        "safetensors_index",
        "config",
    ] {
        for (name, bytes) in seeds(target) {
            let committed = std::fs::read(coli_core::fuzzing::seed_dir(target).join(&name))
                .unwrap_or_else(|e| {
                    panic!("{target}/{name}: {e} (run the ignored write_seed_corpus)")
                });
            assert_eq!(committed, bytes, "{target}/{name} differs from its maker");
        }
    }
}

#[test]
#[ignore = "rewrites fuzz/seeds"]
fn write_seed_corpus() {
    for target in [
        "safetensors",
        "gguf",
        "gguf_model",
        "safetensors_index",
        "config",
    ] {
        let dir = coli_core::fuzzing::seed_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds(target) {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

/// The valid files each target's corpus starts from.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    match target {
        "safetensors" => vec![
            (
                "seed-two-tensors".into(),
                safetensors_file(
                    r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}"#,
                    16,
                ),
            ),
            (
                "seed-empty-and-fp8".into(),
                safetensors_file(
                    r#"{"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"q":{"dtype":"F8_E4M3","shape":[4,2],"data_offsets":[0,8]},"s":{"dtype":"I8","shape":[2],"data_offsets":[8,10]},"u":{"dtype":"U8","shape":[6],"data_offsets":[10,16]}}"#,
                    16,
                ),
            ),
        ],
        "safetensors_index" => vec![(
            "seed-index".into(),
            br#"{"metadata":{"total_size":48},"weight_map":{"lm_head.weight":"model-00002-of-00002.safetensors","model.embed_tokens.weight":"model-00001-of-00002.safetensors","model.norm.weight":"model-00002-of-00002.safetensors"}}"#.to_vec(),
        )],
        "gguf" => vec![
            ("seed-all-types".into(), all_types_gguf()),
            (
                "seed-metadata".into(),
                GgufBuilder::new()
                    .str("general.architecture", "llama")
                    .u64("general.alignment", 32)
                    .bool("tokenizer.ggml.add_bos_token", true)
                    .strs("tokenizer.ggml.tokens", &["a", "b", "ab"])
                    .i32s("tokenizer.ggml.token_type", &[1, 1, 3])
                    .f32("llama.rope.freq_base", 10000.0)
                    .tensor_f32("s", &[], &[1.5])
                    .build(),
            ),
        ],
        "gguf_model" => vec![("seed-tiny-qwen3moe".into(), tiny_moe_gguf())],
        "config" => ["llama_gqa", "kimi_k2_yarn_mscale", "deepseek_v3_fp8_b128", "qwen3_moe_new_rope"]
            .iter()
            .map(|f| {
                (
                    format!("seed-{f}.json"),
                    std::fs::read(fixtures.join(f).join("config.json")).unwrap(),
                )
            })
            .collect(),
        other => panic!("no seeds for {other}"),
    }
}

/// One tensor of every ggml type coli reads, with nonzero data.
fn all_types_gguf() -> Vec<u8> {
    let block = |n: usize, salt: u8| (0..n).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect();
    GgufBuilder::new()
        .u32("llama.block_count", 1)
        .tensor_f32("f32", &[2, 2], &[1.0, -2.0, 0.5, 8.0])
        .tensor("f16", &[4], 1, block(8, 1))
        .tensor("q4_0", &[32, 2], 2, block(36, 2))
        .tensor("q4_1", &[32], 3, block(20, 3))
        .tensor("q8_0", &[32], 8, block(34, 4))
        .tensor("bf16", &[3], 30, block(6, 5))
        .build()
}

/// A whole Qwen3-MoE model in a few kilobytes, as llama.cpp names it: f32 and Q8_0
/// tensors, two stacked experts (one Q8_0, two f32), q/k norms.
fn tiny_moe_gguf() -> Vec<u8> {
    let f = |n: usize| {
        (0..n)
            .map(|i| (i % 7) as f32 * 0.125 - 0.25)
            .collect::<Vec<f32>>()
    };
    let q8 = |rows: usize, cols: usize| -> Vec<u8> {
        (0..rows * cols / 32)
            .flat_map(|b| {
                let mut v = half::f16::from_f32(0.01).to_bits().to_le_bytes().to_vec();
                v.extend((0..32).map(|i| ((i * 5 + b) % 251) as u8));
                v
            })
            .collect()
    };
    let (h, hd, vocab, ff) = (32u64, 16u64, 8u64, 32u64);
    GgufBuilder::new()
        .str("general.architecture", "qwen3moe")
        .u32("qwen3moe.block_count", 1)
        .u32("qwen3moe.context_length", 64)
        .u32("qwen3moe.embedding_length", h as u32)
        .u32("qwen3moe.attention.head_count", 2)
        .u32("qwen3moe.attention.head_count_kv", 1)
        .u32("qwen3moe.attention.key_length", hd as u32)
        .u32("qwen3moe.expert_count", 2)
        .u32("qwen3moe.expert_used_count", 1)
        .u32("qwen3moe.expert_feed_forward_length", ff as u32)
        .f32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
        .tensor_f32("token_embd.weight", &[h, vocab], &f((h * vocab) as usize))
        .tensor_f32("output_norm.weight", &[h], &f(h as usize))
        .tensor_f32("blk.0.attn_norm.weight", &[h], &f(h as usize))
        .tensor("blk.0.attn_q.weight", &[h, 2 * hd], 8, q8(32, 32))
        .tensor_f32("blk.0.attn_k.weight", &[h, hd], &f((h * hd) as usize))
        .tensor_f32("blk.0.attn_v.weight", &[h, hd], &f((h * hd) as usize))
        .tensor_f32(
            "blk.0.attn_output.weight",
            &[2 * hd, h],
            &f((2 * hd * h) as usize),
        )
        .tensor_f32("blk.0.attn_q_norm.weight", &[hd], &f(hd as usize))
        .tensor_f32("blk.0.attn_k_norm.weight", &[hd], &f(hd as usize))
        .tensor_f32("blk.0.ffn_norm.weight", &[h], &f(h as usize))
        .tensor_f32("blk.0.ffn_gate_inp.weight", &[h, 2], &f((h * 2) as usize))
        .tensor("blk.0.ffn_gate_exps.weight", &[h, ff, 2], 8, q8(64, 32))
        .tensor_f32(
            "blk.0.ffn_up_exps.weight",
            &[h, ff, 2],
            &f((h * ff * 2) as usize),
        )
        .tensor_f32(
            "blk.0.ffn_down_exps.weight",
            &[ff, h, 2],
            &f((ff * h * 2) as usize),
        )
        .build()
}
