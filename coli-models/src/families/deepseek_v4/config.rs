//! DeepSeek-V4's `config.json` as `DeepseekV4Config.__post_init__` (`transformers` 5.24)
//! resolves it: the modern keys or the legacy ones the release writes (`compress_ratios`
//! with the rate overrides, `num_hash_layers`, `qk_rope_head_dim`), both RoPEs (nested
//! `rope_parameters` or the release's flat `rope_scaling` for the compressed layers), and
//! how the routed experts are stored (`expert_dtype`).

use std::collections::HashMap;

use coli_core::{ModelDir, RawConfig, RopeParameters, RopeScaling};
use serde::Deserialize;
use serde_json::Value;

use crate::arch::ring::RingShape;
use crate::error::Result;
use crate::families::skeleton::{layer_kinds, CommonConfig};

/// `config.json` of a DeepSeek-V4 checkpoint (the keys coli reads), with the defaults of
/// `DeepseekV4Config`.
#[derive(Clone, Debug, Deserialize)]
pub struct DeepseekV4Config {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// Width of each routed and shared expert.
    #[serde(default = "d_moe_inter")]
    pub moe_intermediate_size: usize,
    /// Rank of the low-rank query projection.
    #[serde(default = "d_q_lora")]
    pub q_lora_rank: usize,
    /// Experts per token.
    #[serde(default = "d_top_k")]
    pub num_experts_per_tok: usize,
    /// Routed experts per layer.
    #[serde(default = "d_experts")]
    pub n_routed_experts: usize,
    /// Shared experts (V4 has one MLP of `moe_intermediate_size` whatever this says).
    #[serde(default = "crate::serde_defaults::one")]
    pub n_shared_experts: usize,
    /// `sqrtsoftplus`, `softmax` or `sigmoid`.
    #[serde(default = "d_scoring")]
    pub scoring_func: String,
    /// Multiplies the routing weights.
    #[serde(default = "d_scaling")]
    pub routed_scaling_factor: f64,
    /// RoPE base of the sliding layers.
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    /// Attention kind per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Compression rate per attention kind.
    #[serde(default)]
    pub compress_rates: Option<HashMap<String, usize>>,
    /// RoPE base of the compressed layers.
    #[serde(default = "d_compress_theta")]
    pub compress_rope_theta: f64,
    /// Residual streams.
    #[serde(default = "d_hc_mult")]
    pub hc_mult: usize,
    /// Sinkhorn-Knopp iterations.
    #[serde(default = "d_sinkhorn")]
    pub hc_sinkhorn_iters: usize,
    /// Floor of the hyper-connection weights.
    #[serde(default = "d_hc_eps")]
    pub hc_eps: f64,
    /// `hash_moe` or `moe` per layer.
    #[serde(default)]
    pub mlp_layer_types: Option<Vec<String>>,
    /// Clamp of the experts' activations.
    #[serde(default = "d_limit")]
    pub swiglu_limit: f64,
    /// Positions of the sliding window.
    #[serde(default = "d_window")]
    pub sliding_window: usize,
    /// Head groups of the output projection.
    #[serde(default = "d_o_groups")]
    pub o_groups: usize,
    /// Rank of each group's output projection.
    #[serde(default = "d_o_lora")]
    pub o_lora_rank: usize,
    /// Indexer heads.
    #[serde(default = "d_index_heads")]
    pub index_n_heads: usize,
    /// Indexer head width.
    #[serde(default = "d_index_dim")]
    pub index_head_dim: usize,
    /// Compressed entries each query keeps on CSA layers.
    #[serde(default = "d_index_topk")]
    pub index_topk: usize,
    /// Fraction of a head that RoPE rotates.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Legacy: per-layer compression ratio (0, 4 or 128) instead of `layer_types`.
    #[serde(default)]
    pub compress_ratios: Option<Vec<usize>>,
    /// Legacy: the CSA rate.
    #[serde(default)]
    pub compress_rate_csa: Option<usize>,
    /// Legacy: the HCA rate.
    #[serde(default)]
    pub compress_rate_hca: Option<usize>,
    /// Legacy: leading `hash_moe` layers instead of `mlp_layer_types`.
    #[serde(default)]
    pub num_hash_layers: Option<usize>,
    /// Legacy: rotary channels per head instead of `partial_rotary_factor`.
    #[serde(default)]
    pub qk_rope_head_dim: Option<usize>,
    /// The experts' activation (V4: `silu`).
    #[serde(default = "d_act")]
    pub hidden_act: String,
    /// Biases on the MLPs (V4: none).
    #[serde(default)]
    pub mlp_bias: bool,
    /// Biases on the attention projections (V4: none).
    #[serde(default)]
    pub attention_bias: bool,
    /// `fp4` when the routed experts are FP4 (the release); also read from
    /// `quantization_config`, where V4.1 and transformers put it.
    #[serde(default)]
    pub expert_dtype: Option<String>,
}

