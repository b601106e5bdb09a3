//! The family registry: one descriptor table, `model_type` aliases → loader.

use std::path::Path;

use coli_core::ModelDir;

use crate::decoder::Transformer;
use crate::error::{ModelError, Result};

/// What a family can do (shown by `coli info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// Dense feed-forward layers.
    Dense,
    /// Routed mixture-of-experts layers.
    Moe,
    /// Grouped-query attention.
    Gqa,
    /// q/k normalisation.
    QkNorm,
    /// Tied input/output embeddings.
    TiedEmbeddings,
    /// Shared experts beside the routed ones.
    SharedExperts,
    /// Multi-head latent attention (compressed KV cache).
    Mla,
    /// Sigmoid routing with a selection bias and group-limited top-k.
    GroupRouting,
    /// DeepSeek sparse attention (a lightning indexer selects the attended positions).
    SparseAttention,
}

/// A model family: what the registry needs to know about one `transformers` architecture.
/// Each family file implements it on a unit struct; [`FAMILIES`] lists them once.
pub trait Family {
    /// `model_type` values that select this family.
    const MODEL_TYPES: &'static [&'static str];
    /// Human-readable name.
    const DISPLAY_NAME: &'static str;
    /// Capabilities.
    const CAPABILITIES: &'static [Capability];
    /// Builds the model from an opened directory (config checked, tensors shape-checked).
    fn load(dir: &ModelDir) -> Result<Transformer>;
}

/// The descriptor of a family, for the table.
pub const fn descriptor<F: Family>() -> FamilyDescriptor {
    FamilyDescriptor {
        model_types: F::MODEL_TYPES,
        display_name: F::DISPLAY_NAME,
        capabilities: F::CAPABILITIES,
        load: F::load,
    }
}

/// One family: its `model_type` spellings, its name, what it supports, its loader.
pub struct FamilyDescriptor {
    /// `model_type` values that select this family.
    pub model_types: &'static [&'static str],
    /// Human-readable name.
    pub display_name: &'static str,
    /// Capabilities.
    pub capabilities: &'static [Capability],
    /// Builds the model from an opened directory.
    pub load: fn(&ModelDir) -> Result<Transformer>,
}

/// Every family coli implements.
pub static FAMILIES: &[FamilyDescriptor] = &[
    descriptor::<crate::llama::Llama>(),
    descriptor::<crate::olmoe::Olmoe>(),
    descriptor::<crate::qwen_moe::Qwen2Moe>(),
    descriptor::<crate::qwen_moe::Qwen3Moe>(),
    descriptor::<crate::mixtral::Mixtral>(),
    descriptor::<crate::deepseek_v3::DeepseekV3>(),
    descriptor::<crate::glm4_moe::Glm4Moe>(),
    descriptor::<crate::glm_moe_dsa::GlmMoeDsa>(),
];

/// All supported `model_type` spellings, comma-separated.
pub fn supported_model_types() -> String {
    FAMILIES
        .iter()
        .flat_map(|f| f.model_types.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The descriptor for a `model_type`, or the "unsupported" error listing the alternatives.
pub fn lookup(model_type: &str) -> Result<&'static FamilyDescriptor> {
    FAMILIES
        .iter()
        .find(|f| f.model_types.contains(&model_type))
        .ok_or_else(|| ModelError::UnsupportedModelType {
            found: model_type.to_string(),
            supported: supported_model_types(),
        })
}

/// Builds the model of an opened directory through the registry.
pub fn load_dir(dir: &ModelDir) -> Result<Transformer> {
    let family = lookup(dir.config.model_type()?)?;
    let mut model = (family.load)(dir)?;
    model.make_resident()?;
    Ok(model)
}

/// Opens a model directory and loads it.
pub fn load(path: impl AsRef<Path>) -> Result<Transformer> {
    let dir = ModelDir::open(path)?;
    load_dir(&dir)
}
