//! Qwen3-Next (Qwen3-Next-80B-A3B): a hybrid of Gated DeltaNet linear-attention layers and
//! gated full-attention layers (`layer_types`, or every `full_attention_interval`-th layer
//! full). Full attention gates its output with `sigmoid` of a second half of `q_proj`,
//! RMS-normalises q and k per head and rotates the first `partial_rotary_factor` of each
//! head. Every RMSNorm but the DeltaNet's gated one is zero-centred: it scales by
//! `1 + weight` (folded into the weight at load). MoE layers route softmax top-k over SwiGLU
//! experts and add a shared expert scaled by `sigmoid(shared_expert_gate x)`; layers in
//! `mlp_only_layers` keep a dense MLP. Mirrors `modeling_qwen3_next.py`.

use coli_core::ModelDir;
use coli_kernels::rope::RopeLayout;
use serde::Deserialize;

use crate::arch::deltanet::MAX_VALUE_DIM;
use crate::arch::layer::head_dim;
use crate::arch::moe::{check_top_k, load_experts};
use crate::arch::{
    Attention, DeltaDims, Expert, Ffn, GatedDeltaNet, KvLayout, KvShape, Mixer, Mlp, Moe, QkNorm,
    Routing, SharedExpert, Transformer,
};
use crate::error::Result;
use crate::families::skeleton::{layer_kinds, CommonConfig, Defaults, Skeleton};
use crate::families::{Capability, Family, TensorLayout};
use crate::weights::{load_vector, Linear};

/// `config.json` of a Qwen3-Next checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct Qwen3NextConfig {
    /// The keys every family shares (`head_dim` defaults to 256 here, not hidden / heads).
    #[serde(flatten)]
    pub common: CommonConfig,
    /// Width of the dense MLP of `mlp_only_layers` / non-sparse layers.
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    /// Every `decoder_sparse_step`-th layer is sparse.
    #[serde(default = "crate::serde_defaults::one")]
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP.
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    /// Width of each routed expert.
    pub moe_intermediate_size: usize,
    /// Width of the shared expert.
    pub shared_expert_intermediate_size: usize,
    /// Routed experts per layer.
    pub num_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Renormalise the top-k routing weights.
    #[serde(default = "crate::serde_defaults::yes")]
    pub norm_topk_prob: bool,
    /// `linear_attention` or `full_attention` per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Without `layer_types`: every this-many-th layer is full attention.
    #[serde(default)]
    pub full_attention_interval: Option<usize>,
    /// Key heads of the linear-attention layers.
    #[serde(default = "default_key_heads")]
    pub linear_num_key_heads: usize,
    /// Value heads of the linear-attention layers.
    #[serde(default = "default_value_heads")]
    pub linear_num_value_heads: usize,
    /// Key head dimension of the linear-attention layers.
    #[serde(default = "default_head_dim")]
    pub linear_key_head_dim: usize,
    /// Value head dimension of the linear-attention layers.
    #[serde(default = "default_head_dim")]
    pub linear_value_head_dim: usize,
    /// Taps of the causal convolution.
    #[serde(default = "default_conv")]
    pub linear_conv_kernel_dim: usize,
    /// Rotated fraction of each full-attention head.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// The zero-centred norms are stored as `1 + w` already: llama.cpp's converter adds
    /// the one (in f32, as transformers does). Not a transformers key: coli's GGUF reader
    /// writes it into the config it derives from a `qwen3next` GGUF.
    #[serde(default)]
    pub norms_stored_one_plus: bool,
}

fn default_key_heads() -> usize {
    16
}

fn default_value_heads() -> usize {
    32
}

fn default_head_dim() -> usize {
    128
}

fn default_conv() -> usize {
    4
}

/// `Qwen3NextConfig` has no `attribute_map` in `transformers` 5.24; transformers 5 writes
/// `partial_rotary_factor` inside `rope_parameters`.
pub const CONFIG_ALIASES: &[(&str, &str)] = &[(
    "rope_parameters.partial_rotary_factor",
    "partial_rotary_factor",
)];