fn d_act() -> String {
    "silu".into()
}
fn d_moe_inter() -> usize {
    2048
}
fn d_q_lora() -> usize {
    1024
}
fn d_top_k() -> usize {
    6
}
fn d_experts() -> usize {
    256
}
fn d_scoring() -> String {
    "sqrtsoftplus".into()
}
fn d_scaling() -> f64 {
    1.5
}
fn d_theta() -> f64 {
    10000.0
}
fn d_compress_theta() -> f64 {
    160000.0
}
fn d_hc_mult() -> usize {
    4
}
fn d_sinkhorn() -> usize {
    20
}
fn d_hc_eps() -> f64 {
    1e-6
}
fn d_limit() -> f64 {
    10.0
}
fn d_window() -> usize {
    128
}
fn d_o_groups() -> usize {
    8
}
fn d_o_lora() -> usize {
    1024
}
fn d_index_heads() -> usize {
    64
}
fn d_index_dim() -> usize {
    128
}
fn d_index_topk() -> usize {
    512
}

/// `DeepseekV4Config.attribute_map` in `transformers` 5.24: `(alias, key)`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[
    ("num_local_experts", "n_routed_experts"),
    ("intermediate_size", "moe_intermediate_size"),
];

/// `head_dim` when the config omits it.
const DEFAULT_HEAD_DIM: usize = 512;

/// The attention kind of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V4Attention {
    /// The sliding window only.
    Sliding,
    /// Sliding window and indexer-selected compressed entries.
    Csa,
    /// Sliding window and every compressed entry.
    Hca,
}

/// The config resolved as `DeepseekV4Config.__post_init__` resolves it.
#[derive(Clone, Debug)]
pub struct V4Settings {
    /// Attention kind per layer.
    pub attention: Vec<V4Attention>,
    /// Whether each layer routes by the token table.
    pub hash: Vec<bool>,
    /// CSA and HCA rates.
    pub rates: (usize, usize),
    /// Head width.
    pub head_dim: usize,
    /// Rotary channels per head.
    pub rope_dim: usize,
    /// RoPE of the sliding layers.
    pub main_rope: RopeParameters,
    /// RoPE of the compressed layers and the compressors.
    pub compress_rope: RopeParameters,
}

impl V4Settings {
    /// What a layer keeps in the cache (see [`RingShape`]): the window's keys, the
    /// compressors' raw `kv` and `gate` rows (two series each on CSA, for the main
    /// compressor and the indexer's) and their entries.
    pub(super) fn ring_shape(
        &self,
        kind: V4Attention,
        window: usize,
        index_head_dim: usize,
    ) -> RingShape {
        let hd = self.head_dim;
        let (rate, overlap, raw_width, entry_width) = match kind {
            V4Attention::Sliding => (0, false, 0, 0),
            V4Attention::Hca => (self.rates.1, false, 2 * hd, hd),
            V4Attention::Csa => (
                self.rates.0,
                true,
                4 * hd + 4 * index_head_dim,
                hd + index_head_dim,
            ),
        };
        RingShape {
            window,
            key_width: hd,
            rate,
            overlap,
            raw_width,
            entry_width,
        }
    }
}

