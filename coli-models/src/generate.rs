//! The generation API: one loaded, placed model ([`Engine`]) serving requests
//! ([`GenerateRequest`]: a prompt as text, chat messages or ids; sampling; a constraint;
//! drafts) and answering with tokens as they come and a final [`Completion`] with stats.
//!
//! The engine owns what every front end would otherwise repeat: the tokenizer and chat
//! template, the end-of-sequence set, grammar and schema compilation through the compile
//! cache, the vocabulary trie of constrained sampling (built once), streaming
//! detokenization, and the expert-store figures of a run. `generate` takes `&self`: any
//! number of requests may run over one engine, each with its own session.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use coli_grammar::schema::SchemaOptions;
use coli_grammar::{GrammarCache, TokenTrie};

use crate::constrained::GrammarConstraint;
use crate::error::{ModelError, Result};
use crate::experts::{Placement, StoreStats};
use crate::sampling::{Sampler, SamplingParams};
use crate::session::{FinishReason, GenStats, Session};
use crate::tokenizer::{ChatMessage, TextTokenizer};
use crate::Transformer;

/// What to continue.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Plain text, tokenized as is.
    Text(String),
    /// A conversation, rendered through the model's chat template with the generation
    /// prompt added.
    Chat(Vec<ChatMessage>),
    /// Token ids (no tokenizer needed).
    Ids(Vec<u32>),
}

/// A restriction on what may be generated.
#[derive(Clone, Debug, Default)]
pub enum OutputConstraint {
    /// Anything.
    #[default]
    None,
    /// A GBNF grammar (llama.cpp's dialect), as text.
    Gbnf(String),
    /// JSON valid against a JSON Schema, as text.
    JsonSchema(String),
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Temperature, top-k, top-p, seed (greedy by default).
    pub sampling: SamplingParams,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Keep going past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// What the output must match.
    pub constraint: OutputConstraint,
    /// Under a constraint, feed grammar-forced tokens as drafts in one batched forward
    /// (same output; off samples them one by one).
    pub drafts: bool,
    /// Draft by prompt lookup ([`crate::PromptLookup`]); same output, verified in batches.
    pub lookup: bool,
    /// When to draft by the model's MTP layer ([`crate::arch::Mtp`]); same output,
    /// verified in batches.
    pub mtp: MtpDrafting,
    /// Tokens the MTP layer drafts at a time (0: none).
    pub mtp_depth: usize,
}

/// When the MTP layer drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtpDrafting {
    /// Never.
    Off,
    /// When the model has the layer and its experts are not streamed
    /// ([`Engine::mtp_by_default`]).
    Auto,
    /// Whenever the model has the layer.
    On,
}

impl Default for GenerateRequest {
    fn default() -> Self {
        GenerateRequest {
            prompt: Prompt::Ids(Vec::new()),
            sampling: SamplingParams::default(),
            max_tokens: 64,
            ignore_eos: false,
            constraint: OutputConstraint::None,
            drafts: true,
            lookup: true,
            mtp: MtpDrafting::Auto,
            mtp_depth: crate::mtp_drafts::DEFAULT_MTP_DEPTH,
        }
    }
}

/// Expert-store figures of one generation (decode phase unless said otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExpertRunStats {
    /// Requests served by experts already in RAM (not brought by a prefetch for this use).
    pub hit_rate: f64,
    /// Requests served by a prefetch.
    pub prefetch_hit_rate: f64,
    /// The store's counters over the decode phase.
    pub decode: StoreStats,
    /// Bytes read from disk per decoded token.
    pub disk_bytes_per_token: f64,
    /// Disk bytes read per second of decode.
    pub disk_mb_s: f64,
    /// Read throughput while reading (MB/s).
    pub read_mb_s: f64,
    /// Bytes read during the prefill.
    pub prefill_disk_bytes: u64,
    /// Bytes read over the whole generation.
    pub disk_bytes: u64,
    /// Pinned experts now.
    pub pinned: u64,
    /// Cached experts now.
    pub cached: u64,
    /// Cached experts allowed per layer.
    pub cap_per_layer: usize,
}

