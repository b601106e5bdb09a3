//! GLM-5 (`glm_moe_dsa`): DeepSeek-V3-style MLA (low-rank queries, interleaved RoPE) with
//! DeepSeek sparse attention: a lightning indexer per "full" layer scores every earlier
//! position and each query attends only to the best `index_topk`; "shared" layers reuse the
//! previous layer's selection. Dense then sigmoid-routed MoE layers (`mlp_layer_types`) with
//! shared experts. The MTP layer (`model.layers.{num_hidden_layers}`) drafts tokens
//! ([`crate::arch::Mtp`]): a full layer with its own indexer and routed experts.
//! Mirrors `modeling_glm_moe_dsa.py` (transformers 5).

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::mla::{self, Mla, MlaConfig};
use crate::arch::moe::SigmoidMoeConfig;
use crate::arch::{Dsa, Ffn, Indexer, KvLayout, KvShape, Mixer, Transformer};
use crate::error::Result;
use crate::families::skeleton::{CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family};

/// `config.json` of a GLM-5 checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct GlmMoeDsaConfig {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// The MLA keys (`q_lora_rank` is required: the indexer reads the low-rank query).
    #[serde(flatten)]
    pub mla: MlaConfig,
    /// The routing and expert keys.
    #[serde(flatten)]
    pub moe: SigmoidMoeConfig,
    /// Width of the dense layers' MLP.
    pub intermediate_size: usize,
    /// Leading dense layers (when `mlp_layer_types` is absent).
    #[serde(default = "crate::serde_defaults::three")]
    pub first_k_dense_replace: usize,
    /// Per layer "dense" or "sparse".
    #[serde(default)]
    pub mlp_layer_types: Option<Vec<String>>,
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

/// `GlmMoeDsaConfig.attribute_map` in `transformers` 5.24: `(alias, key)`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[("num_local_experts", "n_routed_experts")];

/// `GlmMoeDsaConfig`'s defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-5,
    max_position_embeddings: 202752,
    rope_theta: 10000.0,
};

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
    fn kv_layout(dir: &ModelDir) -> Result<KvLayout> {
        let cfg: GlmMoeDsaConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let dims = cfg.mla.dims(cfg.common.num_attention_heads);
        dims.validate(dir)?;
        let n = cfg.common.num_hidden_layers;
        let mut layout = KvLayout::uniform(n, KvShape::mla(dims.kv_lora_rank, dims.rope));
        // Layers with their own indexer keep its keys too.
        for (w, full) in layout
            .index_widths
            .iter_mut()
            .zip(indexer_types(&cfg, dir)?)
        {
            *w = if full { cfg.index_head_dim } else { 0 };
        }
        Ok(layout)
    }

    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: GlmMoeDsaConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let c = &dir.config;
        let n_layers = cfg.common.num_hidden_layers;
        let q_lora_rank = cfg.mla.q_lora_rank.ok_or_else(|| {
            c.error(
                "q_lora_rank",
                "GLM-5's indexer needs a low-rank query; found null",
            )
        })?;
        let dims = cfg.mla.dims(cfg.common.num_attention_heads);
        if cfg.index_topk == 0 {
            return Err(c.error("index_topk", "must be positive").into());
        }
        if cfg.index_n_heads == 0 {
            return Err(c.error("index_n_heads", "must be positive").into());
        }
        if cfg.index_head_dim < dims.rope {
            return Err(c
                .error(
                    "index_head_dim",
                    format!(
                        "{} is smaller than qk_rope_head_dim = {}",
                        cfg.index_head_dim, dims.rope
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
                if v.len() != n_layers {
                    return Err(c
                        .error(
                            "mlp_layer_types",
                            format!("{} entries for num_hidden_layers = {n_layers}", v.len()),
                        )
                        .into());
                }
                v
            }
            None => (0..n_layers)
                .map(|i| i >= cfg.first_k_dense_replace)
                .collect(),
        };
        let mut sk = Skeleton::mla(dir, GlmMoeDsa::DISPLAY_NAME, &cfg.common, DEFAULTS, &dims)?;
        sk.mtp = true;
        let scale = mla::softmax_scale(dims.nope + dims.rope, &sk.rope.scaling);
        let h = cfg.common.hidden_size;
        let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
        sk.assemble(dims.rope, RopeLayout::Interleaved, |i, p| {
            let a = format!("{p}.self_attn");
            let mut mla = Mla::load(dir, &a, &dims, h, cfg.mla.attention_bias, scale)?;
            // Layer `num_hidden_layers` is the MTP layer: its own indexer, routed experts
            // (GLM-5 ships one; the config's per-layer lists stop before it).
            let indexer = if full.get(i).copied().unwrap_or(true) {
                let x = format!("{a}.indexer");
                Some(Indexer::load(dir, &x, ih, id, q_lora_rank, h)?)
            } else {
                None
            };
            mla.dsa = Some(Dsa {
                indexer,
                top_k: cfg.index_topk,
            });
            let mlp = format!("{p}.mlp");
            let ffn = Ffn::load_dense_or_sigmoid_moe(
                dir,
                &mlp,
                h,
                sparse.get(i).copied().unwrap_or(true),
                cfg.intermediate_size,
                &cfg.moe,
            )?;
            Ok((Mixer::Mla(Box::new(mla)), ffn))
        })
    }
}

/// Which layers run their own indexer, as `transformers`' config derives it.
fn indexer_types(cfg: &GlmMoeDsaConfig, dir: &ModelDir) -> Result<Vec<bool>> {
    let c = &dir.config;
    let n = cfg.common.num_hidden_layers;
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
