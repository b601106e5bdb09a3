//! DeepSeek-V4 (V4-Flash, V4-Pro): hyper-connections (`hc_mult` residual streams mixed
//! by Sinkhorn-projected weights around every block, collapsed by a hyper head at the
//! end); attention with one shared key/value head of `head_dim` 512 over a sliding window,
//! plus compressed entries on `compressed_sparse_attention` layers (top-k chosen by a
//! Lightning indexer) and `heavily_compressed_attention` layers (all of them); attention
//! sinks; a grouped low-rank output projection; MoE layers routed by `sqrtsoftplus`,
//! `softmax` or `sigmoid` scores, by a frozen token-to-expert table on the first
//! (`hash_moe`) layers; clamped SwiGLU (`swiglu_limit`) in the routed and shared experts.
//! The blocks are [`crate::arch::compressed`] and [`crate::arch::hyper`]; this file reads
//! the config (with the legacy keys the configuration class folds in) and the tensors,
//! spelled as `transformers` saves them or as the release ships them. MTP layers in a
//! checkpoint (`mtp.*`) are not read. Mirrors `modeling_deepseek_v4.py` and
//! `configuration_deepseek_v4.py` of `transformers` 5.24.

use std::collections::HashMap;

use coli_core::{ModelDir, RawConfig, RopeParameters, RopeScaling};
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;
use serde_json::Value;

use crate::arch::moe::check_top_k;
use crate::arch::{
    Choice, CompressedAttention, Compressor, Expert, Ffn, Hyper, HyperConnection, HyperHead,
    KvLayout, KvShape, Layer, LightningIndexer, Mixer, Mlp, ModelInfo, Moe, Routing, ScoreFn,
    SharedExpert, Transformer,
};
use crate::error::{ModelError, Result};
use crate::families::skeleton::{layer_kinds, CommonConfig};
use crate::families::{Capability, Family, TensorLayout};
use crate::weights::{load_vector, Linear};

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
    /// Floats a layer keeps per position in the cache's side rows.
    fn side_width(&self, kind: V4Attention, index_head_dim: usize) -> usize {
        let hd = self.head_dim;
        match kind {
            V4Attention::Sliding => 0,
            V4Attention::Hca => 2 * hd + hd,
            V4Attention::Csa => (4 * hd + hd) + (4 * index_head_dim + index_head_dim),
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

/// Tensor names in either spelling: `transformers`' (`model.layers.{i}.self_attn…`) or
/// the release's (`layers.{i}.attn…`).
struct Names {
    hub: bool,
}

impl Names {
    fn top(&self, tf: &str, hub: &str) -> String {
        if self.hub {
            hub.to_string()
        } else {
            format!("model.{tf}")
        }
    }

    fn layer(&self, i: usize, tf: &str, hub: &str) -> String {
        if self.hub {
            format!("layers.{i}.{hub}")
        } else {
            format!("model.layers.{i}.{tf}")
        }
    }
}

/// The DeepSeek-V4 family.
pub struct DeepseekV4;

impl Family for DeepseekV4 {
    const MODEL_TYPES: &'static [&'static str] = &["deepseek_v4"];
    const DISPLAY_NAME: &'static str = "DeepSeek-V4";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::SharedExperts,
        Capability::SparseAttention,
        Capability::HyperConnections,
    ];
    /// Both spellings: transformers' fused experts under `model.layers.`, the release's
    /// per-expert tensors under `layers.`; the release's MTP layers (`mtp.`) are not read.
    const LAYOUT: TensorLayout = TensorLayout {
        layers: &["model.layers.", "layers."],
        ignored: &["mtp."],
        experts: &[".mlp.experts.", ".ffn.experts."],
        shared: &[".mlp.shared_experts.", ".ffn.shared_experts."],
        indexer: &[".self_attn.compressor.indexer.", ".attn.indexer."],
        fused_experts: &[".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"],
        // FP4 experts' scales are read at load and stay resident (as gpt-oss' MXFP4
        // scales do).
        resident_expert_tails: &[".scale"],
    };

    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: DeepseekV4Config = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let set = resolve(dir, &cfg)?;
        load_model(dir, &cfg, &set)
    }

    fn kv_layout(dir: &ModelDir) -> Result<KvLayout> {
        let cfg: DeepseekV4Config = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let set = resolve(dir, &cfg)?;
        let n = cfg.common.num_hidden_layers;
        let mut l = KvLayout::uniform(
            n,
            KvShape {
                key_width: set.head_dim,
                value_width: 0,
            },
        );
        l.index_widths = set
            .attention
            .iter()
            .map(|&k| set.side_width(k, cfg.index_head_dim))
            .collect();
        Ok(l)
    }
}

