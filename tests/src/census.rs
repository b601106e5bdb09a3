//! Censuses: checkpoints at real size and tensor count whose shards hold only their
//! headers (the payload is a hole in a sparse file), so a 60-750 GB model takes no disk.
//! For benchmarking the header scan and `coli plan` on each family's real layout.

use std::collections::BTreeMap;
use std::path::Path;

/// A tensor of a census: name, safetensors dtype, shape.
pub(crate) type Entry = (String, &'static str, Vec<usize>);

/// Which checkpoint a census copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Census {
    /// GLM-5: 78 layers x 256 FP8 experts, MLA + DSA indexer, 60 shards.
    Glm5,
    /// gpt-oss-120b: 36 layers x 128 MXFP4 experts (fused per layer), 15 shards.
    GptOss120b,
    /// MiniMax-M2: 62 layers x 256 FP8 experts, 130 shards.
    MiniMaxM2,
    /// Qwen3-Next-80B-A3B: 48 hybrid layers x 512 BF16 experts (per expert), 41 shards.
    Qwen3Next80b,
    /// Qwen3.5-35B-A3B as the hub ships it: 40 hybrid layers x 256 BF16 experts fused per
    /// layer, under `model.language_model` beside a vision tower, 14 shards.
    Qwen35Moe35b,
    /// DeepSeek-V4-Flash's geometry and the release's tensor names, in BF16 (the release
    /// stores FP8 dense and FP4 experts, which coli does not read yet): 43 layers x 256
    /// experts, 46 shards.
    DeepseekV4FlashBf16,
    /// DeepSeek-V4-Flash as released: the same layers with FP8 dense projections (E8M0
    /// `.scale` per 128 x 128 block) and FP4 experts (a `.scale` per 32 columns), 46 shards.
    DeepseekV4Flash,
}

impl Census {
    /// From its command-line name.
    pub fn parse(s: &str) -> Option<Census> {
        match s {
            "glm5" => Some(Census::Glm5),
            "gpt-oss-120b" => Some(Census::GptOss120b),
            "minimax-m2" => Some(Census::MiniMaxM2),
            "qwen3-next-80b" => Some(Census::Qwen3Next80b),
            "qwen3.5-35b" => Some(Census::Qwen35Moe35b),
            "deepseek-v4-flash-bf16" => Some(Census::DeepseekV4FlashBf16),
            "deepseek-v4-flash" => Some(Census::DeepseekV4Flash),
            _ => None,
        }
    }
}

/// Writes the census into `dir` (created). Returns the tensor count.
pub fn write_census(dir: &Path, which: Census) -> std::io::Result<usize> {
    let (tensors, shards, config) = match which {
        Census::Glm5 => glm5(78, 256),
        Census::GptOss120b => gpt_oss_120b(),
        Census::MiniMaxM2 => minimax_m2(),
        Census::Qwen3Next80b => qwen3_next_80b(),
        Census::Qwen35Moe35b => qwen3_5_35b(),
        Census::DeepseekV4FlashBf16 => {
            let (layers, experts) = (43, 256);
            let mut t = v4_top();
            v4_layers(&mut t, layers, experts);
            let mut config = v4_flash_config(layers, experts);
            config["coli_synthetic_census"] = true.into();
            (t, 46, config)
        }
        Census::DeepseekV4Flash => {
            let (layers, experts) = (43, 256);
            let mut t = v4_top();
            v4_layers(&mut t, layers, experts);
            let mut config = v4_flash_config(layers, experts);
            config["coli_synthetic_census"] = true.into();
            config["expert_dtype"] = "fp4".into();
            config["quantization_config"] = serde_json::json!({
                "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
            });
            (v4_release_dtypes(t), 46, config)
        }
    };
    write_sparse(dir, &tensors, shards, &config)
}

