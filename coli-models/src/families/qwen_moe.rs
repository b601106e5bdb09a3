//! Qwen2-MoE and Qwen3-MoE: softmax top-k routing over SwiGLU experts in the layers
//! `decoder_sparse_step` selects (minus `mlp_only_layers`, which keep a dense MLP).
//! Qwen2-MoE adds a shared expert scaled by `sigmoid(shared_expert_gate x)` and q/k/v
//! biases; Qwen3-MoE drops both and RMS-normalises every q/k head, with a `head_dim`
//! independent of the hidden size. Mirrors `modeling_qwen2_moe.py` / `modeling_qwen3_moe.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::moe::{check_top_k, load_experts};
use crate::arch::{Attention, Ffn, Mixer, Mlp, Moe, QkNorm, Routing, SharedExpert, Transformer};
use crate::error::Result;
use crate::families::skeleton::{CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family};
use crate::weights::{load_vector, Linear};

/// `config.json` of a Qwen2-MoE or Qwen3-MoE checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct QwenMoeConfig {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// Width of the dense MLP of `mlp_only_layers` / non-sparse layers.
    pub intermediate_size: usize,
    /// Every `decoder_sparse_step`-th layer is sparse.
    #[serde(default = "crate::serde_defaults::one")]
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
}

/// `Qwen2MoeConfig.attribute_map` in `transformers` 5.24 (empty).
pub const QWEN2_CONFIG_ALIASES: &[(&str, &str)] = &[];

/// `Qwen3MoeConfig.attribute_map` in `transformers` 5.24: `(alias, key)`. From 5.1 on,
/// `save_pretrained` writes `num_local_experts` where the hub's configs say `num_experts`.
pub const QWEN3_CONFIG_ALIASES: &[(&str, &str)] = &[("num_local_experts", "num_experts")];

/// `Qwen2MoeConfig` / `Qwen3MoeConfig` defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-6,
    max_position_embeddings: 32768,
    rope_theta: 10000.0,
};

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
        load_variant(dir, Variant::Qwen2)
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
        load_variant(dir, Variant::Qwen3)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Qwen2,
    Qwen3,
}

fn load_variant(dir: &ModelDir, variant: Variant) -> Result<Transformer> {
    let aliases = match variant {
        Variant::Qwen2 => QWEN2_CONFIG_ALIASES,
        Variant::Qwen3 => QWEN3_CONFIG_ALIASES,
    };
    let cfg: QwenMoeConfig = dir.config.deserialize_aliased(aliases)?;
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
    check_top_k(dir, "num_experts", cfg.num_experts, cfg.num_experts_per_tok)?;
    let family = match variant {
        Variant::Qwen2 => Qwen2Moe::DISPLAY_NAME,
        Variant::Qwen3 => Qwen3Moe::DISPLAY_NAME,
    };
    let sk = Skeleton::gqa(dir, family, &cfg.common, DEFAULTS)?;
    let (info, h) = (sk.info.clone(), cfg.common.hidden_size);
    let (qkv_bias, o_bias) = match variant {
        Variant::Qwen2 => (cfg.qkv_bias.unwrap_or(true), false),
        Variant::Qwen3 => (cfg.attention_bias, cfg.attention_bias),
    };
    sk.assemble(info.head_dim, RopeLayout::HalfSplit, |i, p| {
        let mut attn = Attention::load(dir, &format!("{p}.self_attn"), &info, qkv_bias, o_bias)?;
        if variant == Variant::Qwen3 {
            attn.qk_norm = QkNorm::PerHead {
                q: load_vector(dir, &format!("{p}.self_attn.q_norm.weight"), info.head_dim)?,
                k: load_vector(dir, &format!("{p}.self_attn.k_norm.weight"), info.head_dim)?,
            };
        }
        let sparse =
            !cfg.mlp_only_layers.contains(&i) && (i + 1).is_multiple_of(cfg.decoder_sparse_step);
        let ffn = if !sparse {
            Ffn::Dense(Box::new(Mlp::load_swiglu(
                dir,
                &format!("{p}.mlp"),
                h,
                cfg.intermediate_size,
            )?))
        } else {
            let shared = match variant {
                Variant::Qwen3 => None,
                Variant::Qwen2 => {
                    let width = cfg
                        .shared_expert_intermediate_size
                        .ok_or_else(|| c.error("shared_expert_intermediate_size", "missing"))?;
                    Some(SharedExpert {
                        mlp: Mlp::load_swiglu(dir, &format!("{p}.mlp.shared_expert"), h, width)?,
                        gate: Some(Linear::load(
                            dir,
                            &format!("{p}.mlp.shared_expert_gate.weight"),
                            1,
                            h,
                        )?),
                    })
                }
            };
            Ffn::Moe(Box::new(Moe {
                router: Linear::load(dir, &format!("{p}.mlp.gate.weight"), cfg.num_experts, h)?,
                experts: load_experts(
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
        };
        Ok((Mixer::Gqa(Box::new(attn)), ffn))
    })
}
