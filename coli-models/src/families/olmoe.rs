//! OLMoE: every layer a softmax-routed mixture of SwiGLU experts; q and k are
//! RMS-normalised over the whole projection before RoPE; optional `clip_qkv`.
//! Mirrors `modeling_olmoe.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::moe::{check_top_k, load_experts};
use crate::arch::{Attention, Ffn, Mixer, Moe, QkNorm, Routing, Transformer};
use crate::error::Result;
use crate::families::skeleton::{CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family};
use crate::weights::{load_vector, Linear};

/// `config.json` of an OLMoE checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct OlmoeConfig {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// Width of each expert.
    pub intermediate_size: usize,
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
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
}

fn default_experts() -> usize {
    64
}
fn default_topk() -> usize {
    8
}

/// `OlmoeConfig.attribute_map` in `transformers` 5.24: `(alias, key)`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[("num_local_experts", "num_experts")];

/// `OlmoeConfig`'s defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-5,
    max_position_embeddings: 4096,
    rope_theta: 10000.0,
};

/// The OLMoE family.
pub struct Olmoe;

impl Family for Olmoe {
    const MODEL_TYPES: &'static [&'static str] = &["olmoe"];
    const DISPLAY_NAME: &'static str = "OLMoE";
    const CAPABILITIES: &'static [Capability] =
        &[Capability::Moe, Capability::Gqa, Capability::QkNorm];
    /// Loads an OLMoE checkpoint.
    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: OlmoeConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        check_top_k(dir, "num_experts", cfg.num_experts, cfg.num_experts_per_tok)?;
        let sk = Skeleton::gqa(dir, Olmoe::DISPLAY_NAME, &cfg.common, DEFAULTS)?;
        let (info, h) = (sk.info.clone(), cfg.common.hidden_size);
        let (qd, kvd) = (
            info.n_heads * info.head_dim,
            info.n_kv_heads * info.head_dim,
        );
        let bias = cfg.attention_bias;
        sk.assemble(info.head_dim, RopeLayout::HalfSplit, |_, p| {
            let mut attn = Attention::load(dir, &format!("{p}.self_attn"), &info, bias, bias)?;
            attn.qk_norm = QkNorm::FullProjection {
                q: load_vector(dir, &format!("{p}.self_attn.q_norm.weight"), qd)?,
                k: load_vector(dir, &format!("{p}.self_attn.k_norm.weight"), kvd)?,
            };
            attn.clip_qkv = cfg.clip_qkv.map(|v| v as f32);
            let moe = Moe {
                router: Linear::load(dir, &format!("{p}.mlp.gate.weight"), cfg.num_experts, h)?,
                experts: load_experts(
                    dir,
                    &format!("{p}.mlp.experts"),
                    cfg.num_experts,
                    ["gate_proj", "up_proj", "down_proj"],
                    h,
                    cfg.intermediate_size,
                )?,
                top_k: cfg.num_experts_per_tok,
                routing: Routing::Softmax {
                    norm_topk_prob: cfg.norm_topk_prob,
                },
                shared: None,
            };
            Ok((Mixer::Gqa(Box::new(attn)), Ffn::Moe(Box::new(moe))))
        })
    }
}