/// Grouped-query attention's projections: name, rows, columns.
fn gqa_projections(
    h: usize,
    heads: usize,
    kv: usize,
    hd: usize,
) -> [(&'static str, usize, usize); 4] {
    [
        ("q_proj", heads * hd, h),
        ("k_proj", kv * hd, h),
        ("v_proj", kv * hd, h),
        ("o_proj", h, heads * hd),
    ]
}

/// FP8 weight and its 128 x 128 `weight_scale_inv` grid.
fn fp8(name: String, r: usize, c: usize) -> [Entry; 2] {
    [
        (format!("{name}.weight"), "F8_E4M3", vec![r, c]),
        (
            format!("{name}.weight_scale_inv"),
            "F32",
            vec![r.div_ceil(128), c.div_ceil(128)],
        ),
    ]
}

/// GLM-5: `layers` decoder layers of `experts` FP8 experts (weight and
/// `weight_scale_inv` for gate/up/down), MLA + indexer + shared experts, 60 shards.
fn glm5(layers: usize, experts: usize) -> (Vec<Entry>, usize, serde_json::Value) {
    let (h, inter, q, kv) = (6144usize, 2048usize, 2048usize, 512usize);
    let mut tensors: Vec<Entry> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![154880, h]),
        ("lm_head.weight".into(), "BF16", vec![154880, h]),
        ("model.norm.weight".into(), "BF16", vec![h]),
    ];
    let blocks = |r: usize, c: usize| vec![r.div_ceil(128), c.div_ceil(128)];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (n, r, c) in [
            ("self_attn.q_a_proj", q, h),
            ("self_attn.q_b_proj", 64 * 256, q),
            ("self_attn.kv_a_proj_with_mqa", kv + 64, h),
            ("self_attn.kv_b_proj", 64 * 448, kv),
            ("self_attn.o_proj", h, 64 * 256),
            ("self_attn.indexer.wq_b", 32 * 128, q),
            ("self_attn.indexer.wk", 128, h),
            ("self_attn.indexer.weights_proj", 32, h),
            ("mlp.shared_experts.gate_proj", inter, h),
            ("mlp.shared_experts.up_proj", inter, h),
            ("mlp.shared_experts.down_proj", h, inter),
        ] {
            tensors.push((format!("{p}.{n}.weight"), "F8_E4M3", vec![r, c]));
            tensors.push((format!("{p}.{n}.weight_scale_inv"), "F32", blocks(r, c)));
        }
        for (n, len) in [
            ("input_layernorm.weight", h),
            ("post_attention_layernorm.weight", h),
            ("self_attn.q_a_layernorm.weight", q),
            ("self_attn.kv_a_layernorm.weight", kv),
            ("self_attn.indexer.k_norm.weight", 128),
            ("self_attn.indexer.k_norm.bias", 128),
        ] {
            tensors.push((format!("{p}.{n}"), "BF16", vec![len]));
        }
        tensors.push((format!("{p}.mlp.gate.weight"), "F32", vec![experts, h]));
        tensors.push((
            format!("{p}.mlp.gate.e_score_correction_bias"),
            "F32",
            vec![experts],
        ));
        for e in 0..experts {
            for (n, r, c) in [
                ("gate_proj", inter, h),
                ("up_proj", inter, h),
                ("down_proj", h, inter),
            ] {
                let name = format!("{p}.mlp.experts.{e}.{n}");
                tensors.push((format!("{name}.weight"), "F8_E4M3", vec![r, c]));
                tensors.push((format!("{name}.weight_scale_inv"), "F32", blocks(r, c)));
            }
        }
    }
    let config = serde_json::json!({
        "model_type": "glm_moe_dsa", "num_hidden_layers": layers, "hidden_size": h,
        "n_routed_experts": experts, "num_experts_per_tok": 8, "vocab_size": 154880,
        "num_attention_heads": 64, "kv_lora_rank": kv, "q_lora_rank": q, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 192, "v_head_dim": 256, "index_head_dim": 128, "index_n_heads": 32,
        "index_topk": 2048, "moe_intermediate_size": inter, "intermediate_size": 12288,
        "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 0, "rms_norm_eps": 1e-5, "max_position_embeddings": 202752,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        "coli_synthetic_census": true,
    });
    (tensors, 60, config)
}

