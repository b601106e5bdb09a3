//! Llama (and every checkpoint with `model_type: "llama"`, e.g. SmolLM2):
//! dense decoder, grouped-query attention, half-split RoPE with optional
//! `llama3` scaling, tied or untied embeddings. Mirrors `modeling_llama.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::{Attention, Ffn, Mixer, Mlp, Transformer};
use crate::error::Result;
use crate::families::skeleton::{CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family};

/// `config.json` of a Llama checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct LlamaConfig {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// MLP width.
    pub intermediate_size: usize,
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
}

/// `LlamaConfig.attribute_map` in `transformers` 5.24 (empty).
pub const CONFIG_ALIASES: &[(&str, &str)] = &[];

/// `LlamaConfig`'s defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-6,
    max_position_embeddings: 2048,
    rope_theta: 10000.0,
};

/// The Llama family.
pub struct Llama;

impl Family for Llama {
    const MODEL_TYPES: &'static [&'static str] = &["llama"];
    const DISPLAY_NAME: &'static str = "Llama";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Dense,
        Capability::Gqa,
        Capability::TiedEmbeddings,
    ];
    /// Loads a Llama checkpoint.
    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: LlamaConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let sk = Skeleton::gqa(dir, Llama::DISPLAY_NAME, &cfg.common, DEFAULTS)?;
        let (info, h) = (sk.info.clone(), cfg.common.hidden_size);
        let bias = cfg.attention_bias;
        sk.assemble(info.head_dim, RopeLayout::HalfSplit, |_, p| {
            let attn = Attention::load(dir, &format!("{p}.self_attn"), &info, bias, bias)?;
            let mlp = Mlp::load(
                dir,
                [
                    &format!("{p}.mlp.gate_proj"),
                    &format!("{p}.mlp.up_proj"),
                    &format!("{p}.mlp.down_proj"),
                ],
                h,
                cfg.intermediate_size,
                cfg.mlp_bias,
            )?;
            Ok((Mixer::Gqa(Box::new(attn)), Ffn::Dense(Box::new(mlp))))
        })
    }
}
