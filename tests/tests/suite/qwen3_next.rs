//! Qwen3-Next and Qwen3.5-MoE checkpoints that are not what the releases ship: each is a
//! named error at load, never a panic or a silently wrong model; and the hybrid's state
//! behaves as a sequence's state must.

use coli_models::sampling::{Sampler, SamplingParams};
use coli_models::Session;
use coli_tests::{copy_fixture as copy, edit_config, load_err, Reference};
use serde_json::Value;

#[test]
fn bad_hybrid_configs_are_named_errors() {
    type Edit = fn(&mut Value);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "layer_types",
            |v| v["layer_types"] = serde_json::json!(["linear_attention"]),
            "has 1 entries",
        ),
        (
            "layer_types",
            |v| v["layer_types"][1] = "mamba".into(),
            "unknown layer type \"mamba\"",
        ),
        (
            "linear_num_value_heads",
            |v| v["linear_num_value_heads"] = 3.into(),
            "not a multiple of linear_num_key_heads",
        ),
        (
            "linear_conv_kernel_dim",
            |v| v["linear_conv_kernel_dim"] = 0.into(),
            "must be positive",
        ),
        (
            "partial_rotary_factor",
            |v| v["rope_parameters"]["partial_rotary_factor"] = 0.0.into(),
            "rotary dims",
        ),
        (
            "intermediate_size",
            |v| {
                v.as_object_mut().unwrap().remove("intermediate_size");
            },
            "dense MLP",
        ),
    ];
    for (key, edit, needle) in cases {
        let t = copy("qwen3_next_hybrid");
        edit_config(t.path(), *edit);
        let e = load_err(t.path());
        assert!(e.contains(key) && e.contains(needle), "{key}: {e}");
    }
    // The interval form transformers derives layer_types from: every 2nd layer full here.
    let t = copy("qwen3_next_hybrid");
    edit_config(t.path(), |v| {
        v.as_object_mut().unwrap().remove("layer_types");
        v["full_attention_interval"] = 2.into();
    });
    coli_models::load(t.path()).unwrap();
    edit_config(t.path(), |v| v["full_attention_interval"] = 3.into());
    let e = load_err(t.path());
    assert!(
        e.contains("linear_attn"),
        "layer 1 is linear at interval 3: {e}"
    );
}

#[test]
fn a_qwen35_vision_checkpoint_needs_its_text_model() {
    // The conv weight's shape follows the config: a wrong head count is a shape error
    // naming the tensor, not a wrong model.
    let t = copy("qwen3_5_moe_hub_fused");
    edit_config(t.path(), |v| {
        v["text_config"]["linear_key_head_dim"] = 8.into()
    });
    let e = load_err(t.path());
    assert!(
        e.contains("model.language_model.layers.0.linear_attn"),
        "{e}"
    );
    // The wrapper's own keys win over text_config's.
    let t = copy("qwen3_5_moe_hub_fused");
    edit_config(t.path(), |v| v["num_experts_per_tok"] = 9.into());
    let e = load_err(t.path());
    assert!(e.contains("num_experts_per_tok"), "{e}");
}

/// The state of a sequence starts from zeros: the same prompt in a reused session, after
/// another conversation, gives the bits of a fresh session.
#[test]
fn a_new_conversation_starts_from_a_zero_state() {
    for name in ["qwen3_next_hybrid", "qwen3_5_moe_hub_fused"] {
        let r = Reference::load(name);
        let m = coli_models::load(&r.dir).unwrap();
        let ids = r.ids();
        let run = |s: &mut Session, p: &[u32]| {
            s.generate(
                p,
                8,
                &mut Sampler::new(SamplingParams::default()),
                &[],
                |_| {},
            )
            .unwrap()
            .generated_ids
        };
        let mut fresh = Session::new(&m, 64);
        let want = run(&mut fresh, &ids[..10]);
        let mut reused = Session::new(&m, 64);
        run(&mut reused, &ids[20..35]);
        reused.reset();
        assert_eq!(run(&mut reused, &ids[..10]), want, "{name}");
    }
}

/// An expert read that fails mid-forward leaves the layers before it advanced: a
/// recurrent state cannot be cut back, so the session starts over (length 0) instead of
/// going on from a half-advanced state; fed again once the shards are whole, the prompt
/// gives the bits of a fresh session.
#[test]
fn a_failed_forward_restarts_a_recurrent_sequence() {
    use coli_models::experts::{CacheSize, Placement, Prefetch};
    let r = Reference::load("qwen3_next_hybrid");
    let tmp = copy("qwen3_next_hybrid");
    let dir = tmp.path();
    let mut m = coli_models::load(dir).unwrap();
    let p = Placement {
        cache: CacheSize::Slots(1),
        direct: false,
        prefetch: Prefetch::Off,
        pin_bytes: 0,
    };
    m.place_experts(dir, &p).unwrap();
    let ids = r.ids();
    let mut s = Session::new(&m, 64);
    s.forward(&ids[..4], false).unwrap();
    let shard = dir.join("model.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len((8 + n) as u64)
        .unwrap();
    let at = (0..20)
        .find(|&i| s.forward(&[ids[4 + i]], false).is_err())
        .expect("a read past the end must fail");
    assert_eq!(
        s.len(),
        0,
        "failed at step {at}: the sequence must start over"
    );
    std::fs::write(&shard, &bytes).unwrap();
    let again = s.forward(&ids[..6], false).unwrap().to_vec();
    let mut fresh = Session::new(&m, 64);
    let want = fresh.forward(&ids[..6], false).unwrap().to_vec();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&again), bits(&want));
}
