//! DeepSeek-V3 and Kimi-K2 (published as `deepseek_v3` / `kimi_k2`): multi-head latent
//! attention with optional low-rank queries, rotary dims split from the rest and
//! (by default) interleaved, YaRN with the mscale correction of the softmax scale;
//! the first `first_k_dense_replace` layers dense, the rest sigmoid-routed MoE with a
//! selection bias, group-limited top-k, `routed_scaling_factor` and shared experts.
//! The MTP layer (index `num_hidden_layers`) drafts ([`crate::arch::Mtp`]).
//! Mirrors `modeling_deepseek_v3.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::mla::{self, Mla, MlaConfig};
use crate::arch::moe::SigmoidMoeConfig;
use crate::arch::{Ffn, KvLayout, KvShape, Mixer, Transformer};
use crate::error::Result;
use crate::families::skeleton::{CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family};

/// `config.json` of a DeepSeek-V3 / Kimi-K2 checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct DeepseekV3Config {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// The MLA keys.
    #[serde(flatten)]
    pub mla: MlaConfig,
    /// The routing and expert keys.
    #[serde(flatten)]
    pub moe: SigmoidMoeConfig,
    /// Width of the dense layers' MLP.
    pub intermediate_size: usize,
    /// Leading dense layers.
    #[serde(default = "crate::serde_defaults::three")]
    pub first_k_dense_replace: usize,
    /// Rotary pairs are adjacent elements (`transformers` default true).
    #[serde(default = "crate::serde_defaults::yes")]
    pub rope_interleave: bool,
    /// Router scoring (only "sigmoid" exists in V3).
    #[serde(default)]
    pub scoring_func: Option<String>,
    /// Router selection (only "noaux_tc" exists in V3).
    #[serde(default)]
    pub topk_method: Option<String>,
    /// MoE every this many layers after the dense ones (V3: 1).
    #[serde(default)]
    pub moe_layer_freq: Option<usize>,
}

/// `DeepseekV3Config.attribute_map` in `transformers` 5.24: `(alias, key)`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[
    ("num_local_experts", "n_routed_experts"),
    ("num_mtp_layers", "num_nextn_predict_layers"),
];

/// `DeepseekV3Config`'s defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-6,
    max_position_embeddings: 4096,
    rope_theta: 10000.0,
};

/// DeepSeek-V3 and Kimi-K2.
pub struct DeepseekV3;

impl Family for DeepseekV3 {
    const MODEL_TYPES: &'static [&'static str] = &["deepseek_v3", "kimi_k2"];
    const DISPLAY_NAME: &'static str = "DeepSeek-V3";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::Mla,
        Capability::GroupRouting,
        Capability::SharedExperts,
        Capability::Dense,
    ];
    fn kv_layout(dir: &ModelDir) -> Result<KvLayout> {
        let cfg: DeepseekV3Config = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let dims = cfg.mla.dims(cfg.common.num_attention_heads);
        dims.validate(dir)?;
        let shape = KvShape::mla(dims.kv_lora_rank, dims.rope);
        Ok(KvLayout::uniform(cfg.common.num_hidden_layers, shape))
    }

    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: DeepseekV3Config = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let c = &dir.config;
        for (key, value, want) in [
            ("scoring_func", &cfg.scoring_func, "sigmoid"),
            ("topk_method", &cfg.topk_method, "noaux_tc"),
        ] {
            if let Some(v) = value.as_deref().filter(|v| *v != want) {
                return Err(c
                    .error(
                        key,
                        format!("\"{v}\" is not supported (expected \"{want}\")"),
                    )
                    .into());
            }
        }
        if let Some(f) = cfg.moe_layer_freq.filter(|f| *f != 1) {
            return Err(c
                .error(
                    "moe_layer_freq",
                    format!("{f} is not supported (expected 1)"),
                )
                .into());
        }
        let dims = cfg.mla.dims(cfg.common.num_attention_heads);
        let mut sk = Skeleton::mla(dir, DeepseekV3::DISPLAY_NAME, &cfg.common, DEFAULTS, &dims)?;
        let scale = mla::softmax_scale(dims.nope + dims.rope, &sk.rope.scaling);
        let h = cfg.common.hidden_size;
        let layout = if cfg.rope_interleave {
            RopeLayout::Interleaved
        } else {
            RopeLayout::HalfSplit
        };
        sk.mtp = true;
        sk.assemble(dims.rope, layout, |i, p| {
            let a = format!("{p}.self_attn");
            let mla = Mla::load(dir, &a, &dims, h, cfg.mla.attention_bias, scale)?;
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
            Ok((Mixer::Mla(Box::new(mla)), ffn))
        })
    }
}