/// gpt-oss-120b as released: 36 layers, 128 experts each stored as MXFP4 blocks and E8M0
/// scales fused per layer, attention with biases and sinks, 15 shards.
fn gpt_oss_120b() -> (Vec<Entry>, usize, serde_json::Value) {
    let (layers, experts, h, inter, heads, kv, hd, vocab) = (
        36usize,
        128usize,
        2880usize,
        2880usize,
        64usize,
        8usize,
        64usize,
        201_088usize,
    );
    let mut t: Vec<Entry> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![vocab, h]),
        ("lm_head.weight".into(), "BF16", vec![vocab, h]),
        ("model.norm.weight".into(), "BF16", vec![h]),
    ];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (n, r, c) in gqa_projections(h, heads, kv, hd) {
            t.push((format!("{p}.self_attn.{n}.weight"), "BF16", vec![r, c]));
            t.push((format!("{p}.self_attn.{n}.bias"), "BF16", vec![r]));
        }
        t.push((format!("{p}.self_attn.sinks"), "BF16", vec![heads]));
        t.push((format!("{p}.input_layernorm.weight"), "BF16", vec![h]));
        t.push((
            format!("{p}.post_attention_layernorm.weight"),
            "BF16",
            vec![h],
        ));
        t.push((format!("{p}.mlp.router.weight"), "BF16", vec![experts, h]));
        t.push((format!("{p}.mlp.router.bias"), "BF16", vec![experts]));
        for (n, r, c) in [("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)] {
            let x = format!("{p}.mlp.experts.{n}");
            t.push((format!("{x}_blocks"), "U8", vec![experts, r, c / 32, 16]));
            t.push((format!("{x}_scales"), "U8", vec![experts, r, c / 32]));
            t.push((format!("{x}_bias"), "BF16", vec![experts, r]));
        }
    }
    let layer_types: Vec<&str> = (0..layers)
        .map(|i| {
            if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let config = serde_json::json!({
        "model_type": "gpt_oss", "num_hidden_layers": layers, "hidden_size": h,
        "intermediate_size": inter, "num_local_experts": experts, "num_experts_per_tok": 4,
        "experts_per_token": 4, "vocab_size": vocab, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hd, "sliding_window": 128,
        "layer_types": layer_types, "swiglu_limit": 7.0, "rms_norm_eps": 1e-5,
        "rope_theta": 150000, "max_position_embeddings": 131072, "attention_bias": true,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": false, "original_max_position_embeddings": 4096},
        "tie_word_embeddings": false, "eos_token_id": 200002,
        "quantization_config": {"quant_method": "mxfp4"},
        "coli_synthetic_census": true,
    });
    (t, 15, config)
}

/// MiniMax-M2 as released: 62 layers of 256 FP8 experts (`w1`/`w2`/`w3` with 128 x 128
/// scales), FP8 attention with full-projection q/k norms, 130 shards.
fn minimax_m2() -> (Vec<Entry>, usize, serde_json::Value) {
    let (layers, experts, h, inter, heads, kv, hd, vocab) = (
        62usize,
        256usize,
        3072usize,
        1536usize,
        48usize,
        8usize,
        128usize,
        200_064usize,
    );
    let mut t: Vec<Entry> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![vocab, h]),
        ("lm_head.weight".into(), "BF16", vec![vocab, h]),
        ("model.norm.weight".into(), "BF16", vec![h]),
    ];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (n, r, c) in gqa_projections(h, heads, kv, hd) {
            t.extend(fp8(format!("{p}.self_attn.{n}"), r, c));
        }
        t.push((
            format!("{p}.self_attn.q_norm.weight"),
            "BF16",
            vec![heads * hd],
        ));
        t.push((
            format!("{p}.self_attn.k_norm.weight"),
            "BF16",
            vec![kv * hd],
        ));
        t.push((format!("{p}.input_layernorm.weight"), "BF16", vec![h]));
        t.push((
            format!("{p}.post_attention_layernorm.weight"),
            "BF16",
            vec![h],
        ));
        let m = format!("{p}.block_sparse_moe");
        t.push((format!("{m}.gate.weight"), "BF16", vec![experts, h]));
        t.push((format!("{m}.e_score_correction_bias"), "F32", vec![experts]));
        for e in 0..experts {
            for (n, r, c) in [("w1", inter, h), ("w3", inter, h), ("w2", h, inter)] {
                t.extend(fp8(format!("{m}.experts.{e}.{n}"), r, c));
            }
        }
    }
    let config = serde_json::json!({
        "model_type": "minimax_m2", "num_hidden_layers": layers, "hidden_size": h,
        "intermediate_size": inter, "num_local_experts": experts, "num_experts_per_tok": 8,
        "vocab_size": vocab, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": hd, "rotary_dim": 64, "rope_theta": 5000000, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 196608, "tie_word_embeddings": false, "eos_token_id": 200020,
        "quantization_config": {"quant_method": "fp8", "fmt": "float8_e4m3fn",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        "coli_synthetic_census": true,
    });
    (t, 130, config)
}

