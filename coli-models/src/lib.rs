//! coli-models: from a model directory to tokens.
//!
//! * [`generate`]: the generation API. An [`Engine`] is a loaded, placed model with its
//!   tokenizer; [`Engine::generate`] answers a [`GenerateRequest`] (text, chat messages or
//!   ids; sampling; a grammar or JSON Schema; drafts), streaming tokens as they come.
//! * [`arch`]: the blocks (GQA, MLA, DSA, MLP, MoE), the KV cache, and the forward loop.
//! * [`families`]: the registry and one file per family, each reading like the
//!   `transformers` modeling file it mirrors.
//! * [`experts`]: the expert store (reads, cache policy, prefetch) and routing history.
//! * [`session`]: KV cache, batched prefill, step-by-step decode.
//! * [`batch`]: slots (KV caches kept between requests, prefix reuse) and decode steps
//!   that advance many requests in one batched forward (what a server schedules).
//! * [`sampling`], [`tokenizer`], [`chat_template`] (rendered as `transformers` renders
//!   it), [`tool_calls`] (read back per family), [`constrained`], [`convert`],
//!   [`gguf_import`].
//!
//! A downstream application needs only this crate. Load a model directory and stream a
//! chat answer:
//!
//! ```no_run
//! use coli_models::experts::Placement;
//! use coli_models::tokenizer::ChatMessage;
//! use coli_models::{Engine, GenerateRequest, Prompt};
//!
//! let engine = Engine::open("path/to/model".as_ref(), &Placement::default())?;
//! let request = GenerateRequest {
//!     prompt: Prompt::Chat(vec![ChatMessage::new("user", "Name three rivers.")]),
//!     max_tokens: 64,
//!     ..GenerateRequest::default()
//! };
//! let answer = engine.generate(&request, |_id, text| print!("{text}"))?;
//! println!("\n[{} tokens, {:.1} tok/s]", answer.generated_ids.len(), answer.decode_tok_s());
//! # Ok::<(), coli_models::ModelError>(())
//! ```

pub mod arch;
pub mod batch;
pub mod chat_template;
pub mod constrained;
pub mod convert;
pub mod demo;
pub mod drafts;
pub mod error;
pub mod experts;
pub mod families;
pub mod generate;
pub mod gguf_import;
pub mod mtp_drafts;
pub mod sampling;
mod serde_defaults;
pub mod session;
pub mod tokenizer;
pub mod tool_calls;
pub mod weights;

pub use arch::{ModelInfo, Transformer};
pub use batch::{Batch, Decoding, Slot, SlotOptions, TokenEvent, TokenLogprob};
pub use error::{ModelError, Result};
pub use families::{load, load_dir, Capability, FamilyDescriptor, FAMILIES};
pub use generate::{Completion, Engine, GenerateRequest, MtpDrafting, OutputConstraint, Prompt};
pub use sampling::{Sampler, SamplingParams};
pub use session::{FinishReason, Generation, PromptLookup, Session};
pub use tokenizer::TextTokenizer;
