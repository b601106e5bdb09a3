//! MiniMax-M2 (`minimax_m2`): grouped-query attention without biases, q and k each
//! RMS-normalised over the whole projection (all heads at once) before the head split,
//! RoPE on the first `rotary_dim` dimensions of each head (half-split), `head_dim`
//! independent of the hidden size. Every layer is a `block_sparse_moe` of SwiGLU experts
//! (`w1` gate, `w3` up, `w2` down): sigmoid scores, the top-k chosen on scores plus
//! `e_score_correction_bias`, weighted by the unbiased scores renormalised to sum to 1; no
//! groups, no shared expert, no scaling. MTP modules (layers past `num_hidden_layers`) are
//! ignored. Mirrors `modeling_minimax_m2.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::moe::{check_top_k, load_experts};
use crate::arch::{Attention, Ffn, Mixer, Moe, QkNorm, Routing, Transformer};
use crate::error::Result;
use crate::families::skeleton::{CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family};
use crate::weights::{load_vector, Linear};

/// `config.json` of a MiniMax-M2 checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct MiniMaxM2Config {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// Width of each expert.
    pub intermediate_size: usize,
    /// Experts per layer.
    pub num_local_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Rotated dimensions per head (the hub's spelling).
    #[serde(default)]
    pub rotary_dim: Option<usize>,
    /// Rotated fraction of each head (transformers 5 writes it in `rope_parameters`).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
}

/// `MiniMaxM2Config.attribute_map` in `transformers` 5.24: `(alias, key)`; and
/// `partial_rotary_factor`, which transformers 5 writes inside `rope_parameters`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[
    ("num_experts", "num_local_experts"),
    (
        "rope_parameters.partial_rotary_factor",
        "partial_rotary_factor",
    ),
];

/// `MiniMaxM2Config`'s defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-6,
    max_position_embeddings: 196608,
    rope_theta: 5e6,
};

/// The MiniMax-M2 family.
pub struct MiniMaxM2;

impl Family for MiniMaxM2 {
    const MODEL_TYPES: &'static [&'static str] = &["minimax_m2"];
    const DISPLAY_NAME: &'static str = "MiniMax-M2";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::Gqa,
        Capability::QkNorm,
        Capability::GroupRouting,
    ];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: MiniMaxM2Config = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let (n_experts, top_k) = (cfg.num_local_experts, cfg.num_experts_per_tok);
        check_top_k(dir, "num_local_experts", n_experts, top_k)?;
        let sk = Skeleton::gqa(dir, MiniMaxM2::DISPLAY_NAME, &cfg.common, DEFAULTS)?;
        let (info, h) = (sk.info.clone(), cfg.common.hidden_size);
        let rot = rotary_dims(dir, &cfg, info.head_dim)?;
        let (qd, kvd) = (
            info.n_heads * info.head_dim,
            info.n_kv_heads * info.head_dim,
        );
        sk.assemble(rot, RopeLayout::HalfSplit, |_, p| {
            let mut attn = Attention::load(dir, &format!("{p}.self_attn"), &info, false, false)?;
            attn.qk_norm = QkNorm::FullProjection {
                q: load_vector(dir, &format!("{p}.self_attn.q_norm.weight"), qd)?,
                k: load_vector(dir, &format!("{p}.self_attn.k_norm.weight"), kvd)?,
            };
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
                top_k,
                // One group holding every expert: plain biased top-k.
                routing: Routing::GroupedSigmoid {
                    bias: load_vector(dir, &format!("{m}.e_score_correction_bias"), n_experts)?,
                    n_group: 1,
                    topk_group: 1,
                    norm_topk_prob: true,
                    scaling: 1.0,
                },
                shared: None,
            };
            Ok((Mixer::Gqa(Box::new(attn)), Ffn::Moe(Box::new(moe))))
        })
    }
}

/// Rotated dimensions per head: `partial_rotary_factor` (as transformers applies it,
/// `int(head_dim * factor)`), else the hub's `rotary_dim`, else the whole head; the two
/// keys disagreeing is an error naming both.
fn rotary_dims(dir: &ModelDir, cfg: &MiniMaxM2Config, hd: usize) -> Result<usize> {
    let c = &dir.config;
    let from_factor = cfg.partial_rotary_factor.map(|f| (hd as f64 * f) as usize);
    let rot = match (from_factor, cfg.rotary_dim) {
        (Some(a), Some(b)) if a != b => {
            return Err(c
                .error(
                    "rotary_dim",
                    format!(
                    "{b} disagrees with partial_rotary_factor, which gives {a} of head_dim {hd}"
                ),
                )
                .into())
        }
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => hd,
    };
    if rot == 0 || rot > hd || !rot.is_multiple_of(2) {
        return Err(c
            .error(
                "rotary_dim",
                format!("{rot} rotary dims of head_dim {hd}; need an even number in 2..=head_dim"),
            )
            .into());
    }
    Ok(rot)
}