/// The hybrid layers of Qwen3-Next / Qwen3.5 under `{m}.layers`: every 4th layer gated full
/// attention (16 heads, 2 KV heads, head_dim 256), the others Gated DeltaNet (16 key and 32
/// value heads of 128); each a MoE of `experts` BF16 experts of width 512 (per expert, or
/// fused) plus a shared expert.
pub(crate) fn hybrid_layers(
    t: &mut Vec<Entry>,
    m: &str,
    layers: usize,
    experts: usize,
    h: usize,
    qwen35: bool,
) {
    let (inter, heads, kv, hd, nk, nv, d) = (512usize, 16usize, 2usize, 256usize, 16, 32, 128);
    let (kd, vd) = (nk * d, nv * d);
    let bf = |n: String, shape: Vec<usize>| (n, "BF16", shape);
    for l in 0..layers {
        let p = format!("{m}.layers.{l}");
        if (l + 1) % 4 == 0 {
            for (n, r, c) in gqa_projections(h, heads, kv, hd) {
                let r = if n == "q_proj" { 2 * r } else { r };
                t.push(bf(format!("{p}.self_attn.{n}.weight"), vec![r, c]));
            }
            for n in ["q_norm", "k_norm"] {
                t.push(bf(format!("{p}.self_attn.{n}.weight"), vec![hd]));
            }
        } else {
            let a = format!("{p}.linear_attn");
            if qwen35 {
                t.push(bf(format!("{a}.in_proj_qkv.weight"), vec![2 * kd + vd, h]));
                t.push(bf(format!("{a}.in_proj_z.weight"), vec![vd, h]));
                t.push(bf(format!("{a}.in_proj_b.weight"), vec![nv, h]));
                t.push(bf(format!("{a}.in_proj_a.weight"), vec![nv, h]));
            } else {
                t.push(bf(
                    format!("{a}.in_proj_qkvz.weight"),
                    vec![2 * kd + 2 * vd, h],
                ));
                t.push(bf(format!("{a}.in_proj_ba.weight"), vec![2 * nv, h]));
            }
            t.push(bf(format!("{a}.conv1d.weight"), vec![2 * kd + vd, 1, 4]));
            t.push(bf(format!("{a}.dt_bias"), vec![nv]));
            t.push((format!("{a}.A_log"), "F32", vec![nv]));
            t.push(bf(format!("{a}.norm.weight"), vec![d]));
            t.push(bf(format!("{a}.out_proj.weight"), vec![h, vd]));
        }
        t.push(bf(format!("{p}.input_layernorm.weight"), vec![h]));
        t.push(bf(format!("{p}.post_attention_layernorm.weight"), vec![h]));
        let mlp = format!("{p}.mlp");
        t.push(bf(format!("{mlp}.gate.weight"), vec![experts, h]));
        t.push(bf(format!("{mlp}.shared_expert_gate.weight"), vec![1, h]));
        for (n, r, c) in [
            ("gate_proj", inter, h),
            ("up_proj", inter, h),
            ("down_proj", h, inter),
        ] {
            t.push(bf(format!("{mlp}.shared_expert.{n}.weight"), vec![r, c]));
        }
        if qwen35 {
            t.push(bf(
                format!("{mlp}.experts.gate_up_proj"),
                vec![experts, 2 * inter, h],
            ));
            t.push(bf(
                format!("{mlp}.experts.down_proj"),
                vec![experts, h, inter],
            ));
        } else {
            for e in 0..experts {
                for (n, r, c) in [
                    ("gate_proj", inter, h),
                    ("up_proj", inter, h),
                    ("down_proj", h, inter),
                ] {
                    t.push(bf(format!("{mlp}.experts.{e}.{n}.weight"), vec![r, c]));
                }
            }
        }
    }
}

