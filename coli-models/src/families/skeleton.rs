//! What every family's loader shares: the config keys all checkpoints spell the same,
//! the [`ModelInfo`], the layer loop, the embeddings, the final norm and the RoPE table.
//! A family file adds only what is its own (attention kind, feed-forward kind, names).

use coli_core::{ModelDir, RopeParameters};
use coli_kernels::rope::{RopeLayout, RopeTable};
use serde::Deserialize;

use crate::arch::layer::{embeddings, head_dim};
use crate::arch::mla::MlaDims;
use crate::arch::{Ffn, KvShape, Layer, Mixer, ModelInfo, Mtp, Transformer};
use crate::error::Result;
use crate::weights::load_vector;

/// The `config.json` keys every family spells the same way (flattened into each family's
/// own config struct).
#[derive(Clone, Debug, Deserialize)]
pub struct CommonConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Decoder layers (MTP layers, where a checkpoint has them, come after these).
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (defaults to the query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Explicit head dimension (defaults to hidden / heads).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon (family default when absent).
    #[serde(default)]
    pub rms_norm_eps: Option<f64>,
    /// Trained context length (family default when absent).
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    /// Whether the LM head shares the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Multi-token-prediction layers stored after the decoder layers (DeepSeek-V3, GLM).
    #[serde(default)]
    pub num_nextn_predict_layers: Option<usize>,
}

/// `layer_types` checked against `num_hidden_layers` (`n`), each entry mapped through
/// `kinds` (`(spelling, value)`); an unknown spelling is an error listing the known ones.
pub fn layer_kinds<T: Copy>(
    dir: &ModelDir,
    types: &[String],
    n: usize,
    kinds: &[(&str, T)],
) -> Result<Vec<T>> {
    let c = &dir.config;
    if types.len() != n {
        return Err(c
            .error(
                "layer_types",
                format!("has {} entries for num_hidden_layers = {n}", types.len()),
            )
            .into());
    }
    types
        .iter()
        .map(|t| {
            kinds
                .iter()
                .find(|(name, _)| name == t)
                .map(|&(_, v)| v)
                .ok_or_else(|| {
                    let known: Vec<&str> = kinds.iter().map(|(name, _)| *name).collect();
                    c.error(
                        "layer_types",
                        format!(
                            "unknown layer type \"{t}\" (expected {})",
                            known.join(" or ")
                        ),
                    )
                    .into()
                })
        })
        .collect()
}

/// A family's values for keys its configs may omit (its `transformers` config defaults).
#[derive(Clone, Copy, Debug)]
pub struct Defaults {
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `rope_theta`.
    pub rope_theta: f64,
}

/// The config, the family's defaults and the shape facts a loader builds everything else on.
pub struct Skeleton<'a> {
    /// The opened directory.
    pub dir: &'a ModelDir,
    /// The shared keys.
    pub common: &'a CommonConfig,
    /// Shape facts.
    pub info: ModelInfo,
    /// RoPE base and scaling.
    pub rope: RopeParameters,
    /// What the text model's tensor names start with (`model`; Qwen3.5's multimodal
    /// checkpoints: `model.language_model`).
    pub prefix: String,
    /// Whether the family's MTP layer is its ordinary decoder layer at index
    /// `num_hidden_layers` (then [`Skeleton::assemble`] loads it for drafting).
    pub mtp: bool,
    defaults: Defaults,
}

