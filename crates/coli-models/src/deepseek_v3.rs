//! DeepSeek-V3 and Kimi-K2 (published as `deepseek_v3` / `kimi_k2`): multi-head latent
//! attention with optional low-rank queries, rotary dims split from the rest and
//! (by default) interleaved, YaRN with the mscale correction of the softmax scale;
//! the first `first_k_dense_replace` layers dense, the rest sigmoid-routed MoE with a
//! selection bias, group-limited top-k, `routed_scaling_factor` and shared experts.
//! MTP layers (index >= `num_hidden_layers`) are in the checkpoint and ignored.
//! Mirrors `modeling_deepseek_v3.py`.

use coli_core::ModelDir;
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;

use crate::decoder::load::{MlaDims, SigmoidMoeConfig};
use crate::decoder::{load, Ffn, KvShape, Mixer, ModelInfo, Transformer};
use crate::error::Result;
use crate::registry::{Capability, Family};
use crate::weights::load_vector;

/// `config.json` of a DeepSeek-V3 / Kimi-K2 checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct DeepseekV3Config {
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
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Shared experts per MoE layer.
    #[serde(default)]
    pub n_shared_experts: Option<usize>,
    /// Routed experts per MoE layer.
    pub n_routed_experts: usize,
    /// Multiplies the routing weights.
    #[serde(default = "one_f")]
    pub routed_scaling_factor: f64,
    /// Rank of the compressed key/value latent.
    pub kv_lora_rank: usize,
    /// Rank of the query compression (null: plain `q_proj`).
    #[serde(default)]
    pub q_lora_rank: Option<usize>,
    /// Rotary dims per head.
    pub qk_rope_head_dim: usize,
    /// Value dims per head.
    pub v_head_dim: usize,
    /// Non-rotary query/key dims per head.
    pub qk_nope_head_dim: usize,
    /// Expert groups.
    #[serde(default = "one")]
    pub n_group: usize,
    /// Groups a token may route to.
    #[serde(default = "one")]
    pub topk_group: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Leading dense layers.
    #[serde(default)]
    pub first_k_dense_replace: usize,
    /// Renormalise the routing weights.
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    /// RMSNorm epsilon of the residual-stream norms.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Trained context length.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`.
    #[serde(default)]
    pub attention_bias: bool,
    /// Rotary pairs are adjacent elements (`transformers` default true).
    #[serde(default = "yes")]
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
    1e-6
}
fn default_max_pos() -> usize {
    4096
}

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
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load(dir)
    }
}

/// `transformers`' DeepseekV3RMSNorm default, used by `q_a_layernorm` and `kv_a_layernorm`
/// (they are built without the config's epsilon).
pub const LOW_RANK_NORM_EPS: f32 = 1e-6;

fn load(dir: &ModelDir) -> Result<Transformer> {
    let cfg: DeepseekV3Config = dir.config.deserialize()?;
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
    let dims = MlaDims {
        n_heads: cfg.num_attention_heads,
        q_lora_rank: cfg.q_lora_rank,
        kv_lora_rank: cfg.kv_lora_rank,
        nope: cfg.qk_nope_head_dim,
        rope: cfg.qk_rope_head_dim,
        v_dim: cfg.v_head_dim,
    };
    dims.validate(dir)?;
    let moe = SigmoidMoeConfig {
        n_routed_experts: cfg.n_routed_experts,
        top_k: cfg.num_experts_per_tok,
        moe_intermediate_size: cfg.moe_intermediate_size,
        n_shared_experts: cfg.n_shared_experts.unwrap_or(0),
        n_group: cfg.n_group,
        topk_group: cfg.topk_group,
        norm_topk_prob: cfg.norm_topk_prob,
        routed_scaling_factor: cfg.routed_scaling_factor,
    };
    let info = ModelInfo {
        family: DeepseekV3::DISPLAY_NAME,
        model_type: c.model_type()?.to_string(),
        vocab_size: cfg.vocab_size,
        hidden_size: cfg.hidden_size,
        n_layers: cfg.num_hidden_layers,
        n_heads: cfg.num_attention_heads,
        n_kv_heads: 1,
        head_dim: dims.nope + dims.rope,
        max_position_embeddings: cfg.max_position_embeddings,
        eos_token_ids: c.eos_token_ids()?,
        kv: KvShape::mla(dims.kv_lora_rank, dims.rope),
    };
    let rope = c.rope_parameters(10000.0)?;
    let scale = load::mla_softmax_scale(dims.nope + dims.rope, &rope.scaling);
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
            let mla = load::mla(
                dir,
                &format!("{p}.self_attn"),
                &dims,
                h,
                cfg.attention_bias,
                LOW_RANK_NORM_EPS,
                scale,
            )?;
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
            load::layer(dir, &p, h, Mixer::Mla(Box::new(mla)), ffn)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Transformer {
        norm: load_vector(dir, "model.norm.weight", h)?,
        rope: RopeTable::new(dims.rope, rope.theta, &rope.scaling),
        rope_layout: if cfg.rope_interleave {
            RopeLayout::Interleaved
        } else {
            RopeLayout::HalfSplit
        },
        rms_norm_eps: cfg.rms_norm_eps as f32,
        info,
        embed_tokens,
        layers,
        lm_head,
    })
}
