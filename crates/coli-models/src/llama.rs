//! Llama (and every checkpoint with `model_type: "llama"`, e.g. SmolLM2):
//! dense decoder, grouped-query attention, half-split RoPE with optional
//! `llama3` scaling, tied or untied embeddings. Mirrors `modeling_llama.py`.

use coli_core::ModelDir;
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;

use crate::decoder::{load, Ffn, KvShape, Layer, Mixer, ModelInfo, Transformer};
use crate::error::Result;
use crate::registry::{Capability, Family};
use crate::weights::load_vector;

/// `config.json` of a Llama checkpoint (the keys coli reads).
#[derive(Clone, Debug, Deserialize)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (defaults to the query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Explicit head dimension (defaults to hidden / heads).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Whether the LM head shares the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Trained context length.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    2048
}

/// The Llama family.
pub struct Llama;

impl Family for Llama {
    const MODEL_TYPES: &'static [&'static str] = &["llama"];
    const DISPLAY_NAME: &'static str = "Llama";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Dense,
        Capability::Gqa,
        Capability::TiedEmbeddings,
    ];
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load(dir)
    }
}

/// Loads a Llama checkpoint.
fn load(dir: &ModelDir) -> Result<Transformer> {
    let cfg: LlamaConfig = dir.config.deserialize()?;
    let n_kv = cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads);
    let head_dim = load::head_dim(
        dir,
        cfg.hidden_size,
        cfg.num_attention_heads,
        n_kv,
        cfg.head_dim,
    )?;
    let info = ModelInfo {
        family: "Llama",
        model_type: dir.config.model_type()?.to_string(),
        vocab_size: cfg.vocab_size,
        hidden_size: cfg.hidden_size,
        n_layers: cfg.num_hidden_layers,
        n_heads: cfg.num_attention_heads,
        n_kv_heads: n_kv,
        head_dim,
        max_position_embeddings: cfg.max_position_embeddings,
        eos_token_ids: dir.config.eos_token_ids()?,
        kv: KvShape::gqa(n_kv, head_dim),
    };
    let rope = dir.config.rope_parameters(10000.0)?;
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
            Ok(Layer {
                input_layernorm: load_vector(
                    dir,
                    &format!("{p}.input_layernorm.weight"),
                    cfg.hidden_size,
                )?,
                attn: Mixer::Gqa(Box::new(load::attention(
                    dir,
                    &format!("{p}.self_attn"),
                    &info,
                    cfg.attention_bias,
                    cfg.attention_bias,
                )?)),
                post_attention_layernorm: load_vector(
                    dir,
                    &format!("{p}.post_attention_layernorm.weight"),
                    cfg.hidden_size,
                )?,
                ffn: Ffn::Dense(Box::new(load::mlp(
                    dir,
                    [
                        &format!("{p}.mlp.gate_proj"),
                        &format!("{p}.mlp.up_proj"),
                        &format!("{p}.mlp.down_proj"),
                    ],
                    cfg.hidden_size,
                    cfg.intermediate_size,
                    cfg.mlp_bias,
                )?)),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Transformer {
        norm: load_vector(dir, "model.norm.weight", cfg.hidden_size)?,
        rope: RopeTable::new(head_dim, rope.theta, &rope.scaling),
        rope_layout: RopeLayout::HalfSplit,
        rms_norm_eps: cfg.rms_norm_eps as f32,
        info,
        embed_tokens,
        layers,
        lm_head,
    })
}
