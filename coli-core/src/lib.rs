//! coli-core: everything coli knows about files on disk.
//!
//! * [`model_dir::ModelDir`] opens a Hugging Face model directory: `config.json`,
//!   one `model.safetensors` or shards listed by `model.safetensors.index.json`,
//!   memory-mapped, with shards also searched for in `COLI_MODEL_DIRS`.
//! * [`safetensors_header`] validates untrusted safetensors headers.
//! * [`config`] reads the keys every family shares (old and new spellings).
//! * [`dtype`] names the element types and converts them to f32.
//! * [`gguf`] reads GGUF files (llama.cpp's container) and dequantizes blocks.

pub mod config;
pub mod dtype;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod gguf;
pub mod json;
pub mod model_dir;
pub mod safetensors_header;
pub mod write;

pub use config::{yarn_get_mscale, RawConfig, RopeParameters, RopeScaling, YarnParameters};
pub use dtype::{DType, FP8_E4M3_TABLE};
pub use error::{CoreError, Result};
pub use model_dir::{
    make_resident, model_files, shard_files, shard_paths, sidecar_path, ModelDir, TensorView,
};
