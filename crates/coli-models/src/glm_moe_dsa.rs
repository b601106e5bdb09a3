//! GLM-5 (`glm_moe_dsa`): DeepSeek-V3-style MLA (low-rank queries, interleaved RoPE) with
//! DeepSeek sparse attention: a lightning indexer per "full" layer scores every earlier
//! position and each query attends only to the best `index_topk`; "shared" layers reuse the
//! previous layer's selection. Dense then sigmoid-routed MoE layers (`mlp_layer_types`) with
//! shared experts. MTP layers (index >= `num_hidden_layers`) are ignored.
//! Mirrors `modeling_glm_moe_dsa.py` (transformers 5).

use coli_core::ModelDir;
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;

use crate::decoder::load::{MlaDims, SigmoidMoeConfig};
use crate::decoder::{load, Dsa, Ffn, Indexer, KvShape, Mixer, ModelInfo, Transformer};
use crate::error::Result;
use crate::registry::{Capability, Family};
use crate::weights::{load_vector, Linear};

/// `config.json` of a GLM-5 checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct GlmMoeDsaConfig {
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
    #[serde(default = "one")]
    pub n_shared_experts: usize,
    /// Routed experts per MoE layer.
    pub n_routed_experts: usize,
    /// Multiplies the routing weights.
    #[serde(default = "one_f")]
    pub routed_scaling_factor: f64,
    /// Rank of the compressed key/value latent.
    pub kv_lora_rank: usize,
    /// Rank of the query compression (the indexer reads it: required).
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
    /// Leading dense layers (when `mlp_layer_types` is absent).
    #[serde(default = "three")]
    pub first_k_dense_replace: usize,
    /// Per layer "dense" or "sparse".
    #[serde(default)]
    pub mlp_layer_types: Option<Vec<String>>,
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
    /// Positions each query attends to.
    pub index_topk: usize,
    /// Indexer head dimension.
    pub index_head_dim: usize,
    /// Indexer heads.
    pub index_n_heads: usize,
    /// Per layer "full" (own indexer) or "shared" (previous layer's selection).
    #[serde(default)]
    pub indexer_types: Option<Vec<String>>,
    /// Pattern of "F"/"S" (alternative spelling of `indexer_types`).
    #[serde(default)]
    pub index_topk_pattern: Option<String>,
    /// Every this many layers runs an indexer (with `index_skip_topk_offset`).
    #[serde(default)]
    pub index_topk_freq: Option<usize>,
    /// First layer of the frequency pattern.
    #[serde(default)]
    pub index_skip_topk_offset: Option<usize>,
}

fn one() -> usize {
    1
}
fn three() -> usize {
    3
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
    202752
}

/// GLM-5.
pub struct GlmMoeDsa;

impl Family for GlmMoeDsa {
    const MODEL_TYPES: &'static [&'static str] = &["glm_moe_dsa"];
    const DISPLAY_NAME: &'static str = "GLM-5";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::Mla,
        Capability::SparseAttention,
        Capability::GroupRouting,
        Capability::SharedExperts,
        Capability::Dense,
    ];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load(dir)
    }
}

/// Which layers run their own indexer, as `transformers`' config derives it.
fn indexer_types(cfg: &GlmMoeDsaConfig, dir: &ModelDir) -> Result<Vec<bool>> {
    let c = &dir.config;
    let n = cfg.num_hidden_layers;
    let full: Vec<bool> = if let Some(types) = &cfg.indexer_types {
        types
            .iter()
            .map(|t| match t.as_str() {
                "full" => Ok(true),
                "shared" => Ok(false),
                other => Err(c.error(
                    "indexer_types",
                    format!("unknown entry \"{other}\" (expected \"full\" or \"shared\")"),
                )),
            })
            .collect::<std::result::Result<_, _>>()?
    } else if let Some(p) = &cfg.index_topk_pattern {
        p.chars()
            .map(|ch| match ch {
                'F' => Ok(true),
                'S' => Ok(false),
                other => Err(c.error(
                    "index_topk_pattern",
                    format!("unknown letter '{other}' (expected F or S)"),
                )),
            })
            .collect::<std::result::Result<_, _>>()?
    } else {
        let freq = cfg.index_topk_freq.unwrap_or(1).max(1);
        let offset = cfg.index_skip_topk_offset.unwrap_or(2);
        (0..n)
            .map(|i| (i + 1).saturating_sub(offset).is_multiple_of(freq))
            .collect()
    };
    if full.len() != n {
        return Err(c
            .error(
                "indexer_types",
                format!("{} entries for num_hidden_layers = {n}", full.len()),
            )
            .into());
    }
    if n > 0 && !full[0] {
        return Err(c
            .error(
                "indexer_types",
                "the first layer must be \"full\": shared layers reuse an earlier selection",
            )
            .into());
    }
    Ok(full)
}

