//! gpt-oss (gpt-oss-20b, gpt-oss-120b): grouped-query attention with biases on every
//! projection, a learned sink logit per head, and layers alternating between a sliding
//! window and full attention (`layer_types`); YaRN RoPE on half-split heads. Every layer is
//! a MoE whose router has a bias and picks the top-k logits before a softmax over them; each
//! expert is one interleaved gate/up projection and a down projection, both with biases, and
//! a clamped GLU (`swiglu_limit`, `swiglu_alpha`). The release stores the experts as MXFP4
//! (`_blocks` + `_scales`), which coli reads natively; unquantized re-uploads keep
//! transformers' fused layout (`[experts, in, out]`, each matrix input-major), which the
//! expert store and the resident copy transpose once; `coli convert` writes those per
//! expert (`experts.{e}.gate_up_proj.weight`, `[out, in]`, in any of its formats). A sliding layer's cache keeps only
//! its window's keys and values, in a ring ([`crate::arch::ring`]). Mirrors
//! `modeling_gpt_oss.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::layer::head_dim;
use crate::arch::moe::check_top_k;
use crate::arch::ring::RingShape;
use crate::arch::{
    Attention, ClampedGlu, Expert, Ffn, GluExpert, GluInput, KvLayout, KvShape, Mixer, Moe,
    Routing, Transformer,
};
use crate::error::Result;
use crate::families::skeleton::{layer_kinds, CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family, TensorLayout};
use crate::weights::{expert_bias, load_vector, Linear};

/// `config.json` of a gpt-oss checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct GptOssConfig {
    /// The keys every family shares.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// Width of each expert.
    pub intermediate_size: usize,
    /// Experts per layer.
    pub num_local_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Window of the sliding layers (`None`: every layer attends to everything).
    #[serde(default = "default_window")]
    pub sliding_window: Option<usize>,
    /// `sliding_attention` or `full_attention` per layer (default: even layers slide).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Sigmoid gain of the expert activation.
    #[serde(default = "default_alpha")]
    pub swiglu_alpha: f64,
    /// Clamp of the expert activation.
    #[serde(default = "default_limit")]
    pub swiglu_limit: f64,
    /// Biases on q/k/v/o (the release has them).
    #[serde(default = "crate::serde_defaults::yes")]
    pub attention_bias: bool,
}

fn default_window() -> Option<usize> {
    Some(128)
}

fn default_alpha() -> f64 {
    1.702
}

fn default_limit() -> f64 {
    7.0
}

/// `GptOssConfig.attribute_map` in `transformers` 5.24: `(alias, key)`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[("num_experts", "num_local_experts")];

/// `GptOssConfig`'s defaults in `transformers` (its default RoPE is the release's YaRN,
/// which a config without RoPE keys does not get here: coli reads what the file says).
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-5,
    max_position_embeddings: 131072,
    rope_theta: 150000.0,
};

/// The gpt-oss family.
pub struct GptOss;

impl Family for GptOss {
    const MODEL_TYPES: &'static [&'static str] = &["gpt_oss"];
    const DISPLAY_NAME: &'static str = "gpt-oss";
    const CAPABILITIES: &'static [Capability] = &[Capability::Moe, Capability::Gqa];
    /// The experts' MXFP4 blocks and their E8M0 scales (or, unquantized, their input-major
    /// matrices) are streamed; their biases are read once at load and stay resident.
    const LAYOUT: TensorLayout = TensorLayout {
        fused_experts: &[
            ".mlp.experts.gate_up_proj_blocks",
            ".mlp.experts.down_proj_blocks",
            ".mlp.experts.gate_up_proj_scales",
            ".mlp.experts.down_proj_scales",
            ".mlp.experts.gate_up_proj",
            ".mlp.experts.down_proj",
        ],
        ..TensorLayout::STANDARD
    };
    fn load(dir: &ModelDir) -> Result<Transformer> {
        let cfg: GptOssConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let c = &dir.config;
        let n_layers = cfg.common.num_hidden_layers;
        let sliding = sliding_layers(dir, &cfg)?;
        let (n_experts, top_k) = (cfg.num_local_experts, cfg.num_experts_per_tok);
        check_top_k(dir, "num_local_experts", n_experts, top_k)?;
        let act = ClampedGlu {
            alpha: cfg.swiglu_alpha as f32,
            limit: cfg.swiglu_limit as f32,
        };
        if !(act.alpha.is_finite() && act.limit.is_finite() && act.limit > 0.0) {
            return Err(c
                .error(
                    "swiglu_limit",
                    "swiglu_alpha and swiglu_limit must be finite, the limit positive",
                )
                .into());
        }
        let sk = Skeleton::gqa(dir, GptOss::DISPLAY_NAME, &cfg.common, DEFAULTS)?;
        let (info, h, inter) = (
            sk.info.clone(),
            cfg.common.hidden_size,
            cfg.intermediate_size,
        );
        debug_assert_eq!(sliding.len(), n_layers);
        sk.assemble(info.head_dim, RopeLayout::HalfSplit, |i, p| {
            let bias = cfg.attention_bias;
            let mut attn = Attention::load(dir, &format!("{p}.self_attn"), &info, bias, bias)?;
            attn.sinks = Some(load_vector(
                dir,
                &format!("{p}.self_attn.sinks"),
                info.n_heads,
            )?);
            attn.window = if sliding[i] { cfg.sliding_window } else { None };
            let m = format!("{p}.mlp");
            let experts = (0..n_experts)
                .map(|e| load_expert(dir, &format!("{m}.experts"), e, n_experts, h, inter, act))
                .collect::<Result<Vec<_>>>()?;
            let moe = Moe {
                router: Linear::load_prefixed(dir, &format!("{m}.router"), n_experts, h, true)?,
                experts,
                top_k,
                routing: Routing::TopKSoftmax,
                shared: None,
            };
            Ok((Mixer::Gqa(Box::new(attn)), Ffn::Moe(Box::new(moe))))
        })
    }

    /// Full layers keep every position's keys and values; sliding layers only their
    /// window's, in a ring.
    fn kv_layout(dir: &ModelDir) -> Result<KvLayout> {
        let cfg: GptOssConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
        let sliding = sliding_layers(dir, &cfg)?;
        let c = &cfg.common;
        let n_kv = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        let hd = head_dim(dir, c.hidden_size, c.num_attention_heads, n_kv, c.head_dim)?;
        let shape = KvShape::gqa(n_kv, hd);
        let mut l = KvLayout::uniform(c.num_hidden_layers, shape);
        for (i, _) in sliding.iter().enumerate().filter(|(_, &s)| s) {
            if let Some(w) = cfg.sliding_window {
                l.attends[i] = false;
                l.rings[i] = Some(RingShape::sliding(w, shape));
            }
        }
        Ok(l)
    }
}

