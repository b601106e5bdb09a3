//! The one error type of coli-plan.

use std::path::PathBuf;

/// What can go wrong while analysing, planning, tuning or resolving a placement.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The model files could not be scanned (a header, the index, the sidecar's inputs).
    #[error("{0}")]
    Analysis(String),
    /// Loading or running the model failed.
    #[error(transparent)]
    Model(#[from] coli_models::ModelError),
    /// A file-level problem.
    #[error(transparent)]
    Core(#[from] coli_core::CoreError),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The family has no measured runtime baseline: no plan rather than a guess.
    #[error(
        "{family}: runtime reserves not measured yet for this family; no plan rather than a guess"
    )]
    NoBaseline {
        /// The family's display name.
        family: &'static str,
    },
    /// The available memory is unknown and no budget was given.
    #[error("available memory unknown; pass --ram")]
    UnknownMemory,
    /// A setting out of range (flag name and what was wrong).
    #[error("{0}")]
    BadSetting(String),
    /// Serialising a profile failed.
    #[error("profile: {0}")]
    Json(#[from] serde_json::Error),
}

/// Result alias for coli-plan.
pub type Result<T, E = PlanError> = std::result::Result<T, E>;
