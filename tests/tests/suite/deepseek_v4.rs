//! DeepSeek-V4 beyond the oracle fixtures: the legacy config keys its configuration class
//! folds in give the modern keys' model bit for bit, checkpoints that are not what the
//! release ships are named errors at load, a cut cache gives a fresh sequence's bits, and
//! FP4 expert scales are streamed with their experts (rings that wrap: `rings.rs`).

use coli_tests::{copy_fixture as copy, edit_config, load_err, shard_header as header, Reference};
use serde_json::Value;

fn logits(dir: &std::path::Path, ids: &[u32]) -> Vec<u32> {
    let m = coli_models::load(dir).unwrap();
    let mut s = coli_models::Session::new(&m, 64);
    let out = s.forward(ids, true).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn legacy_config_keys_give_the_modern_keys_model() {
    let r = Reference::load("deepseek_v4_hash_csa");
    let ids = r.ids();
    let want = logits(&r.dir, &ids);
    let t = copy("deepseek_v4_hash_csa");
    edit_config(t.path(), |c| {
        let c = c.as_object_mut().unwrap();
        for k in [
            "layer_types",
            "mlp_layer_types",
            "compress_rates",
            "partial_rotary_factor",
            "rope_parameters",
        ] {
            c.remove(k).unwrap();
        }
        // [sliding, csa, hca, csa] as the release spells it: ratios 0, 4, 128, with the
        // HCA rate overridden; the two leading hash layers; the rotary width in channels.
        c.insert("compress_ratios".into(), Value::from(vec![0, 4, 128, 4, 0]));
        c.insert("compress_rate_csa".into(), Value::from(4));
        c.insert("compress_rate_hca".into(), Value::from(8));
        c.insert("num_hash_layers".into(), Value::from(2));
        c.insert("qk_rope_head_dim".into(), Value::from(8));
    });
    assert_eq!(logits(t.path(), &ids), want);
    // The override is read: without it the HCA layer would compress 128 positions at a
    // time, which the checkpoint's position bias (8 rows) does not fit.
    edit_config(t.path(), |c| {
        c.as_object_mut().unwrap().remove("compress_rate_hca");
    });
    let e = load_err(t.path());
    assert!(
        e.contains("layers.2.self_attn.compressor.position_bias"),
        "{e}"
    );
}

#[test]
fn configs_that_are_not_what_the_release_ships_are_named_errors() {
    let cases: [(&str, Value, &str); 11] = [
        ("q_lora_rank", Value::from(0), "q_lora_rank"),
        ("o_lora_rank", Value::from(0), "o_lora_rank"),
        ("hidden_act", Value::from("gelu"), "hidden_act"),
        ("mlp_bias", Value::from(true), "mlp_bias"),
        ("scoring_func", Value::from("tanh"), "scoring_func"),
        (
            "layer_types",
            Value::from(vec![
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "sliding_attention",
            ]),
            "full_attention",
        ),
        (
            "mlp_layer_types",
            Value::from(vec!["hash_moe", "dense", "moe", "moe"]),
            "mlp_layer_types",
        ),
        (
            "mlp_layer_types",
            Value::from(vec!["moe"]),
            "mlp_layer_types",
        ),
        ("num_key_value_heads", Value::from(2), "num_key_value_heads"),
        ("o_groups", Value::from(3), "o_groups"),
        ("swiglu_limit", Value::from(-1.0), "swiglu_limit"),
    ];
    for (key, value, said) in cases {
        let t = copy("deepseek_v4_hash_csa");
        edit_config(t.path(), |c| {
            c.as_object_mut().unwrap().insert(key.into(), value.clone());
        });
        let e = load_err(t.path());
        assert!(e.contains(said), "{key} = {value}: {e}");
    }
    // transformers sizes each rotary from its own factor; coli refuses a mismatch.
    let t = copy("deepseek_v4_hash_csa");
    edit_config(t.path(), |c| {
        c["rope_parameters"]["compress"]
            .as_object_mut()
            .unwrap()
            .remove("partial_rotary_factor");
    });
    let e = load_err(t.path());
    assert!(e.contains("compress.partial_rotary_factor"), "{e}");
    let t = copy("deepseek_v4_hub_yarn");
    edit_config(t.path(), |c| {
        c["compress_ratios"] = Value::from(vec![128, 7, 0, 0]);
    });
    let e = load_err(t.path());
    assert!(e.contains("compress_ratios") && e.contains('7'), "{e}");
}

#[test]
fn a_token_table_naming_a_missing_or_repeated_expert_is_refused() {
    // The release's table is I32 (hub fixture), transformers' I64 (the other).
    for (fixture, name, width) in [
        ("deepseek_v4_hub_yarn", "layers.0.ffn.gate.tid2eid", 4),
        ("deepseek_v4_hash_csa", "model.layers.1.mlp.gate.tid2eid", 8),
    ] {
        for (value, said) in [
            (8i64, "outside 0..8"),
            (-1, "outside"),
            (i64::MAX, "outside"),
        ] {
            let t = copy(fixture);
            let shard = t.path().join("model.safetensors");
            let (h, data, mut bytes) = header(&shard);
            let start = data + h[name]["data_offsets"][0].as_u64().unwrap() as usize;
            // Token 3's second expert.
            let at = start + (3 * 2 + 1) * width;
            let v = value.to_le_bytes();
            bytes[at..at + width].copy_from_slice(&v[..width]);
            std::fs::write(&shard, bytes).unwrap();
            let e = load_err(t.path());
            assert!(
                e.contains(name) && e.contains(said) && e.contains("token 3"),
                "{e}"
            );
        }
        let t = copy(fixture);
        let shard = t.path().join("model.safetensors");
        let (h, data, mut bytes) = header(&shard);
        let start = data + h[name]["data_offsets"][0].as_u64().unwrap() as usize;
        let first = bytes[start + 3 * 2 * width..][..width].to_vec();
        bytes[start + (3 * 2 + 1) * width..][..width].copy_from_slice(&first);
        std::fs::write(&shard, bytes).unwrap();
        let e = load_err(t.path());
        assert!(e.contains("twice") && e.contains("token 3"), "{e}");
    }
}

#[test]
fn a_cache_cut_inside_a_window_gives_a_fresh_sequences_bits() {
    // Cut at every length: inside windows of both rates, at their ends, and before the
    // first entry; then feed the rest again. Each entry is rebuilt from the positions it
    // covers, so nothing of the cut tokens may remain.
    let r = Reference::load("deepseek_v4_hash_csa");
    let ids = r.ids();
    let m = coli_models::load(&r.dir).unwrap();
    let mut fresh = coli_models::Session::new(&m, 64);
    let want: Vec<u32> = fresh
        .forward(&ids, true)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let vocab = m.info.vocab_size;
    let mut s = coli_models::Session::new(&m, 64);
    // A different continuation first, so the cut positions held other tokens' rows.
    let other: Vec<u32> = ids.iter().map(|&t| (t * 7 + 3) % vocab as u32).collect();
    for cut in [0, 3, 5, 8, 13, 16, 17, 24, 31, 39] {
        s.truncate(0);
        if cut > 0 {
            s.forward(&ids[..cut], false).unwrap();
        }
        s.forward(&other[cut..], false).unwrap();
        s.truncate(cut);
        let got: Vec<u32> = s
            .forward(&ids[cut..], true)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got[..], want[cut * vocab..], "cut at {cut}");
    }
}

