//! A multi-token-prediction (MTP) layer, as DeepSeek-V3/Kimi-K2 and GLM-4.5+ ship one after
//! their decoder layers (`model.layers.{num_hidden_layers}.*`): it predicts the token after
//! next from the main model's last hidden state and the next token's embedding. coli uses
//! it to draft tokens that the main model then verifies, so it decides speed, never tokens.
//!
//! Row `i` of the layer pairs the main model's final-normed hidden state `h_i` with the
//! token at position `i + 1`:
//!
//! ```text
//! x_i = eh_proj([enorm(embed(t_{i+1})), hnorm(h_i)])   (embedding first)
//! y_i = block(x_i)                                     (one pre-norm decoder layer, own KV, RoPE position i)
//! logits_i = lm_head(shared_head.norm(y_i))            (a guess at t_{i+2})
//! ```
//!
//! The embedding and the head are the main model's (the checkpoint's `shared_head.head`
//! and `embed_tokens` copies are not read). The block is held as a one-layer
//! [`Transformer`], so it runs through the same layer loop and cache as the main model.
//! Its routed experts are read in place, never through the expert store; its dense
//! matrices stay mapped until [`Mtp::make_resident`] (what `Engine::open_drafting` does when
//! the layer will draft).

use coli_core::ModelDir;

use super::{
    norm_rows, KvCache, Layer, LinearRole, LogitsFor, Mixer, PositionLoop, Scratch, Transformer,
};
use crate::error::Result;
use crate::weights::{load_vector, Linear};

/// One MTP layer.
#[derive(Debug)]
pub struct Mtp {
    /// RMSNorm on the next token's embedding.
    pub enorm: Vec<f32>,
    /// RMSNorm on the main model's hidden state.
    pub hnorm: Vec<f32>,
    /// `[hidden, 2 * hidden]`: the two normed halves to one row.
    pub eh_proj: Linear,
    /// The decoder block, its final norm (`shared_head.norm`) and the main model's head,
    /// as a one-layer model.
    pub block: Transformer,
}

impl Mtp {
    /// Loads the MTP layer at `p` (`model.layers.{n}`) around its decoder `layer`; the
    /// embedding, head, RoPE and shape facts are `main`'s.
    pub fn load(dir: &ModelDir, p: &str, main: &Transformer, layer: Layer) -> Result<Mtp> {
        let h = main.info.hidden_size;
        let mut info = main.info.clone();
        info.n_layers = 1;
        Ok(Mtp {
            enorm: load_vector(dir, &format!("{p}.enorm.weight"), h)?,
            hnorm: load_vector(dir, &format!("{p}.hnorm.weight"), h)?,
            eh_proj: Linear::load(dir, &format!("{p}.eh_proj.weight"), h, 2 * h)?,
            block: Transformer {
                info,
                embed_tokens: main.embed_tokens.clone(),
                layers: vec![layer],
                norm: load_vector(dir, &format!("{p}.shared_head.norm.weight"), h)?,
                lm_head: main.lm_head.clone(),
                rms_norm_eps: main.rms_norm_eps,
                rope: main.rope.clone(),
                rope_layout: main.rope_layout,
                store: None,
                mtp: None,
                hyper: None,
            },
        })
    }

    /// Shares `embed` and `head`, the main model's, made resident already (the clones
    /// taken at load still point into the file mapping). The layer's own matrices stay
    /// mapped until [`Mtp::make_resident`].
    pub(crate) fn share_main(&mut self, embed: &Linear, head: &Linear) {
        self.block.embed_tokens = embed.clone();
        self.block.lm_head = head.clone();
    }

    /// The layer's own matrices (not the shared embedding and head), routed experts apart.
    fn own_linears_mut(&mut self, experts: bool) -> Vec<&mut Linear> {
        let mut linears: Vec<&mut Linear> = self
            .block
            .linears_mut()
            .into_iter()
            .filter(|(r, _)| match r {
                LinearRole::Router | LinearRole::Dense => true,
                LinearRole::Expert { .. } => experts,
                LinearRole::Embedding | LinearRole::Head => false,
            })
            .map(|(_, l)| l)
            .collect();
        linears.push(&mut self.eh_proj);
        linears
    }

    /// Bytes of the layer's own matrices in the checkpoint: (dense, routed experts). Read
    /// on every draft; the dense part is copied to RAM by [`Mtp::make_resident`].
    pub fn bytes(&mut self) -> (u64, u64) {
        let size = |l: &Linear| l.view().bytes().len() as u64;
        let dense: u64 = self
            .own_linears_mut(false)
            .into_iter()
            .map(|l| size(l))
            .sum();
        let all: u64 = self
            .own_linears_mut(true)
            .into_iter()
            .map(|l| size(l))
            .sum();
        (dense, all - dense)
    }

    /// Copies the layer's own matrices (not its routed experts, which are read in place)
    /// into resident memory.
    pub fn make_resident(&mut self) -> Result<()> {
        let mut linears = self.own_linears_mut(false);
        let views: Vec<coli_core::TensorView> = linears.iter().map(|l| l.view().clone()).collect();
        let resident = coli_core::make_resident(&views.iter().collect::<Vec<_>>())?;
        for (l, v) in linears.iter_mut().zip(resident) {
            l.set_view(v);
        }
        Ok(())
    }

    /// A cache for the layer's own keys and values.
    pub fn kv_cache(&self, capacity: usize) -> KvCache {
        KvCache::new(&self.block, capacity)
    }

    /// Rows `start..start + n`: `hidden` holds the main model's final-normed states
    /// `h_start..` (`n` rows), `next` the tokens one position later. Appends the rows' keys
    /// and values to `kv`; leaves the logits of the last row (or every row) in `s.logits`
    /// and the block's output before its final norm in `s.x` (what a recursive draft
    /// feeds back as the next row's hidden state). `input` is a reused buffer.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        hidden: &[f32],
        next: &[u32],
        start: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
        input: &mut Vec<f32>,
        logits: LogitsFor,
    ) -> Result<()> {
        let b = &self.block;
        let (n, h) = (next.len(), b.info.hidden_size);
        assert_eq!(hidden.len(), n * h, "one hidden row per token");
        let end = start + n;
        assert!(end <= kv.capacity, "MTP forward past its KV capacity");
        let rows = if logits == LogitsFor::All { n } else { 1 };
        b.reserve(s, n, end, rows);
        b.embed(next, s)?;
        input.clear();
        input.resize(n * 2 * h, 0.0);
        for (r, row) in input.chunks_exact_mut(2 * h).enumerate() {
            let (e, hn) = row.split_at_mut(h);
            norm_rows(&s.x[r * h..(r + 1) * h], &self.enorm, b.rms_norm_eps, e);
            norm_rows(&hidden[r * h..(r + 1) * h], &self.hnorm, b.rms_norm_eps, hn);
        }
        self.eh_proj.forward(input, n, &mut s.x[..n * h]);
        b.run_layers(
            next,
            start,
            PositionLoop::Parallel,
            s,
            |mixer, step, s| match mixer {
                Mixer::Gqa(a) => a.forward(step, kv, s),
                Mixer::Mla(m) => m.forward(step, kv, s),
                Mixer::DeltaNet(d) => d.forward(step, kv, s),
                Mixer::Compressed(c) => c.forward(step, kv, s),
            },
        )?;
        b.head(n - rows, rows, s);
        Ok(())
    }
}