/// The text keys both hybrids share.
pub(crate) fn hybrid_text_config(
    layers: usize,
    experts: usize,
    top_k: usize,
    vocab: usize,
) -> serde_json::Value {
    serde_json::json!({
        "num_hidden_layers": layers, "hidden_size": 2048, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "num_experts": experts,
        "num_experts_per_tok": top_k, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "vocab_size": vocab, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144, "tie_word_embeddings": false,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25},
    })
}

/// Qwen3-Next-80B-A3B as released: 48 layers of 512 BF16 experts stored per expert.
fn qwen3_next_80b() -> (Vec<Entry>, usize, serde_json::Value) {
    let (layers, experts, h, vocab) = (48usize, 512usize, 2048usize, 151_936usize);
    let mut t: Vec<Entry> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![vocab, h]),
        ("lm_head.weight".into(), "BF16", vec![vocab, h]),
        ("model.norm.weight".into(), "BF16", vec![h]),
    ];
    hybrid_layers(&mut t, "model", layers, experts, h, false);
    // The MTP head the release ships (never read): one hybrid layer of its own.
    let mut mtp = Vec::new();
    hybrid_layers(&mut mtp, "mtp", 4, experts, h, false);
    t.extend(
        mtp.into_iter()
            .filter(|(n, _, _)| n.starts_with("mtp.layers.3.")),
    );
    t.push(("mtp.fc.weight".into(), "BF16", vec![h, 2 * h]));
    let mut config = hybrid_text_config(layers, experts, 10, vocab);
    config["model_type"] = "qwen3_next".into();
    config["intermediate_size"] = 5120.into();
    config["norm_topk_prob"] = true.into();
    config["eos_token_id"] = 151645.into();
    config["coli_synthetic_census"] = true.into();
    (t, 41, config)
}

/// Qwen3.5-35B-A3B as the hub ships it: the text model (40 layers of 256 experts fused per
/// layer) under `model.language_model`, a vision tower under `model.visual`, an MTP head.
fn qwen3_5_35b() -> (Vec<Entry>, usize, serde_json::Value) {
    let (layers, experts, h, vocab) = (40usize, 256usize, 2048usize, 248_320usize);
    let m = "model.language_model";
    let mut t: Vec<Entry> = vec![
        (format!("{m}.embed_tokens.weight"), "BF16", vec![vocab, h]),
        ("lm_head.weight".into(), "BF16", vec![vocab, h]),
        (format!("{m}.norm.weight"), "BF16", vec![h]),
    ];
    hybrid_layers(&mut t, m, layers, experts, h, true);
    let vh = 1152usize;
    for b in 0..27 {
        let p = format!("model.visual.blocks.{b}");
        t.push((format!("{p}.attn.qkv.weight"), "BF16", vec![3 * vh, vh]));
        t.push((format!("{p}.attn.proj.weight"), "BF16", vec![vh, vh]));
        t.push((format!("{p}.mlp.linear_fc1.weight"), "BF16", vec![4304, vh]));
        t.push((format!("{p}.mlp.linear_fc2.weight"), "BF16", vec![vh, 4304]));
    }
    t.push(("mtp.fc.weight".into(), "BF16", vec![h, 2 * h]));
    let mut text = hybrid_text_config(layers, experts, 8, vocab);
    text["model_type"] = "qwen3_5_moe_text".into();
    let config = serde_json::json!({
        "model_type": "qwen3_5_moe", "text_config": text, "tie_word_embeddings": false,
        "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 27, "hidden_size": vh},
        "eos_token_id": 248046, "coli_synthetic_census": true,
    });
    (t, 14, config)
}

/// DeepSeek-V4-Flash's shape: hidden, vocab, heads, head_dim, q_lora_rank, expert width,
/// head groups, group rank, indexer heads, indexer width, streams.
pub(crate) const V4_FLASH: [usize; 11] = [4096, 129_280, 64, 512, 1024, 2048, 8, 1024, 64, 128, 4];

