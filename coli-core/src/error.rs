//! The one error type of coli-core.

use std::path::PathBuf;

/// Result alias for coli-core.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

/// Everything that can go wrong while reading a model from disk.
///
/// Messages say what was expected, what was found and where.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// The model directory does not exist or is not a directory.
    #[error("model directory {0} does not exist or is not a directory")]
    MissingDir(PathBuf),
    /// An I/O error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file being read or written.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `config.json` is missing a key, has a wrong type or an impossible value.
    #[error("{path}: {msg}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong, naming the key.
        msg: String,
    },
    /// A safetensors file whose header cannot be trusted.
    #[error("{path}: invalid safetensors header: {msg}")]
    Header {
        /// The shard.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// `model.safetensors.index.json` is malformed or names a shard that cannot be found.
    #[error("{path}: {msg}")]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A tensor the family needs is absent.
    #[error("tensor \"{name}\" not found in {dir}")]
    MissingTensor {
        /// Tensor name as the checkpoint spells it.
        name: String,
        /// Model directory.
        dir: PathBuf,
    },
    /// A tensor has a different shape than the family expects.
    #[error("tensor \"{name}\" in {file}: expected shape {expected:?}, found {found:?}")]
    Shape {
        /// Tensor name.
        name: String,
        /// Shard holding it.
        file: PathBuf,
        /// Shape the configuration implies.
        expected: Vec<usize>,
        /// Shape stored in the header.
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype coli cannot compute with here.
    #[error(
        "tensor \"{name}\" in {file}: dtype {found} is not supported (expected one of {expected})"
    )]
    Dtype {
        /// Tensor name.
        name: String,
        /// Shard holding it.
        file: PathBuf,
        /// The stored dtype.
        found: String,
        /// What would have been accepted.
        expected: String,
    },
    /// A GGUF file that cannot be parsed or uses something unsupported.
    #[error("{path}: invalid GGUF: {msg}")]
    Gguf {
        /// The GGUF file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

impl CoreError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CoreError::Io {
            path: path.into(),
            source,
        }
    }
}
