//! The synthetic DeepSeek-V3 model (MLA, sigmoid group routing, shared experts, the MTP
//! layer), on the shared writers of [`super`].

use std::collections::BTreeMap;
use std::path::Path;

use coli_core::write::TensorData;
use coli_core::DType;

use super::*;

/// Shape of a synthetic DeepSeek-V3-architecture model: multi-head latent attention with
/// low-rank queries, the first `dense_layers` layers dense, the rest sigmoid-routed MoE with
/// group-limited top-k and shared experts, and (when `mtp`) the MTP layer after them.
#[derive(Clone, Debug)]
pub struct DeepseekSpec {
    /// Residual width.
    pub hidden: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Attention heads.
    pub heads: usize,
    /// Rank of the query compression.
    pub q_lora_rank: usize,
    /// Rank of the key/value latent.
    pub kv_lora_rank: usize,
    /// Non-rotary query/key dims per head.
    pub qk_nope_head_dim: usize,
    /// Rotary dims per head.
    pub qk_rope_head_dim: usize,
    /// Value dims per head.
    pub v_head_dim: usize,
    /// Width of the dense layers' MLP.
    pub intermediate: usize,
    /// Width of each routed (and shared) expert.
    pub moe_intermediate: usize,
    /// Decoder layers (the MTP layer comes after them).
    pub layers: usize,
    /// Leading dense layers (`first_k_dense_replace`).
    pub dense_layers: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Expert groups.
    pub n_group: usize,
    /// Groups a token may route to.
    pub topk_group: usize,
    /// Shared experts per MoE layer.
    pub shared_experts: usize,
    /// Whether the checkpoint holds an MTP layer (`model.layers.{layers}`).
    pub mtp: bool,
    /// Routed experts stored as coli int8 (per-row scales) instead of bf16.
    pub int8_experts: bool,
    /// Seed of the weights.
    pub seed: u64,
}

impl DeepseekSpec {
    /// DeepSeek-V3's geometry (hidden 7168, 128 MLA heads, q/kv ranks 1536/512, vocabulary
    /// 129,280, dense MLP 18432, experts 2048 wide, top-8, one shared expert, the MTP
    /// layer) with `layers` layers (the first dense) of `experts` int8 experts (the release
    /// has 61 of 256). Groups: the largest `n_group` up to 8 dividing `experts`, half of
    /// them routable (more where needed to reach the top-k).
    pub fn v3(layers: usize, experts: usize) -> DeepseekSpec {
        assert!(layers > 0 && experts > 0, "positive layers and experts");
        let top_k = experts.min(8);
        let n_group = (1..=8)
            .rev()
            .find(|g| experts.is_multiple_of(*g))
            .unwrap_or(1);
        let per_group = experts / n_group;
        let topk_group = n_group
            .div_ceil(2)
            .max(top_k.div_ceil(per_group))
            .min(n_group);
        DeepseekSpec {
            hidden: 7168,
            vocab: 129_280,
            heads: 128,
            q_lora_rank: 1536,
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            intermediate: 18432,
            moe_intermediate: 2048,
            layers,
            dense_layers: 1,
            experts,
            top_k,
            n_group,
            topk_group,
            shared_experts: 1,
            mtp: true,
            int8_experts: true,
            seed: 11,
        }
    }

    /// A tiny one for tests: 2 layers (1 dense), 8 int8 experts top-2 in 4 groups, the MTP
    /// layer.
    pub fn tiny() -> DeepseekSpec {
        DeepseekSpec {
            hidden: 64,
            vocab: 256,
            heads: 4,
            q_lora_rank: 48,
            kv_lora_rank: 32,
            qk_nope_head_dim: 16,
            qk_rope_head_dim: 8,
            v_head_dim: 16,
            intermediate: 96,
            moe_intermediate: 16,
            layers: 2,
            dense_layers: 1,
            experts: 8,
            top_k: 2,
            n_group: 4,
            topk_group: 2,
            shared_experts: 1,
            mtp: true,
            int8_experts: true,
            seed: 13,
        }
    }
}

/// Small random f32 values (the routers' selection biases, stored in f32 as released).
fn f32_small(rng: &mut Rng, n: usize, scale: f32) -> TensorData {
    TensorData {
        dtype: DType::F32,
        shape: vec![n],
        bytes: (0..n)
            .flat_map(|_| (scale * rng.unit()).to_le_bytes())
            .collect(),
    }
}

