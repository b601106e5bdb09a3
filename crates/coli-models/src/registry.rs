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
    FamilyDescriptor {
        model_types: &["llama"],
        display_name: "Llama",
        capabilities: &[
            Capability::Dense,
            Capability::Gqa,
            Capability::TiedEmbeddings,
        ],
        load: crate::llama::load,
    },
    FamilyDescriptor {
        model_types: &["olmoe"],
        display_name: "OLMoE",
        capabilities: &[Capability::Moe, Capability::Gqa, Capability::QkNorm],
        load: crate::olmoe::load,
    },
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
