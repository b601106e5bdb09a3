//! Loading MoE blocks from a checkpoint: DeepSeek-style sigmoid-routed blocks, routed
//! experts, and the checks of their routing settings.

use coli_core::ModelDir;

use super::{Moe, Routing, SharedExpert};
use crate::arch::mlp::{Expert, Mlp};
use crate::arch::Ffn;
use crate::error::Result;
use crate::weights::{load_vector, Linear};

/// Routing and expert keys of a DeepSeek-style MoE block (DeepSeek-V3, Kimi-K2, GLM),
/// spelled as in their config.json (flattened into the family configs).
#[derive(Clone, Copy, Debug, serde::Deserialize)]
pub struct SigmoidMoeConfig {
    /// Routed experts per MoE layer.
    pub n_routed_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Width of each routed expert.
    pub moe_intermediate_size: usize,
    /// Shared experts (fused into one MLP of `n * moe_intermediate_size`).
    #[serde(default = "crate::serde_defaults::one")]
    pub n_shared_experts: usize,
    /// Expert groups.
    #[serde(default = "crate::serde_defaults::one")]
    pub n_group: usize,
    /// Groups a token may route to.
    #[serde(default = "crate::serde_defaults::one")]
    pub topk_group: usize,
    /// Renormalise the chosen weights.
    #[serde(default = "crate::serde_defaults::yes")]
    pub norm_topk_prob: bool,
    /// Multiplies the routing weights.
    #[serde(default = "crate::serde_defaults::one_f64")]
    pub routed_scaling_factor: f64,
}

impl Moe {
    /// A DeepSeek-style block: `{prefix}.gate` (weight + `e_score_correction_bias`),
    /// `{prefix}.experts.{e}`, `{prefix}.shared_experts`.
    pub fn load_sigmoid(
        dir: &ModelDir,
        prefix: &str,
        hidden: usize,
        m: &SigmoidMoeConfig,
    ) -> Result<Moe> {
        let gate = format!("{prefix}.gate");
        let routing = Routing::grouped_sigmoid(dir, &gate, m)?;
        let shared = if m.n_shared_experts > 0 {
            let inter = m.n_shared_experts * m.moe_intermediate_size;
            let mlp = Mlp::load_swiglu(dir, &format!("{prefix}.shared_experts"), hidden, inter)?;
            Some(SharedExpert { mlp, gate: None })
        } else {
            None
        };
        Ok(Moe {
            router: Linear::load(dir, &format!("{gate}.weight"), m.n_routed_experts, hidden)?,
            experts: load_experts(
                dir,
                &format!("{prefix}.experts"),
                m.n_routed_experts,
                ["gate_proj", "up_proj", "down_proj"],
                hidden,
                m.moe_intermediate_size,
            )?,
            top_k: m.num_experts_per_tok,
            routing,
            shared,
        })
    }
}

impl Ffn {
    /// The feed-forward block `{prefix}` of a DeepSeek-style layer: a sigmoid-routed MoE
    /// when `sparse`, else a dense SwiGLU of `intermediate_size`.
    pub fn load_dense_or_sigmoid_moe(
        dir: &ModelDir,
        prefix: &str,
        hidden: usize,
        sparse: bool,
        intermediate_size: usize,
        moe: &SigmoidMoeConfig,
    ) -> Result<Ffn> {
        Ok(if sparse {
            Ffn::Moe(Box::new(Moe::load_sigmoid(dir, prefix, hidden, moe)?))
        } else {
            let mlp = Mlp::load_swiglu(dir, prefix, hidden, intermediate_size)?;
            Ffn::Dense(Box::new(mlp))
        })
    }
}

/// `count` experts named `{prefix}.{e}.{gate}` / `.{up}` / `.{down}`, without biases.
pub fn load_experts(
    dir: &ModelDir,
    prefix: &str,
    count: usize,
    names: [&str; 3],
    hidden: usize,
    inter: usize,
) -> Result<Vec<Expert>> {
    (0..count)
        .map(|e| {
            let full = names.map(|n| format!("{prefix}.{e}.{n}"));
            Mlp::load(
                dir,
                full.each_ref().map(String::as_str),
                hidden,
                inter,
                false,
            )
            .map(Expert::SwiGlu)
        })
        .collect()
}

/// `routed_scaling_factor`, checked finite and positive.
pub fn check_routed_scaling(dir: &ModelDir, scaling: f64) -> Result<f32> {
    if !(scaling.is_finite() && scaling > 0.0) {
        return Err(dir
            .config
            .error(
                "routed_scaling_factor",
                format!("must be positive, found {scaling}"),
            )
            .into());
    }
    Ok(scaling as f32)
}

/// Checks the expert count (`experts_key`) and `num_experts_per_tok` against each other.
pub fn check_top_k(
    dir: &ModelDir,
    experts_key: &str,
    n_experts: usize,
    top_k: usize,
) -> Result<()> {
    let c = &dir.config;
    if n_experts == 0 {
        return Err(c.error(experts_key, "must be positive").into());
    }
    if top_k == 0 || top_k > n_experts {
        return Err(c
            .error(
                "num_experts_per_tok",
                format!("{top_k} must be between 1 and {experts_key} = {n_experts}"),
            )
            .into());
    }
    Ok(())
}

impl Routing {
    /// DeepSeek-style routing settings, validated; the bias is
    /// `{gate}.e_score_correction_bias`.
    pub fn grouped_sigmoid(dir: &ModelDir, gate: &str, m: &SigmoidMoeConfig) -> Result<Routing> {
        let c = &dir.config;
        let (n_experts, top_k) = (m.n_routed_experts, m.num_experts_per_tok);
        let (n_group, topk_group) = (m.n_group, m.topk_group);
        if n_group == 0 || !n_experts.is_multiple_of(n_group) {
            return Err(c
                .error(
                    "n_group",
                    format!("{n_group} must be positive and divide n_routed_experts = {n_experts}"),
                )
                .into());
        }
        if topk_group == 0 || topk_group > n_group {
            return Err(c
                .error(
                    "topk_group",
                    format!("{topk_group} must be between 1 and n_group = {n_group}"),
                )
                .into());
        }
        check_top_k(dir, "n_routed_experts", n_experts, top_k)?;
        let reachable = topk_group * (n_experts / n_group);
        if top_k > reachable {
            return Err(c
                .error(
                    "num_experts_per_tok",
                    format!(
                        "{top_k} exceeds the {reachable} experts in topk_group = {topk_group} groups"
                    ),
                )
                .into());
        }
        let scaling = check_routed_scaling(dir, m.routed_scaling_factor)?;
        let bias_name = format!("{gate}.e_score_correction_bias");
        Ok(Routing::GroupedSigmoid {
            bias: load_vector(dir, &bias_name, n_experts)?,
            n_group,
            topk_group,
            norm_topk_prob: m.norm_topk_prob,
            scaling,
        })
    }
}