/// DeepSeek-V4's tensors outside the layers, with the release's names.
pub(crate) fn v4_top() -> Vec<Entry> {
    let [h, vocab, .., hc] = V4_FLASH;
    vec![
        ("embed.weight".into(), "BF16", vec![vocab, h]),
        ("head.weight".into(), "BF16", vec![vocab, h]),
        ("norm.weight".into(), "BF16", vec![h]),
        ("hc_head_fn".into(), "F32", vec![hc, hc * h]),
        ("hc_head_base".into(), "F32", vec![hc]),
        ("hc_head_scale".into(), "F32", vec![1]),
    ]
}

/// The compression rate of DeepSeek-V4's layer `l` by the configuration's default
/// schedule: two HCA layers (128), then HCA and CSA (4) alternating.
pub(crate) fn v4_rate(l: usize) -> usize {
    if l >= 2 && (l - 2) % 2 == 1 {
        4
    } else {
        128
    }
}

/// DeepSeek-V4-Flash's decoder layers with the release's names (BF16; the first three
/// route by the token table).
pub(crate) fn v4_layers(t: &mut Vec<Entry>, layers: usize, experts: usize) {
    let [h, vocab, heads, hd, qr, inter, groups, orank, ih, id, hc] = V4_FLASH;
    let bf = |n: String, shape: Vec<usize>| (n, "BF16", shape);
    let f32 = |n: String, shape: Vec<usize>| (n, "F32", shape);
    for l in 0..layers {
        let p = format!("layers.{l}");
        t.push(bf(format!("{p}.attn_norm.weight"), vec![h]));
        t.push(bf(format!("{p}.ffn_norm.weight"), vec![h]));
        for which in ["attn", "ffn"] {
            t.push(f32(
                format!("{p}.hc_{which}_fn"),
                vec![(2 + hc) * hc, hc * h],
            ));
            t.push(f32(format!("{p}.hc_{which}_base"), vec![(2 + hc) * hc]));
            t.push(f32(format!("{p}.hc_{which}_scale"), vec![3]));
        }
        let a = format!("{p}.attn");
        t.push(bf(format!("{a}.wq_a.weight"), vec![qr, h]));
        t.push(bf(format!("{a}.q_norm.weight"), vec![qr]));
        t.push(bf(format!("{a}.wq_b.weight"), vec![heads * hd, qr]));
        t.push(bf(format!("{a}.wkv.weight"), vec![hd, h]));
        t.push(bf(format!("{a}.kv_norm.weight"), vec![hd]));
        t.push(bf(
            format!("{a}.wo_a.weight"),
            vec![groups * orank, heads * hd / groups],
        ));
        t.push(bf(format!("{a}.wo_b.weight"), vec![h, groups * orank]));
        t.push(f32(format!("{a}.attn_sink"), vec![heads]));
        let rate = v4_rate(l);
        let series = if rate == 4 { 2 } else { 1 };
        let c = format!("{a}.compressor");
        t.push(bf(format!("{c}.wkv.weight"), vec![series * hd, h]));
        t.push(bf(format!("{c}.wgate.weight"), vec![series * hd, h]));
        t.push(f32(format!("{c}.ape"), vec![rate, series * hd]));
        t.push(bf(format!("{c}.norm.weight"), vec![hd]));
        if rate == 4 {
            let i = format!("{a}.indexer");
            t.push(bf(format!("{i}.compressor.wkv.weight"), vec![2 * id, h]));
            t.push(bf(format!("{i}.compressor.wgate.weight"), vec![2 * id, h]));
            t.push(f32(format!("{i}.compressor.ape"), vec![4, 2 * id]));
            t.push(bf(format!("{i}.compressor.norm.weight"), vec![id]));
            t.push(bf(format!("{i}.wq_b.weight"), vec![ih * id, qr]));
            t.push(bf(format!("{i}.weights_proj.weight"), vec![ih, h]));
        }
        let f = format!("{p}.ffn");
        t.push(bf(format!("{f}.gate.weight"), vec![experts, h]));
        if l < 3 {
            t.push((format!("{f}.gate.tid2eid"), "I32", vec![vocab, 6]));
        } else {
            t.push(f32(format!("{f}.gate.bias"), vec![experts]));
        }
        for (n, r, c) in [("w1", inter, h), ("w3", inter, h), ("w2", h, inter)] {
            t.push(bf(format!("{f}.shared_experts.{n}.weight"), vec![r, c]));
        }
        for e in 0..experts {
            for (n, r, c) in [("w1", inter, h), ("w3", inter, h), ("w2", h, inter)] {
                t.push(bf(format!("{f}.experts.{e}.{n}.weight"), vec![r, c]));
            }
        }
    }
}

