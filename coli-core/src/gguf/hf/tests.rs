//! The name map and the config against what llama.cpp's converter writes.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::gguf::GgufValue;

#[test]
fn names_map_as_the_converter_writes_them() {
    assert_eq!(
        hf_name(Arch::Llama, "blk.3.attn_q.weight"),
        Some(HfName::Plain(
            "model.layers.3.self_attn.q_proj.weight".into()
        ))
    );
    assert_eq!(
        hf_name(Arch::Qwen3Moe, "blk.1.ffn_down_exps.weight"),
        Some(HfName::Experts {
            prefix: "model.layers.1.mlp.experts".into(),
            suffix: "down_proj.weight".into()
        })
    );
    // A dense FFN name in a MoE architecture, an expert name in a dense one: none.
    assert_eq!(hf_name(Arch::Olmoe, "blk.0.ffn_gate.weight"), None);
    // Mixtral is llama with experts, stacked or (older files) one tensor each.
    assert_eq!(
        hf_name(Arch::Llama, "blk.2.ffn_up_exps.weight"),
        Some(HfName::Experts {
            prefix: "model.layers.2.block_sparse_moe.experts".into(),
            suffix: "w3.weight".into()
        })
    );
    assert_eq!(
        hf_name(Arch::Llama, "blk.0.ffn_down.5.weight"),
        Some(HfName::Plain(
            "model.layers.0.block_sparse_moe.experts.5.w2.weight".into()
        ))
    );
    assert_eq!(hf_name(Arch::Llama, "blk.0.ffn_norm.5.weight"), None);
    // GLM-4.5's MTP layer keeps its own tensors after the others; DeepSeek's split kv_b.
    assert_eq!(
        hf_name(Arch::Glm4Moe, "blk.92.nextn.shared_head_norm.weight"),
        Some(HfName::Plain(
            "model.layers.92.shared_head.norm.weight".into()
        ))
    );
    assert_eq!(
        hf_name(Arch::Glm4Moe, "blk.3.post_attention_norm.weight"),
        Some(HfName::Plain(
            "model.layers.3.post_attention_layernorm.weight".into()
        ))
    );
    assert_eq!(
        hf_name(Arch::Deepseek2, "blk.5.exp_probs_b.bias"),
        Some(HfName::Plain(
            "model.layers.5.mlp.gate.e_score_correction_bias".into()
        ))
    );
    assert_eq!(hf_name(Arch::Qwen3Moe, "blk.5.exp_probs_b.bias"), None);
    // MiniMax-M2 keeps the hub's block_sparse_moe names.
    assert_eq!(
        hf_name(Arch::MiniMaxM2, "blk.4.exp_probs_b.bias"),
        Some(HfName::Plain(
            "model.layers.4.block_sparse_moe.e_score_correction_bias".into()
        ))
    );
    assert_eq!(
        hf_name(Arch::MiniMaxM2, "blk.4.ffn_down_exps.weight"),
        Some(HfName::Experts {
            prefix: "model.layers.4.block_sparse_moe.experts".into(),
            suffix: "w2.weight".into()
        })
    );
    assert_eq!(hf_name(Arch::Olmoe, "blk.5.attn_k_b.weight"), None);
    assert_eq!(hf_name(Arch::Llama, "blk.x.attn_q.weight"), None);
}

#[test]
fn missing_and_malformed_keys_are_named() {
    let mut m = BTreeMap::new();
    m.insert(
        "llama.embedding_length".to_string(),
        GgufValue::Str("64".into()),
    );
    let e = hf_config(Arch::Llama, &m, &[]).unwrap_err();
    assert!(e.contains("llama.embedding_length"), "{e}");
    m.insert("llama.embedding_length".to_string(), GgufValue::Int(64));
    let e = hf_config(Arch::Llama, &m, &[]).unwrap_err();
    assert!(
        e.contains("missing metadata key \"llama.attention.head_count\""),
        "{e}"
    );
    assert!(Arch::from_gguf("mamba").unwrap_err().contains("mamba"));
}

