//! Censuses: checkpoints at real size and tensor count whose shards hold only their
//! headers (the payload is a hole in a sparse file), so a 60-750 GB model takes no disk.
//! For benchmarking the header scan and `coli plan` on each family's real layout.

use std::collections::BTreeMap;
use std::path::Path;

/// A tensor of a census: name, safetensors dtype, shape.
type Entry = (String, &'static str, Vec<usize>);

/// Which checkpoint a census copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Census {
    /// GLM-5: 78 layers x 256 FP8 experts, MLA + DSA indexer, 60 shards.
    Glm5,
    /// gpt-oss-120b: 36 layers x 128 MXFP4 experts (fused per layer), 15 shards.
    GptOss120b,
    /// MiniMax-M2: 62 layers x 256 FP8 experts, 130 shards.
    MiniMaxM2,
}

impl Census {
    /// From its command-line name.
    pub fn parse(s: &str) -> Option<Census> {
        match s {
            "glm5" => Some(Census::Glm5),
            "gpt-oss-120b" => Some(Census::GptOss120b),
            "minimax-m2" => Some(Census::MiniMaxM2),
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