/// `Qwen3NextConfig`'s defaults in `transformers`.
const DEFAULTS: Defaults = Defaults {
    rms_norm_eps: 1e-6,
    max_position_embeddings: 32768,
    rope_theta: 10000.0,
};

/// The fused expert tensors of a layer, as transformers 5 holds Qwen-style experts.
pub(crate) const FUSED_EXPERTS: &[&str] = &[".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"];

/// `Qwen3NextConfig.head_dim`'s default (not hidden / heads).
const DEFAULT_HEAD_DIM: usize = 256;

/// The Qwen3-Next family.
pub struct Qwen3Next;

impl Family for Qwen3Next {
    const MODEL_TYPES: &'static [&'static str] = &["qwen3_next"];
    const DISPLAY_NAME: &'static str = "Qwen3-Next";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::SharedExperts,
        Capability::Gqa,
        Capability::QkNorm,
        Capability::LinearAttention,
        Capability::Dense,
    ];
    /// The hub checkpoints' MTP head (`mtp.*`) is never read; fused experts (as
    /// transformers 5 holds them) are streamed like per-expert ones.
    const LAYOUT: TensorLayout = TensorLayout {
        ignored: &["mtp."],
        fused_experts: FUSED_EXPERTS,
        ..TensorLayout::STANDARD
    };

    fn load(dir: &ModelDir) -> Result<Transformer> {
        load_hybrid(dir, Variant::Next)
    }

    fn kv_layout(dir: &ModelDir) -> Result<KvLayout> {
        hybrid_kv_layout(dir)
    }
}

/// Qwen3-Next, or Qwen3.5-MoE's text model (`crate::families::qwen3_5_moe`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// Grouped `in_proj_qkvz` / `in_proj_ba`; `norm_topk_prob`, `mlp_only_layers` and
    /// `decoder_sparse_step` as configured; per-expert tensors.
    Next,
    /// Separate `in_proj_qkv` / `z` / `b` / `a`; every layer a MoE that renormalises its
    /// top-k; experts per expert or fused (`experts.gate_up_proj` `[E, 2I, H]`,
    /// `experts.down_proj` `[E, H, I]`); the text model under `model.language_model` beside
    /// a vision tower, or under `model`.
    Qwen35,
}