#[test]
fn gpt_oss_names_and_config_as_its_converter_writes_them() {
    let plain = |s: &str| Some(HfName::Plain(s.to_string()));
    assert_eq!(
        hf_name(Arch::GptOss, "blk.2.attn_sinks.weight"),
        plain("model.layers.2.self_attn.sinks")
    );
    assert_eq!(
        hf_name(Arch::GptOss, "blk.2.ffn_gate_inp.bias"),
        plain("model.layers.2.mlp.router.bias")
    );
    assert_eq!(
        hf_name(Arch::GptOss, "blk.2.attn_output.bias"),
        plain("model.layers.2.self_attn.o_proj.bias")
    );
    // The experts' biases stay stacked under one name; their matrices split per expert.
    assert_eq!(
        hf_name(Arch::GptOss, "blk.0.ffn_up_exps.bias"),
        plain("model.layers.0.mlp.experts.up_proj_bias")
    );
    assert_eq!(
        hf_name(Arch::GptOss, "blk.0.ffn_up_exps.weight"),
        Some(HfName::Experts {
            prefix: "model.layers.0.mlp.experts".into(),
            suffix: "up_proj.weight".into()
        })
    );
    assert_eq!(
        hf_name(Arch::GptOss, "blk.0.post_attention_norm.weight"),
        plain("model.layers.0.post_attention_layernorm.weight")
    );
    assert_eq!(hf_name(Arch::GptOss, "blk.0.ffn_norm.weight"), None);
    assert_eq!(hf_name(Arch::Qwen3Moe, "blk.0.attn_sinks.weight"), None);

    let mut m = BTreeMap::new();
    for (k, v) in [
        ("embedding_length", 64),
        ("block_count", 2),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("expert_count", 4),
        ("expert_used_count", 2),
        ("expert_feed_forward_length", 32),
        ("rope.scaling.original_context_length", 4096),
    ] {
        m.insert(format!("gpt-oss.{k}"), GgufValue::Int(v));
    }
    m.insert("gpt-oss.rope.freq_base".into(), GgufValue::Float(150000.0));
    let vocab = GgufValue::Array(vec![GgufValue::Str("a".into()); 8]);
    m.insert("tokenizer.ggml.tokens".into(), vocab);
    m.insert("gpt-oss.rope.scaling.factor".into(), GgufValue::Float(32.0));
    m.insert(
        "gpt-oss.rope.scaling.type".into(),
        GgufValue::Str("yarn".into()),
    );
    let e = hf_config(Arch::GptOss, &m, &[]).unwrap_err();
    assert!(e.contains("\"gpt-oss.attention.sliding_window\""), "{e}");
    m.insert(
        "gpt-oss.attention.sliding_window".into(),
        GgufValue::Int(128),
    );
    let c = hf_config(Arch::GptOss, &m, &[]).unwrap();
    assert_eq!(c["model_type"], "gpt_oss");
    assert_eq!(c["sliding_window"], 128);
    assert_eq!(c["intermediate_size"], 32);
    assert_eq!(c["num_local_experts"], 4);
    // The release's YaRN: no truncation of the correction range.
    assert_eq!(c["rope_scaling"]["truncate"], false);
    assert_eq!(c["rope_scaling"]["factor"], 32.0);
    m.insert(
        "gpt-oss.rope.freq_base_swa".into(),
        GgufValue::Float(10000.0),
    );
    let e = hf_config(Arch::GptOss, &m, &[]).unwrap_err();
    assert!(e.contains("gpt-oss.rope.freq_base_swa"), "{e}");
}

#[test]
fn qwen3next_names_and_config_as_its_converter_writes_them() {
    let plain = |s: &str| Some(HfName::Plain(s.to_string()));
    let q = |n: &str| hf_name(Arch::Qwen3Next, n);
    assert_eq!(
        q("blk.0.attn_qkv.weight"),
        plain("model.layers.0.linear_attn.in_proj_qkv.weight")
    );
    assert_eq!(
        q("blk.0.attn_gate.weight"),
        plain("model.layers.0.linear_attn.in_proj_z.weight")
    );
    // `-exp(A_log)` under a name of its own, never read as `A_log`.
    assert_eq!(q("blk.0.ssm_a"), plain("model.layers.0.linear_attn.neg_A"));
    assert_eq!(
        q("blk.0.ssm_dt.bias"),
        plain("model.layers.0.linear_attn.dt_bias")
    );
    assert_eq!(
        q("blk.1.ffn_gate_inp_shexp.weight"),
        plain("model.layers.1.mlp.shared_expert_gate.weight")
    );
    assert_eq!(
        q("blk.1.post_attention_norm.weight"),
        plain("model.layers.1.post_attention_layernorm.weight")
    );
    assert_eq!(
        q("blk.48.nextn.eh_proj.weight"),
        plain("model.layers.48.eh_proj.weight")
    );
    assert_eq!(hf_name(Arch::Qwen3Moe, "blk.0.ssm_a"), None);

    let mut m = BTreeMap::new();
    for (k, v) in [
        ("embedding_length", 64),
        ("block_count", 4),
        ("nextn_predict_layers", 1),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 32),
        ("expert_count", 4),
        ("expert_used_count", 2),
        ("expert_feed_forward_length", 16),
        ("expert_shared_feed_forward_length", 24),
        ("ssm.conv_kernel", 4),
        ("ssm.state_size", 16),
        ("ssm.group_count", 2),
        ("ssm.time_step_rank", 4),
        ("ssm.inner_size", 48),
        ("rope.dimension_count", 8),
    ] {
        m.insert(format!("qwen3next.{k}"), GgufValue::Int(v));
    }
    let vocab = GgufValue::Array(vec![GgufValue::Str("a".into()); 8]);
    m.insert("tokenizer.ggml.tokens".into(), vocab);
    let flags = [true, false, true, false].map(GgufValue::Bool).to_vec();
    m.insert(
        "qwen3next.attention.recurrent_layers".into(),
        GgufValue::Array(flags),
    );
    let c = hf_config(Arch::Qwen3Next, &m, &[]).unwrap();
    assert_eq!(c["model_type"], "qwen3_next");
    // The MTP block is counted in block_count and left out.
    assert_eq!(c["num_hidden_layers"], 3);
    assert_eq!(c["linear_value_head_dim"], 12);
    assert_eq!(c["linear_num_key_heads"], 2);
    assert_eq!(c["partial_rotary_factor"], 0.25);
    assert_eq!(
        c["layer_types"],
        json!(["linear_attention", "full_attention", "linear_attention"])
    );
    assert_eq!(c["norms_stored_one_plus"], true);
    m.insert("qwen3next.ssm.inner_size".into(), GgufValue::Int(50));
    let e = hf_config(Arch::Qwen3Next, &m, &[]).unwrap_err();
    assert!(e.contains("qwen3next.ssm.inner_size"), "{e}");
    m.insert("qwen3next.ssm.inner_size".into(), GgufValue::Int(48));
    m.insert(
        "qwen3next.attention.recurrent_layers".into(),
        GgufValue::Array(vec![GgufValue::Bool(true)]),
    );
    let e = hf_config(Arch::Qwen3Next, &m, &[]).unwrap_err();
    assert!(e.contains("qwen3next.attention.recurrent_layers"), "{e}");
}