/// Resolves layer kinds, rates, the rotary width and both RoPEs, checking what the
/// blocks rely on.
pub fn resolve(dir: &ModelDir, cfg: &DeepseekV4Config) -> Result<V4Settings> {
    let c = &dir.config;
    let n = cfg.common.num_hidden_layers;
    let rates = cfg.compress_rates.clone().unwrap_or_default();
    let rate = |k: &str, d: usize| rates.get(k).copied().unwrap_or(d);
    let csa = cfg
        .compress_rate_csa
        .unwrap_or_else(|| rate("compressed_sparse_attention", 4));
    let hca = cfg
        .compress_rate_hca
        .unwrap_or_else(|| rate("heavily_compressed_attention", 128));
    for (key, r) in [("compress_rate_csa", csa), ("compress_rate_hca", hca)] {
        if r == 0 {
            return Err(c.error(key, "compression rates must be positive").into());
        }
    }
    let kinds = [
        ("sliding_attention", V4Attention::Sliding),
        ("compressed_sparse_attention", V4Attention::Csa),
        ("heavily_compressed_attention", V4Attention::Hca),
    ];
    let attention = match (&cfg.layer_types, &cfg.compress_ratios) {
        (Some(t), _) => layer_kinds(dir, &t[..t.len().min(n)], n, &kinds)?,
        (None, Some(ratios)) => ratios
            .iter()
            .take(n)
            .map(|r| match r {
                0 => Ok(V4Attention::Sliding),
                4 => Ok(V4Attention::Csa),
                128 => Ok(V4Attention::Hca),
                other => Err(c
                    .error(
                        "compress_ratios",
                        format!("{other} is not a known ratio (0, 4 or 128)"),
                    )
                    .into()),
            })
            .collect::<Result<Vec<_>>>()?,
        (None, None) => (0..n)
            .map(|i| match i {
                0 | 1 => V4Attention::Hca,
                i if (i - 2) % 2 == 1 => V4Attention::Csa,
                _ => V4Attention::Hca,
            })
            .collect(),
    };
    if attention.len() != n {
        return Err(c
            .error(
                "compress_ratios",
                format!(
                    "has {} entries for num_hidden_layers = {n}",
                    attention.len()
                ),
            )
            .into());
    }
    let hash = match &cfg.mlp_layer_types {
        Some(t) if t.len() < n => {
            return Err(c
                .error(
                    "mlp_layer_types",
                    format!("has {} entries for num_hidden_layers = {n}", t.len()),
                )
                .into())
        }
        Some(t) => t[..n]
            .iter()
            .map(|k| match k.as_str() {
                "hash_moe" => Ok(true),
                "moe" => Ok(false),
                other => Err(c
                    .error(
                        "mlp_layer_types",
                        format!("unknown MLP type \"{other}\" (expected hash_moe or moe)"),
                    )
                    .into()),
            })
            .collect::<Result<Vec<_>>>()?,
        None => {
            let h = cfg.num_hash_layers.unwrap_or(3);
            (0..n).map(|i| i < h).collect()
        }
    };
    let head_dim = cfg.common.head_dim.unwrap_or(DEFAULT_HEAD_DIM);
    let factor = match (cfg.partial_rotary_factor, cfg.qk_rope_head_dim) {
        (Some(f), _) => f,
        (None, Some(r)) => r as f64 / head_dim as f64,
        (None, None) => 64.0 / 512.0,
    };
    let rope_dim = (head_dim as f64 * factor) as usize;
    if rope_dim == 0
        || !rope_dim.is_multiple_of(2)
        || rope_dim > head_dim
        || rope_dim > 2 * crate::arch::MAX_ROT_HALF
    {
        return Err(c
            .error(
                "partial_rotary_factor",
                format!("gives {rope_dim} rotary channels of head_dim {head_dim}: must be even, positive and at most head_dim"),
            )
            .into());
    }
    let (main_rope, compress_rope) = ropes(c, cfg, head_dim, rope_dim)?;
    Ok(V4Settings {
        attention,
        hash,
        rates: (csa, hca),
        head_dim,
        rope_dim,
        main_rope,
        compress_rope,
    })
}

