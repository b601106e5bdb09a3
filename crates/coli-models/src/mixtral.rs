//! Mixtral: every layer a `block_sparse_moe` of SwiGLU experts named `w1` (gate),
//! `w3` (up) and `w2` (down); softmax over all router logits, top-k, weights
//! renormalised to sum to 1. Mirrors `modeling_mixtral.py`.

use coli_core::ModelDir;
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;

use crate::decoder::{load, Ffn, KvShape, Mixer, ModelInfo, Moe, Routing, Transformer};
use crate::error::Result;
use crate::registry::{Capability, Family};
use crate::weights::{load_vector, Linear};

/// `config.json` of a Mixtral checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct MixtralConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Width of each expert.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head dimension (defaults to `hidden_size / num_attention_heads`).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Experts per layer.
    pub num_local_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Sliding-window attention span (must be null: not supported).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Whether the LM head shares the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Trained context length.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_max_pos() -> usize {
    32768
}

/// The Mixtral family.
pub struct Mixtral;

impl Family for Mixtral {
    const MODEL_TYPES: &'static [&'static str] = &["mixtral"];
    const DISPLAY_NAME: &'static str = "Mixtral";
    const CAPABILITIES: &'static [Capability] = &[Capability::Moe, Capability::Gqa];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load(dir)
    }
}

fn load(dir: &ModelDir) -> Result<Transformer> {
    let cfg: MixtralConfig = dir.config.deserialize()?;
    let c = &dir.config;
    if let Some(w) = cfg.sliding_window {
        return Err(c
            .error(
                "sliding_window",
                format!("sliding-window attention ({w}) is not supported; expected null"),
            )
            .into());
    }
    load::check_top_k(
        dir,
        "num_local_experts",
        cfg.num_local_experts,
        cfg.num_experts_per_tok,
    )?;
    let n_kv = cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads);
    let head_dim = load::head_dim(
        dir,
        cfg.hidden_size,
        cfg.num_attention_heads,
        n_kv,
        cfg.head_dim,
    )?;
    let info = ModelInfo {
        family: Mixtral::DISPLAY_NAME,
        model_type: c.model_type()?.to_string(),
        vocab_size: cfg.vocab_size,
        hidden_size: cfg.hidden_size,
        n_layers: cfg.num_hidden_layers,
        n_heads: cfg.num_attention_heads,
        n_kv_heads: n_kv,
        head_dim,
        max_position_embeddings: cfg.max_position_embeddings,
        eos_token_ids: c.eos_token_ids()?,
        kv: KvShape::gqa(n_kv, head_dim),
    };
    let rope = c.rope_parameters(1e6)?;
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
            let attn = load::attention(dir, &format!("{p}.self_attn"), &info, false, false)?;
            let moe = Moe {
                router: Linear::load(
                    dir,
                    &format!("{p}.block_sparse_moe.gate.weight"),
                    cfg.num_local_experts,
                    h,
                )?,
                experts: load::experts(
                    dir,
                    &format!("{p}.block_sparse_moe.experts"),
                    cfg.num_local_experts,
                    ["w1", "w3", "w2"],
                    h,
                    cfg.intermediate_size,
                )?,
                top_k: cfg.num_experts_per_tok,
                routing: Routing::Softmax {
                    norm_topk_prob: true,
                },
                shared: None,
            };
            load::layer(
                dir,
                &p,
                h,
                Mixer::Gqa(Box::new(attn)),
                Ffn::Moe(Box::new(moe)),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Transformer {
        norm: load_vector(dir, "model.norm.weight", h)?,
        rope: RopeTable::new(head_dim, rope.theta, &rope.scaling),
        rope_layout: RopeLayout::HalfSplit,
        rms_norm_eps: cfg.rms_norm_eps as f32,
        info,
        embed_tokens,
        layers,
        lm_head,
    })
}
