//! The decoder-only transformer the families assemble, one file per block: each holds
//! its struct, its loader and its forward. The forward loop itself is here, in one place.
//!
//! * [`gqa`]: grouped-query attention (optional q/k norm, clipping).
//! * [`mla`]: multi-head latent attention over a compressed cache.
//! * [`dsa`]: DeepSeek sparse attention's lightning indexer (GLM-5).
//! * [`compressed`]: DeepSeek-V4's shared-KV attention over a sliding window and
//!   compressed entries ([`compressor`] makes them, [`ring`] keeps them); [`hyper`]: its
//!   hyper-connections (several residual streams).
//! * [`deltanet`]: Gated DeltaNet linear attention over a recurrent state (Qwen3-Next).
//! * [`mlp`]: the SwiGLU MLP.
//! * [`moe`]: routed mixture of experts (softmax or grouped-sigmoid routing, shared expert).
//! * [`kv`]: the KV cache and its shape; [`scratch`]: the reusable buffers.
//! * [`mtp`]: a multi-token-prediction layer (drafts the token after next).
//! * [`layer`]: the pre-norm layer, the embeddings and the shape checks every family shares.
//!
//! One forward pass handles any number of tokens: prefill is the same code as decode
//! with more rows, and every per-token result is computed in the same order either way,
//! so a prompt fed in one batch and one token at a time give identical bits.

pub mod compressed;
pub mod compressor;
pub mod deltanet;
pub mod dsa;
pub mod gqa;
pub mod hyper;
pub mod kv;
pub mod layer;
mod linears;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod mtp;
pub mod placement;
pub mod ring;
pub mod scratch;

use coli_kernels::norm::rms_norm;
use coli_kernels::rope::{apply as apply_rope, RopeLayout, RopeTable};

pub use self::compressed::{CompressedAttention, LightningIndexer};
pub use self::compressor::Compressor;
pub use self::deltanet::{DeltaDims, DeltaInput, GatedDeltaNet};
pub use self::dsa::{Dsa, Indexer};
pub use self::gqa::{Attention, QkNorm};
pub use self::hyper::{Hyper, HyperConnection, HyperHead};
pub use self::kv::{KvCache, KvLayout, KvShape};
pub use self::layer::{Ffn, Layer, Mixer};
pub use self::linears::LinearRole;
pub use self::mla::{KvUp, Mla, MlaQuery};
pub use self::mlp::{ClampedGlu, Expert, GluExpert, GluInput, Mlp};
pub use self::moe::{Choice, Moe, Routing, ScoreFn, SharedExpert};
pub use self::mtp::Mtp;
pub use self::scratch::Scratch;
use crate::experts::ExpertStore;
use crate::weights::Linear;

/// Shape facts every caller needs.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The family's display name.
    pub family: &'static str,
    /// `model_type` as written in config.json.
    pub model_type: String,
    /// Vocabulary size (rows of the embedding and the LM head).
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Dimension per head.
    pub head_dim: usize,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// End-of-sequence ids from config.json.
    pub eos_token_ids: Vec<u32>,
    /// What the KV cache stores per position and layer.
    pub kv: KvShape,
    /// What loading left out and why (a vision tower beside the text model), for the CLI
    /// to say once.
    pub notes: Vec<String>,
}

/// A whole decoder-only model.
#[derive(Debug)]
pub struct Transformer {
    /// Shape facts.
    pub info: ModelInfo,
    /// Token embeddings `[vocab, hidden]`.
    pub embed_tokens: Linear,
    /// Layers.
    pub layers: Vec<Layer>,
    /// Final RMSNorm.
    pub norm: Vec<f32>,
    /// Output head `[vocab, hidden]` (may share the embedding's bytes).
    pub lm_head: Linear,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE frequency table, computed once.
    pub rope: RopeTable,
    /// RoPE pair layout.
    pub rope_layout: RopeLayout,
    /// Where routed experts come from when they are streamed (None: read in place).
    pub store: Option<ExpertStore>,
    /// The checkpoint's multi-token-prediction layer, for drafting (DeepSeek-V3, GLM).
    pub mtp: Option<Box<Mtp>>,
    /// DeepSeek-V4's hyper-connections: the residual is `mult` streams per token, and
    /// each layer carries the weights that collapse and expand them.
    pub hyper: Option<Box<Hyper>>,
}

/// Whether a forward should produce logits for every position or only the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last position (generation).
    Last,
    /// Every position (teacher-forced evaluation).
    All,
}

/// Serial or parallel per-position RoPE + KV writes (they give the same bits; tested).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionLoop {
    /// Positions in parallel on the rayon pool.
    Parallel,
    /// One position after another.
    Serial,
}

/// Largest half rotary dimension a block may rotate (stack buffers of cos/sin).
pub(crate) const MAX_ROT_HALF: usize = 512;

/// Most parallel attention tasks per layer: bounds the score scratch to this many rows of
/// the context, whatever the prompt length.
pub(crate) const ATTENTION_TASKS: usize = 64;