/// The `main` and `compress` RoPEs: nested under `rope_parameters` as transformers saves
/// them, or (the release's config) `rope_theta` for the sliding layers and
/// `compress_rope_theta` with the top-level scaling (`rope_scaling` or a flat
/// `rope_parameters`) for the compressed ones, YaRN's attention factor 1 unless given.
fn ropes(
    c: &RawConfig,
    cfg: &DeepseekV4Config,
    head_dim: usize,
    rope_dim: usize,
) -> Result<(RopeParameters, RopeParameters)> {
    let sub = |obj: &Value, theta: f64, yarn_factor_one: bool| -> Result<RopeParameters> {
        let mut o = obj.clone();
        if let Some(m) = o.as_object_mut() {
            m.entry("rope_theta").or_insert(Value::from(theta));
            let yarn = m
                .get("rope_type")
                .or_else(|| m.get("type"))
                .and_then(Value::as_str)
                == Some("yarn");
            if yarn && yarn_factor_one {
                m.entry("attention_factor").or_insert(Value::from(1.0));
            }
        }
        let mut value = serde_json::Map::new();
        value.insert("rope_parameters".into(), o);
        if let Some(mpe) = c.value.get("max_position_embeddings") {
            value.insert("max_position_embeddings".into(), mpe.clone());
        }
        let raw = RawConfig {
            path: c.path.clone(),
            value: Value::Object(value),
            as_written: Value::Null,
        };
        Ok(raw.rope_parameters(theta)?)
    };
    let params = c.value.get("rope_parameters").filter(|v| v.is_object());
    if let Some(p) = params {
        if let (Some(main), Some(compress)) = (p.get("main"), p.get("compress")) {
            if main.is_object() && compress.is_object() {
                // transformers sizes each rotary from its own factor (1: the whole head);
                // coli rotates one width for both, the top-level one.
                for (label, sub) in [("main", main), ("compress", compress)] {
                    let f = sub
                        .get("partial_rotary_factor")
                        .and_then(Value::as_f64)
                        .unwrap_or(1.0);
                    if (f * head_dim as f64) as usize != rope_dim {
                        return Err(c
                            .error(
                                "rope_parameters",
                                format!(
                                    "{label}.partial_rotary_factor {f} gives {} rotary channels, the model {rope_dim}",
                                    (f * head_dim as f64) as usize
                                ),
                            )
                            .into());
                    }
                }
                return Ok((
                    sub(main, cfg.rope_theta, false)?,
                    sub(compress, cfg.compress_rope_theta, false)?,
                ));
            }
        }
    }
    let flat = params
        .or_else(|| c.value.get("rope_scaling").filter(|v| v.is_object()))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let mut compress = flat;
    if let Some(m) = compress.as_object_mut() {
        m.remove("main");
        m.remove("compress");
        m.insert("rope_theta".into(), Value::from(cfg.compress_rope_theta));
    }
    let main = RopeParameters {
        theta: cfg.rope_theta,
        scaling: RopeScaling::None,
    };
    Ok((main, sub(&compress, cfg.compress_rope_theta, true)?))
}

/// How the routed experts are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExpertDtype {
    /// As their dtype says (BF16, FP8, coli containers).
    Native,
    /// FP4 e2m1 with a scale per 32 columns (`expert_dtype: "fp4"`).
    Fp4,
}

/// `expert_dtype`, top-level (the release) or in `quantization_config`.
pub(super) fn expert_dtype(dir: &ModelDir, cfg: &DeepseekV4Config) -> Result<ExpertDtype> {
    let nested = dir
        .config
        .value
        .get("quantization_config")
        .and_then(|q| q.get("expert_dtype"))
        .and_then(Value::as_str);
    match cfg.expert_dtype.as_deref().or(nested) {
        None | Some("fp8") | Some("bf16") => Ok(ExpertDtype::Native),
        Some("fp4") => Ok(ExpertDtype::Fp4),
        Some(other) => Err(dir
            .config
            .error(
                "expert_dtype",
                format!("\"{other}\" is not supported (fp4, fp8, bf16)"),
            )
            .into()),
    }
}