fn load(dir: &ModelDir) -> Result<Transformer> {
    let cfg: GlmMoeDsaConfig = dir.config.deserialize()?;
    let c = &dir.config;
    let q_lora_rank = cfg.q_lora_rank.ok_or_else(|| {
        c.error(
            "q_lora_rank",
            "GLM-5's indexer needs a low-rank query; found null",
        )
    })?;
    let dims = MlaDims {
        n_heads: cfg.num_attention_heads,
        q_lora_rank: Some(q_lora_rank),
        kv_lora_rank: cfg.kv_lora_rank,
        nope: cfg.qk_nope_head_dim,
        rope: cfg.qk_rope_head_dim,
        v_dim: cfg.v_head_dim,
    };
    dims.validate(dir)?;
    if cfg.index_topk == 0 {
        return Err(c.error("index_topk", "must be positive").into());
    }
    if cfg.index_n_heads == 0 {
        return Err(c.error("index_n_heads", "must be positive").into());
    }
    if cfg.index_head_dim < cfg.qk_rope_head_dim {
        return Err(c
            .error(
                "index_head_dim",
                format!(
                    "{} is smaller than qk_rope_head_dim = {}",
                    cfg.index_head_dim, cfg.qk_rope_head_dim
                ),
            )
            .into());
    }
    let full = indexer_types(&cfg, dir)?;
    let sparse: Vec<bool> = match &cfg.mlp_layer_types {
        Some(types) => {
            let v = types
                .iter()
                .map(|t| match t.as_str() {
                    "dense" => Ok(false),
                    "sparse" => Ok(true),
                    other => Err(c.error(
                        "mlp_layer_types",
                        format!("unknown entry \"{other}\" (expected \"dense\" or \"sparse\")"),
                    )),
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            if v.len() != cfg.num_hidden_layers {
                return Err(c
                    .error(
                        "mlp_layer_types",
                        format!(
                            "{} entries for num_hidden_layers = {}",
                            v.len(),
                            cfg.num_hidden_layers
                        ),
                    )
                    .into());
            }
            v
        }
        None => (0..cfg.num_hidden_layers)
            .map(|i| i >= cfg.first_k_dense_replace)
            .collect(),
    };
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
        family: GlmMoeDsa::DISPLAY_NAME,
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
    let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
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
            let a = format!("{p}.self_attn");
            let mut mla = load::mla(
                dir,
                &a,
                &dims,
                h,
                cfg.attention_bias,
                crate::deepseek_v3::LOW_RANK_NORM_EPS,
                scale,
            )?;
            let indexer = if full[i] {
                let x = format!("{a}.indexer");
                Some(Indexer {
                    wq_b: Linear::load(dir, &format!("{x}.wq_b.weight"), ih * id, q_lora_rank)?,
                    wk: Linear::load(dir, &format!("{x}.wk.weight"), id, h)?,
                    k_norm_weight: load_vector(dir, &format!("{x}.k_norm.weight"), id)?,
                    k_norm_bias: load_vector(dir, &format!("{x}.k_norm.bias"), id)?,
                    weights_proj: Linear::load(dir, &format!("{x}.weights_proj.weight"), ih, h)?,
                    n_heads: ih,
                    head_dim: id,
                })
            } else {
                None
            };
            mla.dsa = Some(Dsa {
                indexer,
                top_k: cfg.index_topk,
            });
            let ffn = if sparse[i] {
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
        rope_layout: RopeLayout::Interleaved,
        rms_norm_eps: cfg.rms_norm_eps as f32,
        info,
        embed_tokens,
        layers,
        lm_head,
    })
}
