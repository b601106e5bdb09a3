//! The one error type of coli-models.

use std::path::PathBuf;

use coli_core::CoreError;

/// Result alias for coli-models.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// What can go wrong between a model directory and generated tokens.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file-level problem (missing directory, bad header, missing tensor, wrong shape, …).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// `config.json` names a family coli does not implement.
    #[error("unsupported model_type \"{found}\" (supported: {supported})")]
    UnsupportedModelType {
        /// The `model_type` found.
        found: String,
        /// Every supported alias.
        supported: String,
    },
    /// A prompt id outside the vocabulary.
    #[error("token id {id} is out of the vocabulary (vocab_size {vocab_size})")]
    TokenOutOfVocab {
        /// The offending id.
        id: u32,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// More positions than the session was created for.
    #[error("context full: {needed} positions needed, the session holds {capacity}")]
    ContextFull {
        /// Positions needed.
        needed: usize,
        /// Session capacity.
        capacity: usize,
    },
    /// Empty input where tokens were required.
    #[error("empty prompt: at least one token is needed")]
    EmptyPrompt,
    /// Tokenizer files missing or unusable.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// A tensor whose values cannot be used (e.g. a non-finite quantization scale).
    #[error("tensor \"{name}\": {msg}")]
    BadTensor {
        /// The tensor.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// The expert store could not read an expert (shard truncated or unreadable mid-run).
    #[error("expert store: {0}")]
    ExpertRead(String),
    /// A grammar or JSON Schema that cannot constrain this generation.
    #[error("{0}")]
    Constraint(String),
    /// Two descriptions of the same model disagree (a bug in a family, named).
    #[error("internal inconsistency: {0}")]
    Inconsistent(String),
    /// The routing history could not be saved.
    #[error("routing history: {0}")]
    Usage(String),
    /// Importing a foreign format (GGUF) failed.
    #[error("{path}: {msg}")]
    Import {
        /// The source file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}