/// Which layers slide: `layer_types` as written, else transformers' default (even layers).
fn sliding_layers(dir: &ModelDir, cfg: &GptOssConfig) -> Result<Vec<bool>> {
    let n = cfg.common.num_hidden_layers;
    let c = &dir.config;
    let Some(types) = &cfg.layer_types else {
        return Ok((0..n).map(|i| i % 2 == 0).collect());
    };
    let sliding = layer_kinds(
        dir,
        types,
        n,
        &[("sliding_attention", true), ("full_attention", false)],
    )?;
    if sliding.contains(&true) && matches!(cfg.sliding_window, Some(0) | None) {
        return Err(c
            .error(
                "sliding_window",
                "a sliding_attention layer needs a positive sliding_window",
            )
            .into());
    }
    Ok(sliding)
}

/// Expert `e` of `{prefix}` from the release's MXFP4 tensors.
fn load_expert(
    dir: &ModelDir,
    prefix: &str,
    e: usize,
    n_experts: usize,
    hidden: usize,
    inter: usize,
    act: ClampedGlu,
) -> Result<Expert> {
    let gate_up = format!("{prefix}.gate_up_proj");
    let down = format!("{prefix}.down_proj");
    let bias = |name: &str, rows: usize| expert_bias(dir, name, e, n_experts, rows);
    let split_gate = format!("{prefix}.{e}.gate_proj.weight");
    if dir.has(&split_gate) {
        // llama.cpp's GGUF: the converter splits the interleaved rows into separate gate
        // and up projections (`ffn_gate_exps`, `ffn_up_exps`), each with its bias
        // (`{prefix}.gate_proj_bias` `[E, inter]`), in whatever type each was quantized to.
        let load = |m: &str, rows: usize, cols: usize| -> Result<Linear> {
            Ok(
                Linear::load(dir, &format!("{prefix}.{e}.{m}.weight"), rows, cols)?
                    .with_bias(bias(&format!("{prefix}.{m}"), rows)?),
            )
        };
        return Ok(Expert::Glu(GluExpert {
            input: GluInput::Split {
                gate: load("gate_proj", inter, hidden)?,
                up: load("up_proj", inter, hidden)?,
            },
            down: load("down_proj", hidden, inter)?,
            act,
        }));
    }
    let own = format!("{prefix}.{e}.gate_up_proj.weight");
    if dir.has(&own) {
        // Per expert, `[out, in]`, in any format `Linear::load` reads: what `coli convert`
        // writes from the unquantized fused layout. The biases stay fused.
        let own_down = format!("{prefix}.{e}.down_proj.weight");
        return Ok(Expert::Glu(GluExpert {
            input: GluInput::Interleaved(
                Linear::load(dir, &own, 2 * inter, hidden)?.with_bias(bias(&gate_up, 2 * inter)?),
            ),
            down: Linear::load(dir, &own_down, hidden, inter)?.with_bias(bias(&down, hidden)?),
            act,
        }));
    }
    // Unquantized, as transformers saves it (BF16 re-uploads): [E, in, out] per layer;
    // else the release's MXFP4 blocks and scales.
    let load = if !dir.has(&format!("{gate_up}_blocks")) && dir.has(&gate_up) {
        Linear::load_transposed_expert
    } else {
        Linear::load_mxfp4_expert
    };
    Ok(Expert::Glu(GluExpert {
        input: GluInput::Interleaved(load(dir, &gate_up, e, n_experts, 2 * inter, hidden)?),
        down: load(dir, &down, e, n_experts, hidden, inter)?,
        act,
    }))
}
