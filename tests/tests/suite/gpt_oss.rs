//! gpt-oss checkpoints that are not what the release ships: each is a named error at load,
//! never a panic or a silently wrong model.

use coli_tests::{copy_fixture as copy, edit_config, load_err, shard_header as header, Reference};
use serde_json::Value;

#[test]
fn a_nan_mxfp4_scale_is_an_error_when_its_expert_is_read() {
    // Every expert's first down_proj scale of layer 2 made 255 (NaN in E8M0). The scales
    // are streamed with their experts, so the error comes when one is read, on every
    // placement, naming the expert and the file.
    let t = copy("gpt_oss_window_yarn");
    let shard = t.path().join("model.safetensors");
    let (h, data, mut bytes) = header(&shard);
    let name = "model.layers.2.mlp.experts.down_proj_scales";
    let shape = &h[name]["shape"];
    let (n_experts, per_expert) = (
        shape[0].as_u64().unwrap() as usize,
        (shape[1].as_u64().unwrap() * shape[2].as_u64().unwrap()) as usize,
    );
    let start = h[name]["data_offsets"][0].as_u64().unwrap() as usize;
    for e in 0..n_experts {
        bytes[data + start + e * per_expert] = 255;
    }
    std::fs::write(&shard, bytes).unwrap();
    let ids = Reference::load("gpt_oss_window_yarn").ids();
    for e in coli_tests::expert_read_errors(t.path(), &ids) {
        assert!(
            e.contains("NaN in E8M0") && (e.contains("layer 2") || e.contains(name)),
            "{e}"
        );
    }
}

/// Rewrites one tensor's header entry of `dir`'s single shard (the header keeps its length,
/// padded with spaces as safetensors allows).
fn edit_header(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let shard = dir.join("model.safetensors");
    let (mut h, data, bytes) = header(&shard);
    edit(h.as_object_mut().unwrap());
    let mut text = serde_json::to_vec(&h).unwrap();
    let n = data - 8;
    assert!(text.len() <= n);
    text.resize(n, b' ');
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[data..]);
    std::fs::write(&shard, out).unwrap();
}

#[test]
fn unquantized_fused_experts_of_the_wrong_shape_or_dtype_are_named() {
    // MXFP4 blocks under the unquantized name: read as [experts, in, out], their shape is
    // wrong, and the error names the tensor.
    let t = copy("gpt_oss_clamp_top3");
    edit_header(t.path(), |obj| {
        let v = obj
            .remove("model.layers.0.mlp.experts.gate_up_proj_blocks")
            .unwrap();
        obj.insert("model.layers.0.mlp.experts.gate_up_proj".into(), v);
    });
    let e = load_err(t.path());
    assert!(e.contains("model.layers.0.mlp.experts.gate_up_proj"), "{e}");
    // The unquantized fixture's down_proj relabelled I16 (same bytes per element).
    let t = copy("gpt_oss_bf16_fused");
    edit_header(t.path(), |obj| {
        obj["model.layers.1.mlp.experts.down_proj"]["dtype"] = "I16".into();
    });
    let e = load_err(t.path());
    assert!(
        e.contains("model.layers.1.mlp.experts.down_proj") && e.contains("I16"),
        "{e}"
    );
}

#[test]
fn unquantized_fused_experts_are_transposed_once_and_never_served_in_place() {
    // Input-major experts cannot be served from the mapping: with every expert cached the
    // store still copies (and transposes) them, and the logits are the reference's bits
    // whether they are read in place, through the store or made resident.
    use coli_models::experts::{CacheSize, Placement, Prefetch};
    let r = Reference::load("gpt_oss_bf16_fused");
    let run = |cache: Option<CacheSize>| {
        let mut m = coli_models::load(&r.dir).unwrap();
        if let Some(cache) = cache {
            let p = Placement {
                cache,
                direct: false,
                prefetch: Prefetch::On,
                pin_bytes: 0,
            };
            m.place_experts(&r.dir, &p).unwrap();
            if let Some(store) = &m.store {
                assert!(!store.in_place(), "{cache:?}");
            }
        }
        let mut s = coli_models::Session::new(&m, 64);
        s.forward(&r.ids(), true).unwrap().to_vec()
    };
    // Read in place, each use transposes (the oracle test compares these with transformers).
    let plain = run(None);
    for cache in [CacheSize::Slots(8), CacheSize::Slots(1), CacheSize::Off] {
        assert!(run(Some(cache)) == plain, "{cache:?}");
    }
}

/// A config rewrite.
type ConfigEdit = fn(&mut Value);

#[test]
fn bad_layer_types_and_activation_constants_are_named() {
    let cases: [(&str, ConfigEdit); 5] = [
        ("layer_types", |v| {
            v["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"])
        }),
        ("layer_types", |v| {
            v["layer_types"][1] = "linear_attention".into();
        }),
        ("sliding_window", |v| v["sliding_window"] = Value::Null),
        ("swiglu_limit", |v| v["swiglu_limit"] = (-1.0).into()),
        ("num_experts_per_tok", |v| {
            v["num_experts_per_tok"] = 9.into()
        }),
    ];
    for (key, edit) in cases {
        let t = copy("gpt_oss_window_yarn");
        edit_config(t.path(), edit);
        let e = load_err(t.path());
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn every_layer_full_when_no_layer_slides_changes_the_logits() {
    // The window really acts: the same weights with every layer full attend further back.
    let r = Reference::load("gpt_oss_window_yarn");
    let ids = r.ids();
    let logits = |dir: &std::path::Path| {
        let m = coli_models::load(dir).unwrap();
        let mut s = coli_models::Session::new(&m, 64);
        s.forward(&ids, true).unwrap().to_vec()
    };
    let want = logits(&r.dir);
    let t = copy("gpt_oss_window_yarn");
    edit_config(t.path(), |v| {
        v["layer_types"] = serde_json::json!(vec!["full_attention"; 4]);
    });
    let got = logits(t.path());
    let v = r.json["vocab_size"].as_u64().unwrap() as usize;
    // Positions inside the window (8) see the same keys either way.
    assert_eq!(got[..8 * v], want[..8 * v]);
    assert_ne!(got[8 * v..], want[8 * v..]);
}
