//! GLM-4.5 / 4.6 / 4.7 (`glm4_moe`): GQA with biases on q/k/v, optional per-head q/k
//! RMSNorm, RoPE on the first `partial_rotary_factor` of each head; the first
//! `first_k_dense_replace` layers dense, the rest DeepSeek-style sigmoid-routed MoE
//! with shared experts. MTP layers (index >= `num_hidden_layers`) are ignored.
//! Mirrors `modeling_glm4_moe.py`.

use coli_core::ModelDir;
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;

use crate::decoder::load::SigmoidMoeConfig;
use crate::decoder::{load, Ffn, KvShape, Mixer, ModelInfo, QkNorm, Transformer};
use crate::error::Result;
use crate::registry::{Capability, Family};
use crate::weights::load_vector;

/// `config.json` of a GLM-4.5-MoE checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct Glm4MoeConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Width of the dense layers' MLP.
    pub intermediate_size: usize,
    /// Width of each routed expert.
    pub moe_intermediate_size: usize,
    /// Decoder layers (MTP layers come after these and are ignored).
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head dimension (defaults to `hidden_size / num_attention_heads`).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Fraction of each head that is rotated.
    #[serde(default = "half")]
    pub partial_rotary_factor: f64,
    /// Biases on q/k/v.
    #[serde(default)]
    pub attention_bias: bool,
    /// Per-head RMSNorm of q and k.
    #[serde(default)]
    pub use_qk_norm: bool,
    /// Shared experts per MoE layer.
    #[serde(default = "one")]
    pub n_shared_experts: usize,
    /// Routed experts per MoE layer.
    pub n_routed_experts: usize,
    /// Multiplies the routing weights.
    #[serde(default = "one_f")]
    pub routed_scaling_factor: f64,
    /// Expert groups.
    #[serde(default = "one")]
    pub n_group: usize,
    /// Groups a token may route to.
    #[serde(default = "one")]
    pub topk_group: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Leading dense layers.
    #[serde(default = "one")]
    pub first_k_dense_replace: usize,
    /// Renormalise the routing weights.
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Trained context length.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn half() -> f64 {
    0.5
}
fn one() -> usize {
    1
}
fn one_f() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_eps() -> f64 {
    1e-5
}
fn default_max_pos() -> usize {
    131072
}

/// GLM-4.5-MoE.
pub struct Glm4Moe;

impl Family for Glm4Moe {
    const MODEL_TYPES: &'static [&'static str] = &["glm4_moe"];
    const DISPLAY_NAME: &'static str = "GLM-4.5-MoE";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::GroupRouting,
        Capability::SharedExperts,
        Capability::Gqa,
        Capability::QkNorm,
        Capability::Dense,
    ];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load(dir)
    }
}

fn load(dir: &ModelDir) -> Result<Transformer> {
    let cfg: Glm4MoeConfig = dir.config.deserialize()?;
    let c = &dir.config;
    let n_kv = cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads);
    let head_dim = load::head_dim(
        dir,
        cfg.hidden_size,
        cfg.num_attention_heads,
        n_kv,
        cfg.head_dim,
    )?;
    // transformers: int(head_dim * partial_rotary_factor).
    let rot = (head_dim as f64 * cfg.partial_rotary_factor) as usize;
    if !(cfg.partial_rotary_factor > 0.0 && cfg.partial_rotary_factor <= 1.0)
        || rot == 0
        || !rot.is_multiple_of(2)
    {
        return Err(c
            .error(
                "partial_rotary_factor",
                format!(
                    "{} gives {rot} rotary dims of head_dim {head_dim}; need an even number in 2..=head_dim",
                    cfg.partial_rotary_factor
                ),
            )
            .into());
    }
    let moe = SigmoidMoeConfig {
        n_routed_experts: cfg.n_routed_experts,
        top_k: cfg.num_experts_per_tok,
        moe_intermediate_size: cfg.moe_intermediate_size,
        n_shared_experts: cfg.n_shared_experts,
        n_group: cfg.n_group,
        topk_group: cfg.topk_group,
        norm_topk_prob: cfg.norm_topk_prob,
        routed_scaling_factor: cfg.routed_scaling_factor,
    };
    let info = ModelInfo {
        family: Glm4Moe::DISPLAY_NAME,
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
                false,
            )?;
            if cfg.use_qk_norm {
                attn.qk_norm = QkNorm::PerHead {
                    q: load_vector(dir, &format!("{p}.self_attn.q_norm.weight"), head_dim)?,
                    k: load_vector(dir, &format!("{p}.self_attn.k_norm.weight"), head_dim)?,
                };
            }
            let ffn = if i >= cfg.first_k_dense_replace {
                Ffn::Moe(Box::new(load::sigmoid_moe(
                    dir,
                    &format!("{p}.mlp"),
                    h,
                    &moe,
                )?))
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
        rope: RopeTable::new(rot, rope.theta, &rope.scaling),
        rope_layout: RopeLayout::HalfSplit,
        rms_norm_eps: cfg.rms_norm_eps as f32,
        info,
        embed_tokens,
        layers,
        lm_head,
    })
}