fn load_model(dir: &ModelDir, cfg: &DeepseekV4Config, set: &V4Settings) -> Result<Transformer> {
    let c = &dir.config;
    let common = &cfg.common;
    let (h, n_layers, heads) = (
        common.hidden_size,
        common.num_hidden_layers,
        common.num_attention_heads,
    );
    let hd = set.head_dim;
    if common.num_key_value_heads.is_some_and(|k| k != 1) {
        return Err(c
            .error(
                "num_key_value_heads",
                "DeepSeek-V4 attention has one shared key/value head",
            )
            .into());
    }
    if heads == 0 || cfg.o_groups == 0 || !heads.is_multiple_of(cfg.o_groups) {
        return Err(c
            .error(
                "o_groups",
                format!(
                    "{} must be positive and divide num_attention_heads = {heads}",
                    cfg.o_groups
                ),
            )
            .into());
    }
    for (key, v) in [
        ("hidden_size", h),
        ("q_lora_rank", cfg.q_lora_rank),
        ("o_lora_rank", cfg.o_lora_rank),
        ("moe_intermediate_size", cfg.moe_intermediate_size),
        ("vocab_size", common.vocab_size),
    ] {
        if v == 0 {
            return Err(c.error(key, "must be positive").into());
        }
    }
    if cfg.hidden_act != "silu" {
        return Err(c
            .error(
                "hidden_act",
                format!(
                    "\"{}\" is not supported (DeepSeek-V4 uses silu)",
                    cfg.hidden_act
                ),
            )
            .into());
    }
    if cfg.mlp_bias || cfg.attention_bias {
        return Err(c
            .error(
                "mlp_bias",
                "DeepSeek-V4 has no biases on its MLPs or attention projections",
            )
            .into());
    }
    if cfg.hc_mult == 0 || cfg.hc_sinkhorn_iters == 0 {
        return Err(c
            .error("hc_mult", "hc_mult and hc_sinkhorn_iters must be positive")
            .into());
    }
    if cfg.sliding_window == 0 {
        return Err(c.error("sliding_window", "must be positive").into());
    }
    if cfg.index_topk == 0 || cfg.index_n_heads == 0 || cfg.index_head_dim < set.rope_dim {
        return Err(c
            .error(
                "index_topk",
                "index_topk and index_n_heads must be positive, index_head_dim at least the rotary width",
            )
            .into());
    }
    let limit = cfg.swiglu_limit as f32;
    if !(limit.is_finite() && limit > 0.0) {
        return Err(c
            .error("swiglu_limit", "must be finite and positive")
            .into());
    }
    let scaling = cfg.routed_scaling_factor;
    if !(scaling.is_finite() && scaling > 0.0) {
        return Err(c
            .error(
                "routed_scaling_factor",
                format!("must be positive, found {scaling}"),
            )
            .into());
    }
    let score = match cfg.scoring_func.as_str() {
        "sqrtsoftplus" => ScoreFn::SqrtSoftplus,
        "softmax" => ScoreFn::Softmax,
        "sigmoid" => ScoreFn::Sigmoid,
        other => {
            return Err(c
                .error(
                    "scoring_func",
                    format!("unknown scoring function \"{other}\" (expected sqrtsoftplus, softmax or sigmoid)"),
                )
                .into())
        }
    };
    let (n_experts, top_k) = (cfg.n_routed_experts, cfg.num_experts_per_tok);
    check_top_k(dir, "n_routed_experts", n_experts, top_k)?;
    let names = Names {
        hub: !dir.has("model.embed_tokens.weight") && dir.has("embed.weight"),
    };
    let eps = common.rms_norm_eps.unwrap_or(1e-6) as f32;
    let main_rope = RopeTable::new(set.rope_dim, set.main_rope.theta, &set.main_rope.scaling);
    let compress_rope = RopeTable::new(
        set.rope_dim,
        set.compress_rope.theta,
        &set.compress_rope.scaling,
    );
    let info = ModelInfo {
        family: DeepseekV4::DISPLAY_NAME,
        model_type: c.model_type()?.to_string(),
        vocab_size: common.vocab_size,
        hidden_size: h,
        n_layers,
        n_heads: heads,
        n_kv_heads: 1,
        head_dim: hd,
        max_position_embeddings: common.max_position_embeddings.unwrap_or(1_048_576),
        eos_token_ids: c.eos_token_ids()?,
        kv: KvShape {
            key_width: hd,
            value_width: 0,
        },
        notes: Vec::new(),
    };
    let mult = cfg.hc_mult;
    let hc = |i: usize, which: &str| -> Result<HyperConnection> {
        let [a, b, s] = ["fn", "base", "scale"]
            .map(|k| names.layer(i, &format!("{which}_hc.{k}"), &format!("hc_{which}_{k}")));
        HyperConnection::load(dir, [&a, &b, &s], mult, h)
    };
    let layers = (0..n_layers)
        .map(|i| {
            let rope = match set.attention[i] {
                V4Attention::Sliding => main_rope.clone(),
                _ => compress_rope.clone(),
            };
            let attn = load_attention(dir, &names, cfg, set, i, rope, &compress_rope)?;
            let ffn = load_moe(dir, &names, cfg, set.hash[i], i, score, limit)?;
            Ok(Layer {
                input_layernorm: load_vector(
                    dir,
                    &names.layer(i, "input_layernorm.weight", "attn_norm.weight"),
                    h,
                )?,
                attn: Mixer::Compressed(Box::new(attn)),
                post_attention_layernorm: load_vector(
                    dir,
                    &names.layer(i, "post_attention_layernorm.weight", "ffn_norm.weight"),
                    h,
                )?,
                ffn: Ffn::Moe(Box::new(ffn)),
                hc: Some(Box::new([hc(i, "attn")?, hc(i, "ffn")?])),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let head_names = ["hc_fn", "hc_base", "hc_scale"]
        .map(|k| names.top(&format!("hc_head.{k}"), &format!("hc_head_{}", &k[3..])));
    let hyper = Hyper {
        mult,
        iters: cfg.hc_sinkhorn_iters,
        eps: cfg.hc_eps as f32,
        norm_eps: eps,
        head: HyperHead::load(
            dir,
            [&head_names[0], &head_names[1], &head_names[2]],
            mult,
            h,
        )?,
    };
    let embed_name = names.top("embed_tokens.weight", "embed.weight");
    let head_name = if names.hub {
        "head.weight"
    } else {
        "lm_head.weight"
    };
    let (embed_tokens, lm_head) = crate::arch::layer::embeddings(
        dir,
        &embed_name,
        head_name,
        &info,
        common.tie_word_embeddings,
    )?;
    let mut info = info;
    if dir.tensor_names().iter().any(|n| n.starts_with("mtp.")) {
        info.notes.push(
            "the checkpoint's multi-token-prediction layers (mtp.*) are not read: DeepSeek-V4 does not draft by MTP yet"
                .into(),
        );
    }
    Ok(Transformer {
        norm: load_vector(dir, &names.top("norm.weight", "norm.weight"), h)?,
        rope: main_rope,
        rope_layout: RopeLayout::Interleaved,
        rms_norm_eps: eps,
        info,
        embed_tokens,
        layers,
        lm_head,
        store: None,
        mtp: None,
        hyper: Some(Box::new(hyper)),
    })
}

/// Layer `i`'s attention, its compressor and indexer.
fn load_attention(
    dir: &ModelDir,
    names: &Names,
    cfg: &DeepseekV4Config,
    set: &V4Settings,
    i: usize,
    rope: RopeTable,
    compress_rope: &RopeTable,
) -> Result<CompressedAttention> {
    let common = &cfg.common;
    let (h, heads, hd, qr) = (
        common.hidden_size,
        common.num_attention_heads,
        set.head_dim,
        cfg.q_lora_rank,
    );
    let a =
        |tf: &str, hub: &str| names.layer(i, &format!("self_attn.{tf}"), &format!("attn.{hub}"));
    let groups = cfg.o_groups;
    // Compressor tensors: transformers' `compressor.kv_proj` is the release's
    // `compressor.wkv`, and so on.
    let comp_name = |tf_prefix: &str, hub_prefix: &str| {
        let (tf_prefix, hub_prefix) = (tf_prefix.to_string(), hub_prefix.to_string());
        move |k: &str| {
            let hub = match k {
                "kv_proj" => "wkv.weight",
                "gate_proj" => "wgate.weight",
                "position_bias" => "ape",
                _ => "norm.weight",
            };
            let tf = match k {
                "position_bias" => k.to_string(),
                _ => format!("{k}.weight"),
            };
            names.layer(
                i,
                &format!("self_attn.{tf_prefix}.{tf}"),
                &format!("attn.{hub_prefix}.{hub}"),
            )
        }
    };
    let (csa, hca) = set.rates;
    let rd = set.rope_dim;
    let (compressor, indexer) = match set.attention[i] {
        V4Attention::Sliding => (None, None),
        V4Attention::Hca => (
            Some(Compressor::load(
                dir,
                &comp_name("compressor", "compressor"),
                h,
                (hca, hd, false),
                compress_rope.clone(),
                rd,
            )?),
            None,
        ),
        V4Attention::Csa => {
            let ihd = cfg.index_head_dim;
            let ix = LightningIndexer {
                compressor: Compressor::load(
                    dir,
                    &comp_name("compressor.indexer", "indexer.compressor"),
                    h,
                    (csa, ihd, true),
                    compress_rope.clone(),
                    rd,
                )?,
                q_b: Linear::load(
                    dir,
                    &a("compressor.indexer.q_b_proj.weight", "indexer.wq_b.weight"),
                    cfg.index_n_heads * ihd,
                    qr,
                )?,
                weights: Linear::load(
                    dir,
                    &a(
                        "compressor.indexer.scorer.weights_proj.weight",
                        "indexer.weights_proj.weight",
                    ),
                    cfg.index_n_heads,
                    h,
                )?,
                heads: cfg.index_n_heads,
                top_k: cfg.index_topk,
            };
            (
                Some(Compressor::load(
                    dir,
                    &comp_name("compressor", "compressor"),
                    h,
                    (csa, hd, true),
                    compress_rope.clone(),
                    rd,
                )?),
                Some(ix),
            )
        }
    };
    Ok(CompressedAttention {
        q_a: Linear::load(dir, &a("q_a_proj.weight", "wq_a.weight"), qr, h)?,
        q_a_norm: load_vector(dir, &a("q_a_norm.weight", "q_norm.weight"), qr)?,
        q_b: Linear::load(dir, &a("q_b_proj.weight", "wq_b.weight"), heads * hd, qr)?,
        kv: Linear::load(dir, &a("kv_proj.weight", "wkv.weight"), hd, h)?,
        kv_norm: load_vector(dir, &a("kv_norm.weight", "kv_norm.weight"), hd)?,
        o_a: Linear::load_row_blocks(
            dir,
            &a("o_a_proj.weight", "wo_a.weight"),
            groups,
            cfg.o_lora_rank,
            heads * hd / groups,
        )?,
        o_b: Linear::load(
            dir,
            &a("o_b_proj.weight", "wo_b.weight"),
            h,
            groups * cfg.o_lora_rank,
        )?,
        sinks: load_vector(dir, &a("sinks", "attn_sink"), heads)?,
        heads,
        head_dim: hd,
        rope_dim: rd,
        window: cfg.sliding_window,
        rope,
        compressor,
        indexer,
    })
}

/// Layer `i`'s MoE: routed experts (fused or per expert), the shared expert, the router
/// with its bias (`moe`) or token table (`hash_moe`).
fn load_moe(
    dir: &ModelDir,
    names: &Names,
    cfg: &DeepseekV4Config,
    hash: bool,
    i: usize,
    score: ScoreFn,
    limit: f32,
) -> Result<Moe> {
    let (h, inter, ne, k) = (
        cfg.common.hidden_size,
        cfg.moe_intermediate_size,
        cfg.n_routed_experts,
        cfg.num_experts_per_tok,
    );
    let m = |tf: &str, hub: &str| names.layer(i, &format!("mlp.{tf}"), &format!("ffn.{hub}"));
    let fp4 = expert_dtype(dir, cfg)? == ExpertDtype::Fp4;
    let choice = if hash {
        Choice::Hash(load_token_table(
            dir,
            &m("gate.tid2eid", "gate.tid2eid"),
            cfg.common.vocab_size,
            k,
            ne,
        )?)
    } else {
        Choice::Biased(load_vector(
            dir,
            &m("gate.e_score_correction_bias", "gate.bias"),
            ne,
        )?)
    };
    let fused = m("experts.gate_up_proj", "");
    let experts = (0..ne)
        .map(|e| {
            let mut mlp = if fp4 {
                if !names.hub && dir.has(&fused) {
                    return Err(ModelError::BadTensor {
                        name: fused.clone(),
                        msg: "FP4 experts fused per layer are not supported; the release's \
                              per-expert tensors are"
                            .into(),
                    });
                }
                let [g, u, d] = [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")].map(
                    |(tf, hub)| {
                        m(
                            &format!("experts.{e}.{tf}.weight"),
                            &format!("experts.{e}.{hub}.weight"),
                        )
                    },
                );
                Mlp {
                    gate_proj: Linear::load_fp4(dir, &g, inter, h)?,
                    up_proj: Linear::load_fp4(dir, &u, inter, h)?,
                    down_proj: Linear::load_fp4(dir, &d, h, inter)?,
                    limit: None,
                }
            } else if !names.hub && dir.has(&fused) {
                let down = m("experts.down_proj", "");
                Mlp {
                    gate_proj: Linear::load_fused_expert(dir, &fused, e, ne, 0, 2, inter, h)?,
                    up_proj: Linear::load_fused_expert(dir, &fused, e, ne, 1, 2, inter, h)?,
                    down_proj: Linear::load_fused_expert(dir, &down, e, ne, 0, 1, h, inter)?,
                    limit: None,
                }
            } else {
                let [g, u, d] = [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")].map(
                    |(tf, hub)| m(&format!("experts.{e}.{tf}"), &format!("experts.{e}.{hub}")),
                );
                Mlp::load(dir, [&g, &u, &d], h, inter, false)?
            };
            mlp.limit = Some(limit);
            Ok(Expert::SwiGlu(mlp))
        })
        .collect::<Result<Vec<_>>>()?;
    let [g, u, d] =
        [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")].map(|(tf, hub)| {
            m(
                &format!("shared_experts.{tf}"),
                &format!("shared_experts.{hub}"),
            )
        });
    let mut shared = Mlp::load(dir, [&g, &u, &d], h, inter, false)?;
    shared.limit = Some(limit);
    Ok(Moe {
        router: Linear::load(dir, &m("gate.weight", "gate.weight"), ne, h)?,
        experts,
        top_k: k,
        routing: Routing::Scored {
            score,
            choice,
            scaling: cfg.routed_scaling_factor as f32,
        },
        shared: Some(SharedExpert {
            mlp: shared,
            gate: None,
        }),
    })
}

/// How the routed experts are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ExpertDtype {
    /// As their dtype says (BF16, FP8, coli containers).
    Native,
    /// FP4 e2m1 with a scale per 32 columns (`expert_dtype: "fp4"`).
    Fp4,
}

/// `expert_dtype`, top-level (the release) or in `quantization_config`.
fn expert_dtype(dir: &ModelDir, cfg: &DeepseekV4Config) -> Result<ExpertDtype> {
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

/// `tid2eid` `[vocab, top_k]` (I64 or I32): every entry an expert index, the experts of a
/// row distinct.
fn load_token_table(
    dir: &ModelDir,
    name: &str,
    vocab: usize,
    k: usize,
    n_experts: usize,
) -> Result<Vec<u32>> {
    let t = dir.tensor_shaped(name, &[vocab, k])?;
    let bytes = t.read_bytes()?;
    let values: Vec<i64> = match t.dtype_name.as_str() {
        "I64" => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
        "I32" => bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
            .collect(),
        other => {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                msg: format!("the token-to-expert table must be I64 or I32, found {other}"),
            })
        }
    };
    let bad = |msg: String| ModelError::BadTensor {
        name: name.to_string(),
        msg,
    };
    let mut out = Vec::with_capacity(values.len());
    for (tok, row) in values.chunks_exact(k).enumerate() {
        for (j, &e) in row.iter().enumerate() {
            if e < 0 || e as usize >= n_experts {
                return Err(bad(format!(
                    "token {tok} routes to expert {e}, outside 0..{n_experts}"
                )));
            }
            if row[..j].contains(&e) {
                return Err(bad(format!("token {tok} lists expert {e} twice")));
            }
            out.push(e as u32);
        }
    }
    Ok(out)
}