/// Decoder layer `p` (`model.layers.{i}`) of a DeepSeek-V3 model into `t`: MLA, then a dense
/// SwiGLU MLP or (when `sparse`) the router, routed experts and shared experts.
fn deepseek_layer(
    rng: &mut Rng,
    s: &DeepseekSpec,
    p: &str,
    sparse: bool,
    t: &mut BTreeMap<String, TensorData>,
) {
    let h = s.hidden;
    let qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
    let a = format!("{p}.self_attn");
    for (w, rows, cols) in [
        ("q_a_proj", s.q_lora_rank, h),
        ("q_b_proj", s.heads * qk, s.q_lora_rank),
        ("kv_a_proj_with_mqa", s.kv_lora_rank + s.qk_rope_head_dim, h),
        (
            "kv_b_proj",
            s.heads * (s.qk_nope_head_dim + s.v_head_dim),
            s.kv_lora_rank,
        ),
        ("o_proj", h, s.heads * s.v_head_dim),
    ] {
        t.insert(format!("{a}.{w}.weight"), bf16_matrix(rng, rows, cols, 1.0));
    }
    t.insert(
        format!("{a}.q_a_layernorm.weight"),
        norm(rng, s.q_lora_rank),
    );
    t.insert(
        format!("{a}.kv_a_layernorm.weight"),
        norm(rng, s.kv_lora_rank),
    );
    t.insert(format!("{p}.input_layernorm.weight"), norm(rng, h));
    t.insert(format!("{p}.post_attention_layernorm.weight"), norm(rng, h));
    let swiglu = |rng: &mut Rng, t: &mut BTreeMap<String, TensorData>, m: &str, inter: usize| {
        for (w, rows, cols) in [
            ("gate_proj", inter, h),
            ("up_proj", inter, h),
            ("down_proj", h, inter),
        ] {
            t.insert(format!("{m}.{w}.weight"), bf16_matrix(rng, rows, cols, 1.0));
        }
    };
    let m = format!("{p}.mlp");
    if !sparse {
        swiglu(rng, t, &m, s.intermediate);
        return;
    }
    t.insert(
        format!("{m}.gate.weight"),
        bf16_matrix(rng, s.experts, h, 1.0),
    );
    t.insert(
        format!("{m}.gate.e_score_correction_bias"),
        f32_small(rng, s.experts, 0.01),
    );
    for e in 0..s.experts {
        for (w, rows, cols) in [
            ("gate_proj", s.moe_intermediate, h),
            ("up_proj", s.moe_intermediate, h),
            ("down_proj", h, s.moe_intermediate),
        ] {
            let name = format!("{m}.experts.{e}.{w}.weight");
            if s.int8_experts {
                let (q, sc) = int8_matrix(rng, rows, cols);
                t.insert(format!("{name}_scale"), sc);
                t.insert(name, q);
            } else {
                t.insert(name, bf16_matrix(rng, rows, cols, 1.0));
            }
        }
    }
    if s.shared_experts > 0 {
        let inter = s.shared_experts * s.moe_intermediate;
        swiglu(rng, t, &format!("{m}.shared_experts"), inter);
    }
}

/// Writes a synthetic DeepSeek-V3 model into `dir` (created): one shard for the embeddings
/// and head, one per layer, one for the MTP layer (when `spec.mtp`: `enorm`, `hnorm`,
/// `eh_proj`, `shared_head.norm`, a full MoE decoder block, and the release's copies of the
/// embedding and head, `embed_tokens` and `shared_head.head`, which coli does not read),
/// the index and `config.json`. Reports `(layers done, layers)`, the MTP layer counted.
pub fn write_deepseek_v3(
    dir: &Path,
    spec: &DeepseekSpec,
    mut progress: impl FnMut(usize, usize),
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = Rng(spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (h, n) = (spec.hidden, spec.layers);
    let total = n + usize::from(spec.mtp);
    let container: &[(&str, &str)] = if spec.int8_experts {
        &[("coli.format", "1"), ("coli.experts", "int8")]
    } else {
        &[]
    };
    let mut shards = Shards::new(dir, total + 1, container);
    let mut head = BTreeMap::new();
    head.insert(
        "model.embed_tokens.weight".into(),
        bf16_matrix(&mut rng, spec.vocab, h, (h as f32).sqrt()),
    );
    head.insert(
        "lm_head.weight".into(),
        bf16_matrix(&mut rng, spec.vocab, h, 4.0),
    );
    head.insert("model.norm.weight".into(), norm(&mut rng, h));
    shards.write(0, &head)?;
    if !spec.mtp {
        head.clear();
    }
    for l in 0..total {
        let p = format!("model.layers.{l}");
        let mut t = BTreeMap::new();
        deepseek_layer(&mut rng, spec, &p, l >= spec.dense_layers, &mut t);
        if l == n {
            t.insert(format!("{p}.enorm.weight"), norm(&mut rng, h));
            t.insert(format!("{p}.hnorm.weight"), norm(&mut rng, h));
            t.insert(
                format!("{p}.eh_proj.weight"),
                bf16_matrix(&mut rng, h, 2 * h, 1.0),
            );
            t.insert(format!("{p}.shared_head.norm.weight"), norm(&mut rng, h));
            // As released: copies of the main model's embedding and head.
            let mut take = |k: &str| head.remove(k).expect("written above");
            t.insert(
                format!("{p}.embed_tokens.weight"),
                take("model.embed_tokens.weight"),
            );
            t.insert(
                format!("{p}.shared_head.head.weight"),
                take("lm_head.weight"),
            );
        }
        shards.write(l + 1, &t)?;
        progress(l + 1, total);
    }
    shards.write_index()?;
    let qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim;
    let mut config = serde_json::json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": spec.vocab,
        "hidden_size": h,
        "intermediate_size": spec.intermediate,
        "moe_intermediate_size": spec.moe_intermediate,
        "num_hidden_layers": n,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "qk_head_dim": qk,
        "v_head_dim": spec.v_head_dim,
        "attention_bias": false,
        "hidden_act": "silu",
        "first_k_dense_replace": spec.dense_layers,
        "moe_layer_freq": 1,
        "n_routed_experts": spec.experts,
        "num_experts_per_tok": spec.top_k,
        "n_group": spec.n_group,
        "topk_group": spec.topk_group,
        "n_shared_experts": spec.shared_experts,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "coli_synthetic": true,
    });
    if spec.mtp {
        config["num_nextn_predict_layers"] = 1.into();
    }
    write_json(&dir.join("config.json"), &config)
}