/// The answer to a [`GenerateRequest`].
#[derive(Clone, Debug)]
pub struct Completion {
    /// The prompt's ids.
    pub prompt_ids: Vec<u32>,
    /// New tokens, including a final end-of-sequence token if one was produced.
    pub generated_ids: Vec<u32>,
    /// The new tokens as text (special tokens skipped; empty without a tokenizer).
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Timings.
    pub stats: GenStats,
    /// Expert-store figures (None for a model without a store).
    pub experts: Option<ExpertRunStats>,
    /// What the constraint ignored or relaxed (schema keywords with their paths).
    pub constraint_warnings: Vec<String>,
    /// Where a finished output breaks the schema: the grammar is relaxed for some keyword
    /// (see the warnings) and the validator found the text invalid. Never silent: the CLI
    /// fails, a server answers with an error.
    pub schema_violation: Option<String>,
}

impl Completion {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tok_s(&self) -> f64 {
        self.stats.prompt_tokens as f64 / self.stats.prefill_s.max(1e-9)
    }

    /// Decoded tokens per second (0 when nothing was decoded).
    pub fn decode_tok_s(&self) -> f64 {
        match self.stats.decode_tokens {
            0 => 0.0,
            n => n as f64 / self.stats.decode_s.max(1e-9),
        }
    }
}

/// The schema's notes (ignored and relaxed keywords) and, for a finished output, what the
/// full validator says of it.
pub(crate) fn check_output(
    c: &coli_grammar::Compiled,
    text: &str,
    finish: FinishReason,
) -> (Vec<String>, Option<String>) {
    let notes = c
        .warnings()
        .iter()
        .chain(c.relaxations())
        .map(|n| {
            format!(
                "JSON Schema at {}: {}: {}",
                display_path(&n.path),
                n.keyword,
                n.msg
            )
        })
        .collect();
    let violation = match finish {
        FinishReason::Stop => c.check_complete(text).err().map(|v| {
            format!(
                "the output breaks the JSON Schema at {}: {}",
                display_path(&v.instance_path),
                v.msg
            )
        }),
        // Cut by max_tokens: incomplete, and said so by the finish reason.
        FinishReason::Length => None,
    };
    (notes, violation)
}

fn display_path(p: &str) -> &str {
    if p.is_empty() {
        "/"
    } else {
        p
    }
}

/// A teacher-forced forward over a sequence.
#[derive(Clone, Debug)]
pub struct Evaluation {
    /// Logits, positions × vocabulary.
    pub logits: Vec<f32>,
    /// Argmax per position.
    pub tf_pred: Vec<u32>,
    /// Mean negative log-likelihood of `ids[1..]` (0 for one token).
    pub nll: f64,
}

/// Whether drafting by an MTP layer of `mtp` bytes (dense, routed experts) is worth it
/// under `placement`: the model has no routed experts, or all of them stay in RAM
/// ([`crate::experts::CacheSize::Off`], or a cache holding every expert of a layer) with
/// the layer's bytes taken from `available` first. A streamed model would read the
/// layer's experts from disk beside the cache's budget on every draft.
pub fn mtp_fits(
    placement: &Placement,
    census: &crate::arch::placement::ExpertCensus,
    mtp: (u64, u64),
    available: Option<u64>,
) -> bool {
    if census.moe_layers == 0 {
        return true;
    }
    let left = available.map(|a| a.saturating_sub(mtp.0 + mtp.1));
    placement
        .cap_per_layer(
            census.moe_layers,
            census.experts_per_layer,
            census.expert_bytes,
            left,
        )
        .is_none_or(|cap| cap >= census.experts_per_layer)
}

/// The vocabulary's trie and each token's bytes, shared by every constrained request.
type Vocabulary = (Arc<TokenTrie>, Arc<Vec<Vec<u8>>>);

/// A loaded and placed model with its tokenizer, ready for requests.
pub struct Engine {
    dir: PathBuf,
    model: Transformer,
    pub(crate) tokenizer: Option<TextTokenizer>,
    placement: Placement,
    grammars: GrammarCache,
    vocabulary: OnceLock<Vocabulary>,
    load_s: f64,
}

/// Compiled grammars an engine keeps (keyed on their text).
const GRAMMAR_CACHE_ENTRIES: usize = 16;

impl Engine {
    /// Loads the model in `dir` (any registered family), places its experts and loads the
    /// tokenizer when `tokenizer.json` is there. A checkpoint's MTP layer stays mapped, read
    /// from the file only when a request drafts by it; [`Engine::open_drafting`] decides
    /// up front instead.
    pub fn open(dir: &Path, placement: &Placement) -> Result<Engine> {
        Engine::open_inner(dir, placement, None)
    }