/// Loads either variant.
pub(crate) fn load_hybrid(dir: &ModelDir, variant: Variant) -> Result<Transformer> {
    let cfg = config(dir)?;
    let c = &dir.config;
    let full = full_attention_layers(dir, &cfg)?;
    let dims = delta_dims(dir, &cfg)?;
    if cfg.decoder_sparse_step == 0 {
        return Err(c.error("decoder_sparse_step", "must be positive").into());
    }
    check_top_k(dir, "num_experts", cfg.num_experts, cfg.num_experts_per_tok)?;
    let name = match variant {
        Variant::Next => Qwen3Next::DISPLAY_NAME,
        Variant::Qwen35 => super::qwen3_5_moe::Qwen35Moe::DISPLAY_NAME,
    };
    let mut sk = Skeleton::gqa(dir, name, &cfg.common, DEFAULTS)?;
    let vision = variant == Variant::Qwen35 && dir.has("model.language_model.embed_tokens.weight");
    if vision {
        sk.prefix = "model.language_model".into();
    }
    let (info, h) = (sk.info.clone(), cfg.common.hidden_size);
    let rot = rotary_dims(dir, &cfg, info.head_dim)?;
    let stored = cfg.norms_stored_one_plus;
    let one_plus = |w: Vec<f32>| if stored { w } else { one_plus(w) };
    let zero_centred =
        |name: &str, len: usize| -> Result<Vec<f32>> { Ok(one_plus(load_vector(dir, name, len)?)) };
    let norm_topk_prob = variant == Variant::Qwen35 || cfg.norm_topk_prob;
    let mut model = sk.assemble(rot, RopeLayout::HalfSplit, |i, p| {
        let mixer = if full[i] {
            let a = format!("{p}.self_attn");
            let mut attn = Attention::load_gated(dir, &a, &info, cfg.attention_bias)?;
            attn.qk_norm = QkNorm::PerHead {
                q: zero_centred(&format!("{a}.q_norm.weight"), info.head_dim)?,
                k: zero_centred(&format!("{a}.k_norm.weight"), info.head_dim)?,
            };
            Mixer::Gqa(Box::new(attn))
        } else {
            Mixer::DeltaNet(Box::new(GatedDeltaNet::load(
                dir,
                &format!("{p}.linear_attn"),
                h,
                dims,
                variant == Variant::Qwen35,
            )?))
        };
        let sparse = variant == Variant::Qwen35
            || (!cfg.mlp_only_layers.contains(&i)
                && cfg.num_experts > 0
                && (i + 1).is_multiple_of(cfg.decoder_sparse_step));
        let m = format!("{p}.mlp");
        let ffn = if sparse {
            Ffn::Moe(Box::new(Moe {
                router: Linear::load(dir, &format!("{m}.gate.weight"), cfg.num_experts, h)?,
                experts: experts(dir, &m, &cfg)?,
                top_k: cfg.num_experts_per_tok,
                routing: Routing::Softmax { norm_topk_prob },
                shared: Some(SharedExpert {
                    mlp: Mlp::load_swiglu(
                        dir,
                        &format!("{m}.shared_expert"),
                        h,
                        cfg.shared_expert_intermediate_size,
                    )?,
                    gate: Some(Linear::load(
                        dir,
                        &format!("{m}.shared_expert_gate.weight"),
                        1,
                        h,
                    )?),
                }),
            }))
        } else {
            let width = cfg.intermediate_size.ok_or_else(|| {
                c.error(
                    "intermediate_size",
                    format!("missing, and layer {i} has a dense MLP"),
                )
            })?;
            Ffn::Dense(Box::new(Mlp::load_swiglu(dir, &m, h, width)?))
        };
        Ok((mixer, ffn))
    })?;
    for l in &mut model.layers {
        l.input_layernorm = one_plus(std::mem::take(&mut l.input_layernorm));
        l.post_attention_layernorm = one_plus(std::mem::take(&mut l.post_attention_layernorm));
    }
    model.norm = one_plus(std::mem::take(&mut model.norm));
    if vision
        && dir
            .tensor_names()
            .iter()
            .any(|n| n.starts_with("model.visual."))
    {
        model.info.notes.push(
            "the vision tower (model.visual.*) is not loaded: coli runs the text model".into(),
        );
    }
    Ok(model)
}

/// The routed experts of `{m}.experts`: per expert (`{e}.gate_proj.weight` …), or fused as
/// transformers 5 holds them (`gate_up_proj` `[E, 2I, H]`, `down_proj` `[E, H, I]`).
fn experts(dir: &ModelDir, m: &str, cfg: &Qwen3NextConfig) -> Result<Vec<Expert>> {
    let (n, h, inter) = (
        cfg.num_experts,
        cfg.common.hidden_size,
        cfg.moe_intermediate_size,
    );
    let prefix = format!("{m}.experts");
    let gate_up = format!("{prefix}.gate_up_proj");
    if !dir.has(&gate_up) {
        return load_experts(
            dir,
            &prefix,
            n,
            ["gate_proj", "up_proj", "down_proj"],
            h,
            inter,
        );
    }
    let down = format!("{prefix}.down_proj");
    (0..n)
        .map(|e| {
            Ok(Expert::SwiGlu(Mlp {
                gate_proj: Linear::load_fused_expert(dir, &gate_up, e, n, 0, 2, inter, h)?,
                up_proj: Linear::load_fused_expert(dir, &gate_up, e, n, 1, 2, inter, h)?,
                down_proj: Linear::load_fused_expert(dir, &down, e, n, 0, 1, h, inter)?,
                limit: None,
            }))
        })
        .collect()
}

/// The KV layout of either variant: keys and values on the full-attention layers, a
/// recurrent state on the others.
pub(crate) fn hybrid_kv_layout(dir: &ModelDir) -> Result<KvLayout> {
    let cfg = config(dir)?;
    let c = &cfg.common;
    let n_kv = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
    let hd = head_dim(dir, c.hidden_size, c.num_attention_heads, n_kv, c.head_dim)?;
    let full = full_attention_layers(dir, &cfg)?;
    let state = delta_dims(dir, &cfg)?.state_floats();
    let mut layout = KvLayout::uniform(c.num_hidden_layers, KvShape::gqa(n_kv, hd));
    layout.attends = full.clone();
    layout.state_floats = full.iter().map(|&f| if f { 0 } else { state }).collect();
    Ok(layout)
}

