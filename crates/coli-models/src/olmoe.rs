//! OLMoE: every layer a softmax-routed mixture of SwiGLU experts; q and k are
//! RMS-normalised over the whole projection before RoPE; optional `clip_qkv`.
//! Mirrors `modeling_olmoe.py`.

use coli_core::ModelDir;
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;

use crate::decoder::{load, Ffn, KvShape, Mixer, ModelInfo, Moe, QkNorm, Routing, Transformer};
use crate::error::Result;
use crate::registry::{Capability, Family};
use crate::weights::{load_vector, Linear};

/// `config.json` of an OLMoE checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct OlmoeConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Width of each expert.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Routed experts per layer.
    #[serde(default = "default_experts")]
    pub num_experts: usize,
    /// Experts per token.
    #[serde(default = "default_topk")]
    pub num_experts_per_tok: usize,
    /// Renormalise the top-k routing weights.
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// Clamp q/k/v to ±clip_qkv.
    #[serde(default)]
    pub clip_qkv: Option<f64>,
    /// Whether the LM head shares the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Trained context length.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_experts() -> usize {
    64
}
fn default_topk() -> usize {
    8
}
fn default_max_pos() -> usize {
    4096
}

/// The OLMoE family.
pub struct Olmoe;

impl Family for Olmoe {
    const MODEL_TYPES: &'static [&'static str] = &["olmoe"];
    const DISPLAY_NAME: &'static str = "OLMoE";
    const CAPABILITIES: &'static [Capability] =
        &[Capability::Moe, Capability::Gqa, Capability::QkNorm];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load(dir)
    }
}

/// Loads an OLMoE checkpoint.
fn load(dir: &ModelDir) -> Result<Transformer> {
    let cfg: OlmoeConfig = dir.config.deserialize()?;
    let c = &dir.config;
    load::check_top_k(dir, "num_experts", cfg.num_experts, cfg.num_experts_per_tok)?;
    let n_kv = cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads);
    let head_dim = load::head_dim(dir, cfg.hidden_size, cfg.num_attention_heads, n_kv, None)?;
    let info = ModelInfo {
        family: "OLMoE",
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
            let mut attn = load::attention(
                dir,
                &format!("{p}.self_attn"),
                &info,
                cfg.attention_bias,
                cfg.attention_bias,
            )?;
            attn.qk_norm = QkNorm::FullProjection {
                q: load_vector(
                    dir,
                    &format!("{p}.self_attn.q_norm.weight"),
                    cfg.num_attention_heads * head_dim,
                )?,
                k: load_vector(
                    dir,
                    &format!("{p}.self_attn.k_norm.weight"),
                    n_kv * head_dim,
                )?,
            };
            attn.clip_qkv = cfg.clip_qkv.map(|v| v as f32);
            let experts = load::experts(
                dir,
                &format!("{p}.mlp.experts"),
                cfg.num_experts,
                ["gate_proj", "up_proj", "down_proj"],
                h,
                cfg.intermediate_size,
            )?;
            let moe = Moe {
                router: Linear::load(dir, &format!("{p}.mlp.gate.weight"), cfg.num_experts, h)?,
                experts,
                top_k: cfg.num_experts_per_tok,
                routing: Routing::Softmax {
                    norm_topk_prob: cfg.norm_topk_prob,
                },
                shared: None,
            };
            load::layer(
                dir,
                &p,
                h,
                Mixer::Gqa(Box::new(attn)),
                Ffn::Moe(Box::new(moe)),
            )
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