    /// As [`Engine::open`], with the MTP layer made ready for `mtp`: `Off` drops it, `On`
    /// copies its dense matrices to RAM, and `Auto` does the one or the other by
    /// [`mtp_fits`]: whether every routed expert, the layer's included, still fits the RAM
    /// the placement may use.
    pub fn open_drafting(dir: &Path, placement: &Placement, mtp: MtpDrafting) -> Result<Engine> {
        Engine::open_inner(dir, placement, Some(mtp))
    }

    fn open_inner(dir: &Path, placement: &Placement, mtp: Option<MtpDrafting>) -> Result<Engine> {
        let t0 = Instant::now();
        let mut model = crate::load(dir)?;
        if let Some(mode) = mtp {
            let census = model.expert_census();
            if let Some(layer) = model.mtp.as_deref_mut() {
                let keep = match mode {
                    MtpDrafting::Off => false,
                    MtpDrafting::On => true,
                    MtpDrafting::Auto => mtp_fits(
                        placement,
                        &census,
                        layer.bytes(),
                        crate::experts::available_memory(),
                    ),
                };
                if keep {
                    layer.make_resident()?;
                } else {
                    model.mtp = None;
                }
            }
        }
        model.place_experts(dir, placement)?;
        let tokenizer = TextTokenizer::load_if_present(dir)?;
        Ok(Engine {
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            placement: placement.clone(),
            grammars: GrammarCache::new(GRAMMAR_CACHE_ENTRIES),
            vocabulary: OnceLock::new(),
            load_s: t0.elapsed().as_secs_f64(),
        })
    }

    /// The model.
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// Whether drafting by the MTP layer is worth it by default: the model has one and its
    /// routed experts are not streamed (every expert fits the cache, or there is none). A
    /// streamed model would read the MTP layer's experts from disk beside the store's
    /// budget on every token.
    pub fn mtp_by_default(&self) -> bool {
        self.model.mtp.is_some()
            && self
                .model
                .store
                .as_ref()
                .is_none_or(|s| s.cap() >= self.model.expert_census().experts_per_layer)
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The placement the experts were given.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Whether routed experts are streamed with `O_DIRECT` (asked for, or chosen by
    /// [`Placement::reads_direct`]); false without an expert store.
    pub fn reads_direct(&self) -> bool {
        self.model.store.as_ref().is_some_and(|s| s.direct())
    }

    /// Seconds the load and placement took.
    pub fn load_s(&self) -> f64 {
        self.load_s
    }

    /// The tokenizer, or the error saying why there is none.
    pub fn tokenizer(&self) -> Result<&TextTokenizer> {
        match &self.tokenizer {
            Some(t) => Ok(t),
            None => Err(TextTokenizer::load(&self.dir)
                .err()
                .unwrap_or_else(|| ModelError::Tokenizer("no tokenizer loaded".into()))),
        }
    }

    /// End-of-sequence ids: config.json's plus the tokenizer's.
    pub fn eos_ids(&self) -> Vec<u32> {
        let mut stop = self.model.info.eos_token_ids.clone();
        if let Some(id) = self.tokenizer.as_ref().and_then(TextTokenizer::eos_id) {
            if !stop.contains(&id) {
                stop.push(id);
            }
        }
        stop
    }

    /// The prompt's ids (checked against the vocabulary).
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let ids = match prompt {
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Text(text) => self.tokenizer()?.encode(text)?,
            Prompt::Chat(messages) => {
                let tok = self.tokenizer()?;
                tok.encode(&tok.apply_chat_template(messages, true)?)?
            }
        };
        let vocab_size = self.model.info.vocab_size;
        if let Some(&id) = ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(ModelError::TokenOutOfVocab { id, vocab_size });
        }
        Ok(ids)
    }

    /// The compiled grammar of a constraint (through the compile cache).
    fn compile(&self, c: &OutputConstraint) -> Result<Option<Arc<coli_grammar::Compiled>>> {
        let compiled = match c {
            OutputConstraint::None => return Ok(None),
            OutputConstraint::Gbnf(text) => self.grammars.get(text).map_err(|e| e.to_string()),
            // Generation closes objects and bounds whitespace: members the schema does not
            // declare are not generated, padding is short (every output is still valid; a
            // small model cannot ramble for ever, and masks at member names stay cheap).
            OutputConstraint::JsonSchema(text) => self
                .grammars
                .get_schema_with(text, SchemaOptions::GENERATION)
                .map_err(|e| e.to_string()),
        };
        compiled.map(Some).map_err(ModelError::Constraint)
    }