/// The config with its aliases applied and `head_dim`'s family default.
fn config(dir: &ModelDir) -> Result<Qwen3NextConfig> {
    let mut cfg: Qwen3NextConfig = dir.config.deserialize_aliased(CONFIG_ALIASES)?;
    cfg.common.head_dim = Some(cfg.common.head_dim.unwrap_or(DEFAULT_HEAD_DIM));
    Ok(cfg)
}

/// A zero-centred RMSNorm weight as coli's RMSNorm takes it: `1 + w` (in f32, as
/// `transformers` computes it).
fn one_plus(w: Vec<f32>) -> Vec<f32> {
    w.into_iter().map(|x| 1.0 + x).collect()
}

/// Per layer, whether it is full attention: `layer_types` as written, else every
/// `full_attention_interval`-th layer (default 4), as `Qwen3NextConfig` derives it.
fn full_attention_layers(dir: &ModelDir, cfg: &Qwen3NextConfig) -> Result<Vec<bool>> {
    let n = cfg.common.num_hidden_layers;
    let c = &dir.config;
    let Some(types) = &cfg.layer_types else {
        let every = cfg.full_attention_interval.unwrap_or(4);
        if every == 0 {
            return Err(c
                .error("full_attention_interval", "must be positive")
                .into());
        }
        return Ok((0..n).map(|i| (i + 1).is_multiple_of(every)).collect());
    };
    layer_kinds(
        dir,
        types,
        n,
        &[("linear_attention", false), ("full_attention", true)],
    )
}

/// The linear-attention shape, checked: positive sizes, value heads a multiple of key
/// heads, a value head within the kernels' buffer.
fn delta_dims(dir: &ModelDir, cfg: &Qwen3NextConfig) -> Result<DeltaDims> {
    let c = &dir.config;
    let d = DeltaDims {
        key_heads: cfg.linear_num_key_heads,
        value_heads: cfg.linear_num_value_heads,
        key_dim: cfg.linear_key_head_dim,
        value_dim: cfg.linear_value_head_dim,
        conv_kernel: cfg.linear_conv_kernel_dim,
    };
    for (key, v) in [
        ("linear_num_key_heads", d.key_heads),
        ("linear_num_value_heads", d.value_heads),
        ("linear_key_head_dim", d.key_dim),
        ("linear_value_head_dim", d.value_dim),
        ("linear_conv_kernel_dim", d.conv_kernel),
    ] {
        if v == 0 {
            return Err(c.error(key, "must be positive").into());
        }
    }
    if !d.value_heads.is_multiple_of(d.key_heads) {
        return Err(c
            .error(
                "linear_num_value_heads",
                format!(
                    "{} is not a multiple of linear_num_key_heads = {}",
                    d.value_heads, d.key_heads
                ),
            )
            .into());
    }
    if d.value_dim > MAX_VALUE_DIM {
        return Err(c
            .error(
                "linear_value_head_dim",
                format!("{} is above the supported {MAX_VALUE_DIM}", d.value_dim),
            )
            .into());
    }
    Ok(d)
}

/// Rotated dimensions per full-attention head: `int(head_dim * partial_rotary_factor)`
/// (default 0.25), even and within the head.
fn rotary_dims(dir: &ModelDir, cfg: &Qwen3NextConfig, hd: usize) -> Result<usize> {
    let f = cfg.partial_rotary_factor.unwrap_or(0.25);
    let rot = (hd as f64 * f) as usize;
    if !(f > 0.0 && f <= 1.0) || rot == 0 || !rot.is_multiple_of(2) {
        return Err(dir
            .config
            .error(
                "partial_rotary_factor",
                format!("{f} of head_dim {hd} gives {rot} rotary dims; need an even number in 2..=head_dim"),
            )
            .into());
    }
    Ok(rot)
}
