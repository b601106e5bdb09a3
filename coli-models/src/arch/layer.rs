//! The pre-norm decoder layer (`x += mixer(norm(x)); x += ffn(norm(x))`), and the pieces
//! every family loads the same way: head-count checks, embeddings and LM head.

use coli_core::ModelDir;

use super::{
    Attention, CompressedAttention, GatedDeltaNet, HyperConnection, Mla, Mlp, ModelInfo, Moe,
    MAX_ROT_HALF,
};
use crate::error::Result;
use crate::weights::{load_vector, Linear};

/// The token mixer of a layer.
#[derive(Clone, Debug)]
pub enum Mixer {
    /// Grouped-query attention over a per-head KV cache.
    Gqa(Box<Attention>),
    /// Multi-head latent attention over a compressed cache.
    Mla(Box<Mla>),
    /// Gated DeltaNet linear attention over a fixed-size recurrent state.
    DeltaNet(Box<GatedDeltaNet>),
    /// DeepSeek-V4's shared-KV attention over a sliding window and compressed entries.
    Compressed(Box<CompressedAttention>),
}

/// The feed-forward part of a layer.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// Dense SwiGLU.
    Dense(Box<Mlp>),
    /// Mixture of experts.
    Moe(Box<Moe>),
}

/// One pre-norm decoder layer.
#[derive(Clone, Debug)]
pub struct Layer {
    /// RMSNorm before attention.
    pub input_layernorm: Vec<f32>,
    /// Attention.
    pub attn: Mixer,
    /// RMSNorm before the feed-forward block.
    pub post_attention_layernorm: Vec<f32>,
    /// Feed-forward block.
    pub ffn: Ffn,
    /// DeepSeek-V4's hyper-connections in front of the attention and the feed-forward
    /// block (`attn_hc`, `ffn_hc`), when the model has several residual streams.
    pub hc: Option<Box<[HyperConnection; 2]>>,
}

impl Layer {
    /// The layer `{p}` around its mixer and feed-forward block (loads the two norms).
    pub fn load(dir: &ModelDir, p: &str, hidden: usize, attn: Mixer, ffn: Ffn) -> Result<Layer> {
        let norm = |name: &str| load_vector(dir, &format!("{p}.{name}.weight"), hidden);
        Ok(Layer {
            input_layernorm: norm("input_layernorm")?,
            attn,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            ffn,
            hc: None,
        })
    }
}

/// Checks head counts against each other and returns `head_dim` (explicit, or
/// `hidden / n_heads`): even, positive and within what RoPE rotates. Errors name the key.
pub fn head_dim(
    dir: &ModelDir,
    hidden: usize,
    n_heads: usize,
    n_kv_heads: usize,
    explicit: Option<usize>,
) -> Result<usize> {
    let c = &dir.config;
    if n_heads == 0 {
        return Err(c.error("num_attention_heads", "must be positive").into());
    }
    if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(c
            .error(
                "num_key_value_heads",
                format!("{n_kv_heads} must be positive and divide num_attention_heads = {n_heads}"),
            )
            .into());
    }
    let hd = explicit.unwrap_or(hidden / n_heads);
    if hd == 0 || !hd.is_multiple_of(2) || hd > 2 * MAX_ROT_HALF {
        return Err(c
            .error(
                "head_dim",
                format!(
                    "{hd} must be even, positive and at most {}",
                    2 * MAX_ROT_HALF
                ),
            )
            .into());
    }
    Ok(hd)
}

/// The embedding and the LM head (tied: the head reads the embedding's bytes).
pub fn embeddings(
    dir: &ModelDir,
    embed: &str,
    head: &str,
    info: &ModelInfo,
    tied: bool,
) -> Result<(Linear, Linear)> {
    let e = Linear::load(dir, embed, info.vocab_size, info.hidden_size)?;
    let head = if tied && !dir.has(head) {
        e.clone()
    } else {
        Linear::load(dir, head, info.vocab_size, info.hidden_size)?
    };
    Ok((e, head))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, ModelDir) {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        let d = ModelDir::config_only(t.path()).unwrap();
        (t, d)
    }

    #[test]
    fn head_counts_and_head_dim_are_checked_at_load() {
        let (_t, d) = dir();
        assert_eq!(head_dim(&d, 576, 9, 3, None).unwrap(), 64);
        assert_eq!(head_dim(&d, 576, 9, 3, Some(128)).unwrap(), 128);
        // Larger than RoPE's stack buffers rotate: refused here, not a panic at the first
        // forward.
        let e = head_dim(&d, 4096, 2, 2, None).unwrap_err().to_string();
        assert!(e.contains("head_dim") && e.contains("2048"), "{e}");
        for (heads, kv, key) in [(0, 1, "num_attention_heads"), (9, 2, "num_key_value_heads")] {
            let e = head_dim(&d, 576, heads, kv, None).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
        let e = head_dim(&d, 576, 8, 8, Some(71)).unwrap_err().to_string();
        assert!(e.contains("even"), "{e}");
    }
}