/// What a block's forward needs to know about the step besides its own weights.
#[derive(Clone, Copy)]
pub struct Step<'a> {
    /// The model (its shapes, RoPE table, norm epsilon, expert store).
    pub model: &'a Transformer,
    /// Decoder layer index.
    pub layer: usize,
    /// The ids of the step's tokens (hash routing reads them).
    pub tokens: &'a [u32],
    /// Tokens in this forward.
    pub n: usize,
    /// Position of the first of them.
    pub start: usize,
    /// Serial or parallel per-position work.
    pub positions: PositionLoop,
}

impl Step<'_> {
    /// Positions visible to the last token of the step.
    pub fn ctx(&self) -> usize {
        self.start + self.n
    }
}

impl Transformer {
    /// Runs `tokens` at positions `start..start + n`, appending their keys and values to
    /// `kv`; leaves the logits of the requested positions in `s.logits`.
    /// Token ids must already be checked against the vocabulary.
    pub fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
        logits: LogitsFor,
        positions: PositionLoop,
    ) -> crate::error::Result<()> {
        let n = tokens.len();
        let end = start + n;
        assert!(end <= kv.capacity, "forward past the KV capacity");
        let rows = if logits == LogitsFor::All { n } else { 1 };
        self.reserve(s, n, end, rows);
        self.embed(tokens, s)?;
        self.run_layers(tokens, start, positions, s, |mixer, step, s| match mixer {
            Mixer::Gqa(a) => a.forward(step, kv, s),
            Mixer::Mla(m) => m.forward(step, kv, s),
            Mixer::DeltaNet(d) => d.forward(step, kv, s),
            Mixer::Compressed(c) => c.forward(step, kv, s),
        })?;
        self.head(n - rows, rows, s);
        Ok(())
    }

    /// Rows of several sequences, in one forward: row `r` is `tokens[r]` at position
    /// `starts[r]` of `kvs[seqs[r]]`. A sequence may have several rows (a token and its
    /// drafts): they run in row order, each seeing the KV its earlier rows wrote, so they
    /// must be consecutive positions in increasing order. Every row gets the bits it would
    /// get alone (the
    /// dense and expert matmuls keep one reduction order whatever the rows; attention and
    /// the KV write are per sequence). Leaves row `r`'s logits in `s.logits[r * vocab..]`.
    /// GQA projects all rows at once and attends per row; MLA runs each row's whole
    /// attention block on a one-row scratch of its own (the DSA selection a layer hands to
    /// the next stays with its row); norms, MLPs and MoE layers run over all rows (a MoE
    /// layer reads the union of the rows' experts once). Ids checked by the caller.
    pub fn forward_rows(
        &self,
        tokens: &[u32],
        starts: &[usize],
        seqs: &[usize],
        kvs: &mut [&mut KvCache],
        s: &mut Scratch,
    ) -> crate::error::Result<()> {
        let n = tokens.len();
        assert!(
            n == starts.len() && n == seqs.len(),
            "one start and sequence per row"
        );
        for (&q, &p) in seqs.iter().zip(starts) {
            assert!(p < kvs[q].capacity, "forward past the KV capacity");
        }
        let ctx = starts.iter().map(|p| p + 1).max().unwrap_or(1);
        self.reserve(s, n, ctx, n);
        self.embed(tokens, s)?;
        let mut rows = std::mem::take(&mut s.rows);
        if self
            .layers
            .iter()
            .any(|l| matches!(l.attn, Mixer::Mla(_) | Mixer::Compressed(_)))
        {
            rows.resize_with(rows.len().max(n), Scratch::default);
            for (r, &p) in rows.iter_mut().zip(starts) {
                self.reserve(r, 1, p + 1, 1);
            }
        }
        let h = self.info.hidden_size;
        let done = self.run_layers(
            tokens,
            0,
            PositionLoop::Serial,
            s,
            |mixer, step, s| match mixer {
                Mixer::Gqa(a) => a.forward_rows(step, kvs, seqs, starts, s),
                Mixer::DeltaNet(d) => d.forward_rows(step, kvs, seqs, starts, s),
                Mixer::Mla(_) | Mixer::Compressed(_) => {
                    let per_row = seqs.iter().zip(starts).zip(&mut rows).enumerate();
                    for (r, ((&q, &start), rs)) in per_row {
                        let kv = &mut *kvs[q];
                        rs.xn[..h].copy_from_slice(&s.xn[r * h..(r + 1) * h]);
                        let one = Step {
                            n: 1,
                            start,
                            tokens: &tokens[r..r + 1],
                            ..*step
                        };
                        match mixer {
                            Mixer::Mla(m) => m.forward(&one, kv, rs),
                            Mixer::Compressed(c) => c.forward(&one, kv, rs),
                            _ => unreachable!("matched above"),
                        }
                        s.proj[r * h..(r + 1) * h].copy_from_slice(&rs.proj[..h]);
                    }
                }
            },
        );
        s.rows = rows;
        done?;
        self.head(0, n, s);
        Ok(())
    }

    fn embed(&self, tokens: &[u32], s: &mut Scratch) -> crate::error::Result<()> {
        let h = self.info.hidden_size;
        let streams = self.streams();
        for (t, &tok) in tokens.iter().enumerate() {
            let row = &mut s.x[t * streams * h..(t + 1) * streams * h];
            self.embed_tokens.embed_row(tok as usize, &mut row[..h])?;
            // Hyper-connections: every stream starts as the embedding.
            for k in 1..streams {
                row.copy_within(..h, k * h);
            }
        }
        Ok(())
    }

    /// Residual streams per token (1 without hyper-connections).
    pub(crate) fn streams(&self) -> usize {
        self.hyper.as_ref().map_or(1, |h| h.mult)
    }

    /// The input of a block: RMSNorm (`norm`) of the residual, or, with hyper-connections,
    /// of the streams collapsed by `hc`.
    fn block_input(&self, n: usize, norm: &[f32], hc: Option<&HyperConnection>, s: &mut Scratch) {
        let h = self.info.hidden_size;
        match (&self.hyper, hc) {
            (Some(hy), Some(hc)) => {
                let m = hy.mult;
                hy.collapse(hc, &s.x[..n * m * h], n, &mut s.hyper, &mut s.xn[..n * h]);
                norm_rows_inplace(&mut s.xn[..n * h], norm, self.rms_norm_eps);
            }
            _ => norm_rows(&s.x[..n * h], norm, self.rms_norm_eps, &mut s.xn[..n * h]),
        }
    }

    /// Adds a block's output (`s.proj`) to the residual, or spreads it over the streams.
    fn block_output(&self, n: usize, hc: bool, s: &mut Scratch) {
        let h = self.info.hidden_size;
        match &self.hyper {
            Some(hy) if hc => {
                let m = hy.mult;
                hy.expand(&mut s.x[..n * m * h], &s.proj[..n * h], n, &mut s.hyper);
            }
            _ => add_into(&mut s.x[..n * h], &s.proj[..n * h]),
        }
    }

    /// The layers over the `n` rows of `s.x`, with `attend` running each layer's mixer
    /// (one sequence's positions, or a batch of sequences).
    fn run_layers(
        &self,
        tokens: &[u32],
        start: usize,
        positions: PositionLoop,
        s: &mut Scratch,
        mut attend: impl FnMut(&Mixer, &Step, &mut Scratch),
    ) -> crate::error::Result<()> {
        let (n, h) = (tokens.len(), self.info.hidden_size);
        for (li, layer) in self.layers.iter().enumerate() {
            let step = Step {
                model: self,
                layer: li,
                tokens,
                n,
                start,
                positions,
            };
            let hc = layer.hc.as_deref();
            self.block_input(n, &layer.input_layernorm, hc.map(|c| &c[0]), s);
            attend(&layer.attn, &step, s);
            self.block_output(n, hc.is_some(), s);
            self.block_input(n, &layer.post_attention_layernorm, hc.map(|c| &c[1]), s);
            match &layer.ffn {
                Ffn::Dense(m) => m.forward(n, &s.xn[..n * h], &mut s.ffn, &mut s.proj[..n * h]),
                Ffn::Moe(moe) => moe.forward(&step, s)?,
            }
            self.block_output(n, hc.is_some(), s);
        }
        Ok(())
    }

    /// The final norm and the LM head over rows `first..first + rows` of `s.x`.
    fn head(&self, first: usize, rows: usize, s: &mut Scratch) {
        let (h, v) = (self.info.hidden_size, self.info.vocab_size);
        match &self.hyper {
            Some(hy) => {
                let m = hy.mult;
                let x = &s.x[first * m * h..(first + rows) * m * h];
                hy.head(x, rows, &mut s.hyper, &mut s.xn[..rows * h]);
                norm_rows_inplace(&mut s.xn[..rows * h], &self.norm, self.rms_norm_eps);
            }
            None => norm_rows(
                &s.x[first * h..(first + rows) * h],
                &self.norm,
                self.rms_norm_eps,
                &mut s.xn[..rows * h],
            ),
        }
        self.lm_head
            .forward(&s.xn[..rows * h], rows, &mut s.logits[..rows * v]);
    }
}

/// RoPE for one position: every query head and every key head.
pub(crate) fn rope_position(
    rope: &RopeTable,
    layout: RopeLayout,
    pos: usize,
    hd: usize,
    q: &mut [f32],
    k: &mut [f32],
) {
    let half = rope.rot_dim() / 2;
    assert!(half <= MAX_ROT_HALF);
    let mut cos = [0.0f32; MAX_ROT_HALF];
    let mut sin = [0.0f32; MAX_ROT_HALF];
    rope.cos_sin(pos, &mut cos[..half], &mut sin[..half]);
    for head in q.chunks_mut(hd).chain(k.chunks_mut(hd)) {
        apply_rope(layout, head, &cos[..half], &sin[..half]);
    }
}

/// RMSNorm of each `w.len()`-wide row of `x` into `out`.
pub(crate) fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        rms_norm(xr, w, eps, or);
    }
}

/// RMSNorm of each `w.len()`-wide row of `x` in place.
pub(crate) fn norm_rows_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    for r in x.chunks_exact_mut(w.len()) {
        coli_kernels::norm::rms_norm_inplace(r, w, eps);
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
