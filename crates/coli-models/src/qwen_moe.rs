//! Qwen2-MoE and Qwen3-MoE: softmax top-k routing over SwiGLU experts in the layers
//! `decoder_sparse_step` selects (minus `mlp_only_layers`, which keep a dense MLP).
//! Qwen2-MoE adds a shared expert scaled by `sigmoid(shared_expert_gate x)` and q/k/v
//! biases; Qwen3-MoE drops both and RMS-normalises every q/k head, with a `head_dim`
//! independent of the hidden size. Mirrors `modeling_qwen2_moe.py` / `modeling_qwen3_moe.py`.

use coli_core::ModelDir;
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;

use crate::decoder::{
    load, Ffn, KvShape, Mixer, ModelInfo, Moe, QkNorm, Routing, SharedExpert, Transformer,
};
use crate::error::Result;
use crate::registry::{Capability, Family};
use crate::weights::{load_vector, Linear};

/// `config.json` of a Qwen2-MoE or Qwen3-MoE checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct QwenMoeConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Width of the dense MLP of `mlp_only_layers` / non-sparse layers.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head dimension (Qwen3: independent of `hidden_size`).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Every `decoder_sparse_step`-th layer is sparse.
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP.
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    /// Width of each routed expert.
    pub moe_intermediate_size: usize,
    /// Width of the shared expert (Qwen2-MoE).
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<usize>,
    /// Routed experts per layer.
    pub num_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Renormalise the top-k routing weights.
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// Biases on q/k/v (Qwen2-MoE, default true).
    #[serde(default)]
    pub qkv_bias: Option<bool>,
    /// Biases on q/k/v/o (Qwen3-MoE, default false).
    #[serde(default)]
    pub attention_bias: bool,
    /// Sliding-window attention (not supported: published checkpoints leave it off).
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Whether the LM head shares the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Trained context length.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
}

fn default_eps() -> f64 {
    1e-6
}
fn one() -> usize {
    1
}
fn default_max_pos() -> usize {
    32768
}

/// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B).
pub struct Qwen2Moe;

impl Family for Qwen2Moe {
    const MODEL_TYPES: &'static [&'static str] = &["qwen2_moe"];
    const DISPLAY_NAME: &'static str = "Qwen2-MoE";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::SharedExperts,
        Capability::Gqa,
        Capability::Dense,
    ];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load(dir, Variant::Qwen2)
    }
}

/// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B).
pub struct Qwen3Moe;

impl Family for Qwen3Moe {
    const MODEL_TYPES: &'static [&'static str] = &["qwen3_moe"];
    const DISPLAY_NAME: &'static str = "Qwen3-MoE";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::Gqa,
        Capability::QkNorm,
        Capability::Dense,
    ];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load(dir, Variant::Qwen3)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Qwen2,
    Qwen3,
}

fn load(dir: &ModelDir, variant: Variant) -> Result<Transformer> {
    let cfg: QwenMoeConfig = dir.config.deserialize()?;
    let c = &dir.config;
    if cfg.use_sliding_window {
        return Err(c
            .error(
                "use_sliding_window",
                "sliding-window attention is not supported",
            )
            .into());
    }
    if cfg.decoder_sparse_step == 0 {
        return Err(c.error("decoder_sparse_step", "must be positive").into());
    }
    load::check_top_k(dir, "num_experts", cfg.num_experts, cfg.num_experts_per_tok)?;
    let n_kv = cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads);
    let head_dim = load::head_dim(
        dir,
        cfg.hidden_size,
        cfg.num_attention_heads,
        n_kv,
        cfg.head_dim,
    )?;
    let info = ModelInfo {
        family: match variant {
            Variant::Qwen2 => Qwen2Moe::DISPLAY_NAME,
            Variant::Qwen3 => Qwen3Moe::DISPLAY_NAME,
        },
        model_type: c.model_type()?.to_string(),
        vocab_size: cfg.vocab_size,
        hidden_size: cfg.hidden_size,
        n_layers: cfg.num_hidden_layers,
        n_heads: cfg.num_attention_heads,
        n_kv_heads: n_kv,
        head_dim,
        max_position_embeddings: cfg.max_position_embeddings,
        eos_token_ids: c.eos_token_ids()?,
        kv: KvShape::gqa(n_kv, head_dim),
    };
    let rope = c.rope_parameters(10000.0)?;
    let h = cfg.hidden_size;
    let (qkv_bias, o_bias) = match variant {
        Variant::Qwen2 => (cfg.qkv_bias.unwrap_or(true), false),
        Variant::Qwen3 => (cfg.attention_bias, cfg.attention_bias),
    };
    let (embed_tokens, lm_head) = load::embeddings(
        dir,
        "model.embed_tokens.weight",
        "lm_head.weight",
        &info,
        cfg.tie_word_embeddings,
    )?;
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mut attn =
                load::attention(dir, &format!("{p}.self_attn"), &info, qkv_bias, o_bias)?;
            if variant == Variant::Qwen3 {
                attn.qk_norm = QkNorm::PerHead {
                    q: load_vector(dir, &format!("{p}.self_attn.q_norm.weight"), head_dim)?,
                    k: load_vector(dir, &format!("{p}.self_attn.k_norm.weight"), head_dim)?,
                };
            }
            let sparse = !cfg.mlp_only_layers.contains(&i)
                && (i + 1).is_multiple_of(cfg.decoder_sparse_step);
            let ffn = if sparse {
                let shared = match variant {
                    Variant::Qwen2 => Some(SharedExpert {
                        mlp: load::swiglu(
                            dir,
                            &format!("{p}.mlp.shared_expert"),
                            h,
                            cfg.shared_expert_intermediate_size.ok_or_else(|| {
                                c.error("shared_expert_intermediate_size", "missing")
                            })?,
                        )?,
                        gate: Some(Linear::load(
                            dir,
                            &format!("{p}.mlp.shared_expert_gate.weight"),
                            1,
                            h,
                        )?),
                    }),
                    Variant::Qwen3 => None,
                };
                Ffn::Moe(Box::new(Moe {
                    router: Linear::load(dir, &format!("{p}.mlp.gate.weight"), cfg.num_experts, h)?,
                    experts: load::experts(
                        dir,
                        &format!("{p}.mlp.experts"),
                        cfg.num_experts,
                        ["gate_proj", "up_proj", "down_proj"],
                        h,
                        cfg.moe_intermediate_size,
                    )?,
                    top_k: cfg.num_experts_per_tok,
                    routing: Routing::Softmax {
                        norm_topk_prob: cfg.norm_topk_prob,
                    },
                    shared,
                }))
            } else {
                Ffn::Dense(Box::new(load::swiglu(
                    dir,
                    &format!("{p}.mlp"),
                    h,
                    cfg.intermediate_size,
                )?))
            };
            load::layer(dir, &p, h, Mixer::Gqa(Box::new(attn)), ffn)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Transformer {
        norm: load_vector(dir, "model.norm.weight", h)?,
        rope: RopeTable::new(head_dim, rope.theta, &rope.scaling),
        rope_layout: RopeLayout::HalfSplit,
        rms_norm_eps: cfg.rms_norm_eps as f32,
        info,
        embed_tokens,
        layers,
        lm_head,
    })
}
