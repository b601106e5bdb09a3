//! GLM-4.5 / 4.6 / 4.7 (`glm4_moe`): GQA with biases on q/k/v, optional per-head q/k
//! RMSNorm, RoPE on the first `partial_rotary_factor` of each head; the first
//! `first_k_dense_replace` layers dense, the rest DeepSeek-style sigmoid-routed MoE
//! with shared experts. The MTP layer (index `num_hidden_layers`) drafts ([`crate::arch::Mtp`]).
//! Mirrors `modeling_glm4_moe.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::moe::SigmoidMoeConfig;
use crate::arch::{Attention, Ffn, Mixer, QkNorm, Transformer};
use crate::error::Result;
use crate::families::skeleton::{CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family};
use crate::weights::load_vector;

/// `config.json` of a GLM-4.5-MoE checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct Glm4MoeConfig {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// The routing and expert keys.
    #[serde(flatten)]
    pub moe: SigmoidMoeConfig,
    /// Width of the dense layers' MLP.
    pub intermediate_size: usize,
    /// Fraction of each head that is rotated.
    #[serde(default = "half")]
    pub partial_rotary_factor: f64,
    /// Biases on q/k/v.
    #[serde(default)]
    pub attention_bias: bool,
    /// Per-head RMSNorm of q and k.
    #[serde(default)]
    pub use_qk_norm: bool,
    /// Leading dense layers.
    #[serde(default = "crate::serde_defaults::one")]
    pub first_k_dense_replace: usize,
}

fn half() -> f64 {
    0.5
}

/// `Glm4MoeConfig.attribute_map` in `transformers` 5.24: `(alias, key)`; and
/// `partial_rotary_factor`, which transformers 5 writes inside `rope_parameters`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[
    ("num_local_experts", "n_routed_experts"),
    ("num_mtp_layers", "num_nextn_predict_layers"),
    (
        "rope_parameters.partial_rotary_factor",
        "partial_rotary_factor",
    ),
];

/// `Glm4MoeConfig`'s defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-5,
    max_position_embeddings: 131072,
    rope_theta: 10000.0,
};

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
        let cfg: Glm4MoeConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let mut sk = Skeleton::gqa(dir, Glm4Moe::DISPLAY_NAME, &cfg.common, DEFAULTS)?;
        let (info, h) = (sk.info.clone(), cfg.common.hidden_size);
        let hd = info.head_dim;
        // transformers: int(head_dim * partial_rotary_factor).
        let f = cfg.partial_rotary_factor;
        let rot = (hd as f64 * f) as usize;
        if !(f > 0.0 && f <= 1.0) || rot == 0 || !rot.is_multiple_of(2) {
            return Err(dir
                .config
                .error(
                    "partial_rotary_factor",
                    format!("{f} gives {rot} rotary dims of head_dim {hd}; need an even number in 2..=head_dim"),
                )
                .into());
        }
        let bias = cfg.attention_bias;
        sk.mtp = true;
        sk.assemble(rot, RopeLayout::HalfSplit, |i, p| {
            let mut attn = Attention::load(dir, &format!("{p}.self_attn"), &info, bias, false)?;
            if cfg.use_qk_norm {
                attn.qk_norm = QkNorm::PerHead {
                    q: load_vector(dir, &format!("{p}.self_attn.q_norm.weight"), hd)?,
                    k: load_vector(dir, &format!("{p}.self_attn.k_norm.weight"), hd)?,
                };
            }
            let sparse = i >= cfg.first_k_dense_replace;
            let mlp = format!("{p}.mlp");
            let ffn = Ffn::load_dense_or_sigmoid_moe(
                dir,
                &mlp,
                h,
                sparse,
                cfg.intermediate_size,
                &cfg.moe,
            )?;
            Ok((Mixer::Gqa(Box::new(attn)), ffn))
        })
    }
}