/// The FP4 fixture's routed-expert scale tensors (`….ffn.experts.E.wN.scale`) from its
/// safetensors header: (name, start, end) of each's data.
fn expert_scales(shard: &std::path::Path) -> Vec<(String, usize, usize)> {
    coli_tests::shard_tensors(shard, ".experts.", ".scale")
}

#[test]
fn fp4_expert_scales_are_streamed_with_their_experts() {
    // The release keeps one E8M0 scale per 32 weights: 8.7 GB on V4-Flash. They are
    // expert bytes, read with the matrices, not resident weights.
    let r = Reference::load("deepseek_v4_fp4_release");
    let shard = r.dir.join("model.safetensors");
    let scales = expert_scales(&shard);
    assert!(!scales.is_empty());
    let m = coli_models::load(&r.dir).unwrap();
    let census = m.expert_census();
    let expert_tensors: usize = coli_tests::shard_tensors(&shard, ".experts.", "")
        .iter()
        .map(|(_, s, e)| e - s)
        .sum();
    assert_eq!(census.total_bytes as usize, expert_tensors);
    // With one slot per layer every routed expert is read when used: the store counts
    // the scales' bytes with the matrices'.
    let (stats, per_expert) = coli_tests::one_slot_stats(&r.dir, &r.ids());
    assert!(stats.misses > 0);
    assert_eq!(stats.bytes_read, stats.misses * per_expert, "{stats:?}");
}

#[test]
fn a_nan_fp4_expert_scale_is_an_error_when_its_expert_is_read() {
    // Every routed expert's first scale made 255 (NaN in E8M0): whichever expert a token
    // routes to, reading it fails with the reason, on every placement.
    let t = copy("deepseek_v4_fp4_release");
    let shard = t.path().join("model.safetensors");
    let scales = expert_scales(&shard);
    let (_, data, mut bytes) = header(&shard);
    for (_, start, _) in &scales {
        bytes[data + start] = 255;
    }
    std::fs::write(&shard, bytes).unwrap();
    let ids = Reference::load("deepseek_v4_fp4_release").ids();
    for e in coli_tests::expert_read_errors(t.path(), &ids) {
        assert!(e.contains("NaN in E8M0"), "{e}");
    }
    // Converting reads every scale: refused too, with nothing written.
    let e = coli_tests::convert_error(t.path());
    assert!(e.contains("NaN in E8M0"), "{e}");
}