/// DeepSeek-V4's BF16 entries in the release's dtypes: the attention's and the shared
/// experts' projections FP8 with an E8M0 scale per 128 x 128 block, the routed experts FP4
/// (two per byte, stored I8) with an E8M0 scale per 32 columns; the rest unchanged.
pub(crate) fn v4_release_dtypes(t: Vec<Entry>) -> Vec<Entry> {
    let fp8 = [
        ".attn.wq_a.weight",
        ".attn.wq_b.weight",
        ".attn.wkv.weight",
        ".attn.wo_a.weight",
        ".attn.wo_b.weight",
        ".attn.indexer.wq_b.weight",
    ];
    let mut out = Vec::with_capacity(t.len() * 2);
    for (name, dtype, shape) in t {
        let stem = name.strip_suffix(".weight").unwrap_or(&name).to_string();
        let (r, c) = (shape[0], *shape.last().expect("shape"));
        if name.contains(".ffn.experts.") {
            out.push((name, "I8", vec![r, c / 2]));
            out.push((format!("{stem}.scale"), "F8_E8M0", vec![r, c / 32]));
        } else if fp8.iter().any(|s| name.ends_with(s)) || name.contains(".ffn.shared_experts.") {
            out.push((name, "F8_E4M3", vec![r, c]));
            out.push((
                format!("{stem}.scale"),
                "F8_E8M0",
                vec![r.div_ceil(128), c.div_ceil(128)],
            ));
        } else {
            out.push((name, dtype, shape));
        }
    }
    out
}

/// DeepSeek-V4-Flash's config.json keys (the release's legacy spelling) for `layers` layers
/// of `experts` experts.
pub(crate) fn v4_flash_config(layers: usize, experts: usize) -> serde_json::Value {
    let ratios: Vec<usize> = (0..layers).map(v4_rate).collect();
    serde_json::json!({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": V4_FLASH[1], "hidden_size": V4_FLASH[0], "num_hidden_layers": layers,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
        "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
        "moe_intermediate_size": 2048, "n_routed_experts": experts, "n_shared_experts": 1,
        "num_experts_per_tok": 6, "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5,
        "num_hash_layers": 3, "compress_ratios": ratios, "sliding_window": 128,
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "hc_mult": 4,
        "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0, "rms_norm_eps": 1e-6,
        "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1_048_576, "tie_word_embeddings": false,
        "bos_token_id": 0, "eos_token_id": 1,
    })
}

/// Spreads `tensors` over `shards` sparse files (headers only), with the index and config.
fn write_sparse(
    dir: &Path,
    tensors: &[Entry],
    shards: usize,
    config: &serde_json::Value,
) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let count = tensors.len();
    let per = count.div_ceil(shards);
    let mut weight_map = BTreeMap::new();
    for (i, chunk) in tensors.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", i + 1);
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut off = 0usize;
        for (name, dtype, shape) in chunk {
            let size = coli_core::safetensors_header::dtype_size(dtype).expect("dtype")
                * shape.iter().product::<usize>();
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}),
            );
            off += size;
            weight_map.insert(name.clone(), file.clone());
        }
        let mut json = serde_json::to_vec(&serde_json::Value::Object(header)).expect("json");
        while !json.len().is_multiple_of(8) {
            json.push(b' ');
        }
        let path = dir.join(&file);
        let mut f = std::fs::File::create(&path)?;
        use std::io::Write;
        f.write_all(&(json.len() as u64).to_le_bytes())?;
        f.write_all(&json)?;
        f.set_len((8 + json.len() + off) as u64)?;
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec(&index).expect("json"),
    )?;
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(config).expect("json"),
    )?;
    Ok(count)
}
