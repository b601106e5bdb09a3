//! Mixtral: every layer a `block_sparse_moe` of SwiGLU experts named `w1` (gate),
//! `w3` (up) and `w2` (down); softmax over all router logits, top-k, weights
//! renormalised to sum to 1. Mirrors `modeling_mixtral.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::moe::{check_top_k, load_experts};
use crate::arch::{Attention, Ffn, Mixer, Moe, Routing, Transformer};
use crate::error::Result;
use crate::families::skeleton::{CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family};
use crate::weights::Linear;

/// `config.json` of a Mixtral checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct MixtralConfig {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// Width of each expert.
    pub intermediate_size: usize,
    /// Experts per layer.
    pub num_local_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Sliding-window attention span (must be null: not supported).
    #[serde(default)]
    pub sliding_window: Option<usize>,
}

/// `MixtralConfig.attribute_map` in `transformers` 5.24: `(alias, key)`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[("num_experts", "num_local_experts")];

/// `MixtralConfig`'s defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-5,
    max_position_embeddings: 32768,
    rope_theta: 1e6,
};

/// The Mixtral family.
pub struct Mixtral;

impl Family for Mixtral {
    const MODEL_TYPES: &'static [&'static str] = &["mixtral"];
    const DISPLAY_NAME: &'static str = "Mixtral";
    const CAPABILITIES: &'static [Capability] = &[Capability::Moe, Capability::Gqa];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: MixtralConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        if let Some(w) = cfg.sliding_window {
            return Err(dir
                .config
                .error(
                    "sliding_window",
                    format!("sliding-window attention ({w}) is not supported; expected null"),
                )
                .into());
        }
        let n_experts = cfg.num_local_experts;
        check_top_k(dir, "num_local_experts", n_experts, cfg.num_experts_per_tok)?;
        let sk = Skeleton::gqa(dir, Mixtral::DISPLAY_NAME, &cfg.common, DEFAULTS)?;
        let (info, h) = (sk.info.clone(), cfg.common.hidden_size);
        sk.assemble(info.head_dim, RopeLayout::HalfSplit, |_, p| {
            let attn = Attention::load(dir, &format!("{p}.self_attn"), &info, false, false)?;
            let m = format!("{p}.block_sparse_moe");
            let moe = Moe {
                router: Linear::load(dir, &format!("{m}.gate.weight"), n_experts, h)?,
                experts: load_experts(
                    dir,
                    &format!("{m}.experts"),
                    n_experts,
                    ["w1", "w3", "w2"],
                    h,
                    cfg.intermediate_size,
                )?,
                top_k: cfg.num_experts_per_tok,
                routing: Routing::Softmax {
                    norm_topk_prob: true,
                },
                shared: None,
            };
            Ok((Mixer::Gqa(Box::new(attn)), Ffn::Moe(Box::new(moe))))
        })
    }
}
