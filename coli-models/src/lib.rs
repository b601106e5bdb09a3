//! coli-models: from a model directory to tokens.
//!
//! * [`registry`]: the one descriptor table of families (`model_type` → loader).
//! * [`llama`], [`olmoe`], [`qwen_moe`], [`mixtral`], [`deepseek_v3`], [`glm4_moe`],
//!   [`glm_moe_dsa`]:
//!   one file per family, each reading like the
//!   `transformers` modeling file it mirrors; shared blocks live in [`decoder`].
//! * [`session`]: KV cache, batched prefill, step-by-step decode, generation.
//! * [`sampling`], [`tokenizer`] (with the chat template), [`gguf_import`].
//!
//! A downstream application needs only this crate:
//! ```no_run
//! let model = coli_models::load("path/to/model")?;
//! let mut session = coli_models::Session::new(&model, 512);
//! let logits = session.forward(&[1, 2, 3], false)?;
//! # Ok::<(), coli_models::ModelError>(())
//! ```

pub mod constrained;
pub mod convert;
pub mod decoder;
pub mod deepseek_v3;
pub mod demo;
pub mod error;
pub mod expert_store;
pub mod gguf_import;
pub mod glm4_moe;
pub mod glm_moe_dsa;
pub mod llama;
pub mod mixtral;
pub mod olmoe;
pub mod qwen_moe;
pub mod registry;
pub mod sampling;
pub mod session;
pub mod skeleton;
pub mod tokenizer;
pub mod usage;
pub mod weights;

pub use decoder::{ModelInfo, Transformer};
pub use error::{ModelError, Result};
pub use registry::{load, load_dir, Capability, FamilyDescriptor, FAMILIES};
pub use sampling::{Sampler, SamplingParams};
pub use session::{FinishReason, Generation, Session};
pub use tokenizer::TextTokenizer;