    /// The vocabulary's byte strings and their trie (built on first use, then shared).
    pub(crate) fn vocabulary(&self) -> Result<&Vocabulary> {
        let tok = self.tokenizer().map_err(|_| {
            ModelError::Constraint(
                "a grammar or schema needs the model's tokenizer.json (token bytes)".into(),
            )
        })?;
        Ok(self.vocabulary.get_or_init(|| {
            let bytes = tok.token_bytes();
            (Arc::new(TokenTrie::new(&bytes)), Arc::new(bytes))
        }))
    }

    /// Runs `req`, calling `on_text(id, piece)` for each new token with the text it
    /// completes (empty when it completes none, or without a tokenizer).
    pub fn generate(
        &self,
        req: &GenerateRequest,
        mut on_text: impl FnMut(u32, &str),
    ) -> Result<Completion> {
        let prompt_ids = self.prompt_ids(&req.prompt)?;
        let stop = if req.ignore_eos {
            Vec::new()
        } else {
            self.eos_ids()
        };
        let compiled = self.compile(&req.constraint)?;
        let mut constraint = match &compiled {
            Some(c) => {
                let (trie, bytes) = self.vocabulary()?;
                let gc = GrammarConstraint::with_trie(
                    c.clone(),
                    trie.clone(),
                    bytes.clone(),
                    stop.clone(),
                );
                Some(gc.with_drafts(req.drafts))
            }
            None => None,
        };
        let mut session = Session::new(&self.model, prompt_ids.len() + req.max_tokens);
        session.lookup = req.lookup.then(crate::PromptLookup::default);
        let mtp = match req.mtp {
            MtpDrafting::Off => false,
            MtpDrafting::Auto => self.mtp_by_default(),
            MtpDrafting::On => true,
        };
        if mtp && req.mtp_depth > 0 && session.enable_mtp() {
            if let Some(d) = &mut session.mtp {
                d.depth = req.mtp_depth;
            }
        }
        let mut sampler = Sampler::new(req.sampling.clone());
        let mut stream = self.tokenizer.as_ref().map(TextTokenizer::stream);
        let snapshot = || self.store_stats().unwrap_or_default();
        let before = snapshot();
        let mut prefilled = None;
        let on_token = |id: u32| {
            if prefilled.is_none() {
                prefilled = Some(snapshot());
            }
            let piece = stream.as_mut().and_then(|s| s.push(id).ok());
            on_text(id, piece.as_deref().unwrap_or(""));
        };
        let (ids, max) = (&prompt_ids, req.max_tokens);
        let g = match constraint.as_mut() {
            Some(c) => session.generate_constrained(ids, max, &mut sampler, &stop, c, on_token),
            None => session.generate(ids, max, &mut sampler, &stop, on_token),
        }?;
        let text = match &self.tokenizer {
            Some(t) => t.decode(&g.generated_ids, true)?,
            None => String::new(),
        };
        let prefilled = prefilled.unwrap_or_else(snapshot);
        let experts = self.expert_run_stats(&before, &prefilled, &g.stats);
        let (constraint_warnings, schema_violation) = match &compiled {
            Some(c) => check_output(c, &text, g.finish_reason),
            None => (Vec::new(), None),
        };
        Ok(Completion {
            prompt_ids: g.prompt_ids,
            generated_ids: g.generated_ids,
            text,
            finish_reason: g.finish_reason,
            stats: g.stats,
            experts,
            constraint_warnings,
            schema_violation,
        })
    }

    fn store_stats(&self) -> Option<StoreStats> {
        self.model.store.as_ref().map(|s| s.stats())
    }