impl<'a> Skeleton<'a> {
    /// Grouped-query attention: checks the head counts, derives `head_dim`.
    pub fn gqa(
        dir: &'a ModelDir,
        family: &'static str,
        common: &'a CommonConfig,
        defaults: Defaults,
    ) -> Result<Skeleton<'a>> {
        let c = common;
        let n_kv = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        let hd = head_dim(dir, c.hidden_size, c.num_attention_heads, n_kv, c.head_dim)?;
        Self::with_kv(
            dir,
            family,
            common,
            defaults,
            n_kv,
            hd,
            KvShape::gqa(n_kv, hd),
        )
    }

    /// Multi-head latent attention: the cache holds the latent and the rotary key.
    pub fn mla(
        dir: &'a ModelDir,
        family: &'static str,
        common: &'a CommonConfig,
        defaults: Defaults,
        dims: &MlaDims,
    ) -> Result<Skeleton<'a>> {
        dims.validate(dir)?;
        let kv = KvShape::mla(dims.kv_lora_rank, dims.rope);
        Self::with_kv(dir, family, common, defaults, 1, dims.nope + dims.rope, kv)
    }

    fn with_kv(
        dir: &'a ModelDir,
        family: &'static str,
        common: &'a CommonConfig,
        defaults: Defaults,
        n_kv_heads: usize,
        head_dim: usize,
        kv: KvShape,
    ) -> Result<Skeleton<'a>> {
        let c = &dir.config;
        let info = ModelInfo {
            family,
            model_type: c.model_type()?.to_string(),
            vocab_size: common.vocab_size,
            hidden_size: common.hidden_size,
            n_layers: common.num_hidden_layers,
            n_heads: common.num_attention_heads,
            n_kv_heads,
            head_dim,
            max_position_embeddings: common
                .max_position_embeddings
                .unwrap_or(defaults.max_position_embeddings),
            eos_token_ids: c.eos_token_ids()?,
            kv,
            notes: Vec::new(),
        };
        Ok(Skeleton {
            dir,
            common,
            info,
            rope: c.rope_parameters(defaults.rope_theta)?,
            prefix: "model".into(),
            mtp: false,
            defaults,
        })
    }

    /// Loads layer `i`'s mixer and feed-forward block with `layer(i, "{prefix}.layers.{i}")`,
    /// the norms around them, the embeddings and the final norm; RoPE rotates the first
    /// `rope_dim` elements of each head in `layout`.
    pub fn assemble(
        self,
        rope_dim: usize,
        layout: RopeLayout,
        layer: impl Fn(usize, &str) -> Result<(Mixer, Ffn)>,
    ) -> Result<Transformer> {
        let (dir, h, m) = (self.dir, self.common.hidden_size, &self.prefix);
        let (embed_tokens, lm_head) = embeddings(
            dir,
            &format!("{m}.embed_tokens.weight"),
            "lm_head.weight",
            &self.info,
            self.common.tie_word_embeddings,
        )?;
        let layers = (0..self.common.num_hidden_layers)
            .map(|i| {
                let p = format!("{m}.layers.{i}");
                let (mixer, ffn) = layer(i, &p)?;
                Layer::load(dir, &p, h, mixer, ffn)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut t = Transformer {
            norm: load_vector(dir, &format!("{m}.norm.weight"), h)?,
            rope: RopeTable::new(rope_dim, self.rope.theta, &self.rope.scaling),
            rope_layout: layout,
            rms_norm_eps: self
                .common
                .rms_norm_eps
                .unwrap_or(self.defaults.rms_norm_eps) as f32,
            info: self.info,
            embed_tokens,
            layers,
            lm_head,
            store: None,
            mtp: None,
            hyper: None,
        };
        // The first MTP layer, when the family has one and the checkpoint holds it (more
        // than one would chain; no published checkpoint has more).
        let n = self.common.num_hidden_layers;
        let p = format!("{m}.layers.{n}");
        if self.mtp
            && self.common.num_nextn_predict_layers.unwrap_or(0) > 0
            && dir.has(&format!("{p}.eh_proj.weight"))
        {
            let loaded = layer(n, &p)
                .and_then(|(mixer, ffn)| Layer::load(dir, &p, h, mixer, ffn))
                .and_then(|l| Mtp::load(dir, &p, &t, l));
            match loaded {
                Ok(mtp) => t.mtp = Some(Box::new(mtp)),
                Err(e) => t.info.notes.push(format!(
                    "the multi-token-prediction layer {p} is incomplete ({e}): drafting by MTP is off"
                )),
            }
        }
        Ok(t)
    }
}