    /// Decode-phase figures (from the first generated token on) and whole-run totals.
    fn expert_run_stats(
        &self,
        start: &StoreStats,
        prefilled: &StoreStats,
        st: &GenStats,
    ) -> Option<ExpertRunStats> {
        let store = self.model.store.as_ref()?;
        let now = store.stats();
        let d = |f: fn(&StoreStats) -> u64| f(&now) - f(prefilled);
        let decode = StoreStats {
            hits: d(|s| s.hits),
            misses: d(|s| s.misses),
            prefetch_hits: d(|s| s.prefetch_hits),
            prefetches: d(|s| s.prefetches),
            wasted_prefetches: d(|s| s.wasted_prefetches),
            speculative: d(|s| s.speculative),
            speculation_skipped: d(|s| s.speculation_skipped),
            bytes_read: d(|s| s.bytes_read),
            read_ns: d(|s| s.read_ns),
            wait_ns: d(|s| s.wait_ns),
            pinned: now.pinned,
            cached: now.cached,
        };
        let requests = (decode.hits + decode.misses).max(1) as f64;
        let read_s = decode.read_ns as f64 * 1e-9;
        let bytes = decode.bytes_read as f64;
        Some(ExpertRunStats {
            hit_rate: if decode.hits + decode.misses == 0 {
                1.0
            } else {
                (decode.hits - decode.prefetch_hits) as f64 / requests
            },
            prefetch_hit_rate: decode.prefetch_hits as f64 / requests,
            decode,
            disk_bytes_per_token: bytes / st.decode_tokens.max(1) as f64,
            disk_mb_s: bytes / 1e6 / st.decode_s.max(1e-9),
            read_mb_s: if read_s > 0.0 {
                bytes / 1e6 / read_s
            } else {
                0.0
            },
            prefill_disk_bytes: prefilled.bytes_read - start.bytes_read,
            disk_bytes: now.bytes_read - start.bytes_read,
            pinned: now.pinned,
            cached: now.cached,
            cap_per_layer: store.cap(),
        })
    }

    /// One teacher-forced forward over `ids`: logits, argmax per position and NLL.
    pub fn evaluate(&self, ids: &[u32]) -> Result<Evaluation> {
        let vocab = self.model.info.vocab_size;
        let mut session = Session::new(&self.model, ids.len());
        let logits = session.forward(ids, true)?.to_vec();
        let tf_pred = logits
            .chunks_exact(vocab)
            .map(crate::sampling::argmax)
            .collect();
        let nll = if ids.len() > 1 {
            let total: f64 = (0..ids.len() - 1)
                .map(|p| {
                    let row = &logits[p * vocab..(p + 1) * vocab];
                    crate::sampling::log_sum_exp(row) - row[ids[p + 1] as usize] as f64
                })
                .sum();
            total / (ids.len() - 1) as f64
        } else {
            0.0
        };
        Ok(Evaluation {
            logits,
            tf_pred,
            nll,
        })
    }

    /// Adds the routing counted so far to the directory's `.coli_usage`; `Ok(false)` when
    /// there was nothing to add.
    pub fn save_usage(&self) -> Result<bool> {
        let Some(store) = &self.model.store else {
            return Ok(false);
        };
        let run = store.usage();
        if run.is_empty() {
            return Ok(false);
        }
        crate::experts::usage::merge(&self.dir, &run)
            .map(|_| true)
            .map_err(|e| ModelError::Usage(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::placement::ExpertCensus;
    use crate::experts::CacheSize;

    /// Two MoE layers of four 100-byte experts: all of them need a cache budget of 800
    /// bytes, which `Auto` gives out of `available` after a reserve of a quarter.
    const CENSUS: ExpertCensus = ExpertCensus {
        moe_layers: 2,
        experts_per_layer: 4,
        expert_bytes: 100,
        total_bytes: 800,
    };

    #[test]
    fn the_mtp_layer_drafts_only_beside_every_expert() {
        let auto = Placement::default();
        // 1168 - 100 = 1068, a quarter off: 801 bytes, every expert. 1164: 798, not.
        assert!(mtp_fits(&auto, &CENSUS, (60, 40), Some(1168)));
        assert!(!mtp_fits(&auto, &CENSUS, (60, 40), Some(1164)));
        // Without the layer's bytes 1164 holds every expert: the layer tipped it.
        assert!(mtp_fits(&auto, &CENSUS, (0, 0), Some(1164)));
        assert!(mtp_fits(&auto, &CENSUS, (60, 40), None));
        let with = |cache| Placement {
            cache,
            ..Placement::default()
        };
        assert!(mtp_fits(&with(CacheSize::Off), &CENSUS, (60, 40), Some(0)));
        assert!(mtp_fits(
            &with(CacheSize::Slots(4)),
            &CENSUS,
            (60, 40),
            Some(0)
        ));
        assert!(!mtp_fits(
            &with(CacheSize::Slots(3)),
            &CENSUS,
            (60, 40),
            None
        ));
        let dense = ExpertCensus {
            moe_layers: 0,
            ..CENSUS
        };
        assert!(mtp_fits(&auto, &dense, (60, 40), Some(0)));
    }
}
