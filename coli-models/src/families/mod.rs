//! The families and their registry: one descriptor table, `model_type` aliases → loader.
//! Each family file reads top to bottom like the `transformers` modeling file it mirrors:
//! its config, its tensor names, and how its blocks (from [`crate::arch`]) assemble.
//! To add a family: a file here with a unit struct implementing [`Family`], one line in
//! [`FAMILIES`], and an oracle fixture from `oracle/generate.py`.

pub mod deepseek_v3;
pub mod deepseek_v4;
pub mod glm4_moe;
pub mod glm_moe_dsa;
pub mod gpt_oss;
pub mod llama;
pub mod minimax_m2;
pub mod mixtral;
pub mod olmoe;
pub mod qwen3_5_moe;
pub mod qwen3_next;
pub mod qwen_moe;
pub mod skeleton;

use std::path::Path;

use coli_core::ModelDir;

use crate::arch::layer::head_dim;
use crate::arch::{KvLayout, KvShape, Transformer};
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
    /// Linear attention over a fixed-size recurrent state (Gated DeltaNet).
    LinearAttention,
    /// Several residual streams mixed around every block (DeepSeek-V4's mHC).
    HyperConnections,
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
    /// How the checkpoint names its tensors (for classification without loading).
    const LAYOUT: TensorLayout = TensorLayout::STANDARD;
    /// Builds the model from an opened directory (config checked, tensors shape-checked).
    fn load(dir: &ModelDir) -> Result<Transformer>;
    /// What the KV cache holds per position, from the config alone (no tensor read). The
    /// default: grouped-query attention from the shared keys. Loading checks the answer
    /// against the blocks, so the planner's figure is the allocation's.
    fn kv_layout(dir: &ModelDir) -> Result<KvLayout> {
        let c: skeleton::CommonConfig = dir.config.deserialize()?;
        let n_kv = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        let hd = head_dim(dir, c.hidden_size, c.num_attention_heads, n_kv, c.head_dim)?;
        Ok(KvLayout::uniform(
            c.num_hidden_layers,
            KvShape::gqa(n_kv, hd),
        ))
    }
}

/// Name patterns of a family's checkpoint: decoder layers are `{layers}{L}.` (usually
/// `model.layers.{L}.`); within a layer, these infixes mark routed experts (followed by
/// `{E}.`), shared experts and the DSA indexer. Layers at or past `num_hidden_layers` are MTP
/// layers.
#[derive(Clone, Copy, Debug)]
pub struct TensorLayout {
    /// Prefixes of the decoder layers, each followed by the layer index.
    pub layers: &'static [&'static str],
    /// Prefixes of tensors coli never reads (a vision tower beside the text model).
    pub ignored: &'static [&'static str],
    /// Infixes followed by the expert index, e.g. `.mlp.experts.`.
    pub experts: &'static [&'static str],
    /// Infixes of shared experts and their gates.
    pub shared: &'static [&'static str],
    /// Infixes of the DSA indexer.
    pub indexer: &'static [&'static str],
    /// Whole layer tails of tensors that hold every routed expert of the layer, stacked
    /// along the first dimension (gpt-oss' MXFP4 `_blocks`): expert `e` is slice `e`.
    pub fused_experts: &'static [&'static str],
}

impl TensorLayout {
    /// The Hugging Face spelling every family here uses.
    pub const STANDARD: TensorLayout = TensorLayout {
        layers: &["model.layers."],
        ignored: &[],
        experts: &[".mlp.experts.", ".block_sparse_moe.experts."],
        shared: &[
            ".mlp.shared_expert.",
            ".mlp.shared_experts.",
            ".mlp.shared_expert_gate.",
        ],
        indexer: &[".self_attn.indexer."],
        fused_experts: &[],
    };
}

/// What a tensor of a checkpoint is, by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorClass {
    /// Resident: embeddings, norms, attention, dense MLPs, routers, the head.
    Dense,
    /// A routed expert's tensor (weights and their scales).
    Expert {
        /// Decoder layer.
        layer: usize,
        /// Expert index.
        expert: usize,
    },
    /// A shared expert's tensor.
    SharedExpert {
        /// Decoder layer.
        layer: usize,
    },
    /// DSA indexer.
    Indexer {
        /// Decoder layer.
        layer: usize,
    },
    /// Every routed expert of a layer stacked in one tensor (expert `e` is slice `e` of the
    /// first dimension).
    FusedExperts {
        /// Decoder layer.
        layer: usize,
    },
    /// A multi-token-prediction layer (index >= `num_hidden_layers`): drafts tokens
    /// (`crate::arch::Mtp`) in the families that opt in.
    Mtp {
        /// Layer index.
        layer: usize,
    },
    /// Not part of the text model (a vision tower): never read.
    Ignored,
}

/// Classifies a tensor name of a family's checkpoint with `n_layers` decoder layers.
pub fn classify(layout: &TensorLayout, name: &str, n_layers: usize) -> TensorClass {
    if layout.ignored.iter().any(|p| name.starts_with(p)) {
        return TensorClass::Ignored;
    }
    let Some(rest) = layout.layers.iter().find_map(|p| name.strip_prefix(p)) else {
        return TensorClass::Dense;
    };
    let (layer, tail) = match rest.split_once('.') {
        Some((l, t)) => match l.parse::<usize>() {
            Ok(l) => (l, t),
            Err(_) => return TensorClass::Dense,
        },
        None => return TensorClass::Dense,
    };
    if layer >= n_layers {
        return TensorClass::Mtp { layer };
    }
    // Infixes start with the '.' that ends the layer index.
    let tail = &name[name.len() - tail.len() - 1..];
    for infix in layout.experts {
        if let Some(after) = tail.strip_prefix(infix) {
            if let Some(Ok(expert)) = after.split_once('.').map(|(e, _)| e.parse::<usize>()) {
                return TensorClass::Expert { layer, expert };
            }
        }
    }
    if layout.fused_experts.contains(&tail) {
        return TensorClass::FusedExperts { layer };
    }
    if layout.shared.iter().any(|i| tail.starts_with(i)) {
        return TensorClass::SharedExpert { layer };
    }
    if layout.indexer.iter().any(|i| tail.starts_with(i)) {
        return TensorClass::Indexer { layer };
    }
    TensorClass::Dense
}

/// The descriptor of a family, for the table.
pub const fn descriptor<F: Family>() -> FamilyDescriptor {
    FamilyDescriptor {
        model_types: F::MODEL_TYPES,
        display_name: F::DISPLAY_NAME,
        capabilities: F::CAPABILITIES,
        layout: F::LAYOUT,
        load: F::load,
        kv_layout: F::kv_layout,
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
    /// Tensor name patterns.
    pub layout: TensorLayout,
    /// Builds the model from an opened directory.
    pub load: fn(&ModelDir) -> Result<Transformer>,
    /// The KV layout from the config alone.
    pub kv_layout: fn(&ModelDir) -> Result<KvLayout>,
}

/// Every family coli implements.
pub static FAMILIES: &[FamilyDescriptor] = &[
    descriptor::<llama::Llama>(),
    descriptor::<olmoe::Olmoe>(),
    descriptor::<qwen_moe::Qwen2Moe>(),
    descriptor::<qwen_moe::Qwen3Moe>(),
    descriptor::<mixtral::Mixtral>(),
    descriptor::<deepseek_v3::DeepseekV3>(),
    descriptor::<glm4_moe::Glm4Moe>(),
    descriptor::<glm_moe_dsa::GlmMoeDsa>(),
    descriptor::<gpt_oss::GptOss>(),
    descriptor::<minimax_m2::MiniMaxM2>(),
    descriptor::<qwen3_next::Qwen3Next>(),
    descriptor::<qwen3_5_moe::Qwen35Moe>(),
    descriptor::<deepseek_v4::DeepseekV4>(),
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
    let said = (family.kv_layout)(dir)?;
    let built = KvLayout::of(&model);
    if said != built {
        return Err(ModelError::Inconsistent(format!(
            "{}: the family's KV layout {said:?} differs from its blocks' {built:?}",
            family.display_name
        )));
    }
    model.make_resident()?;
    let (embed, head) = (model.embed_tokens.clone(), model.lm_head.clone());
    if let Some(mtp) = model.mtp.as_deref_mut() {
        mtp.share_main(&embed, &head);
    }
    Ok(model)
}

/// Opens a model directory and loads it.
pub fn load(path: impl AsRef<Path>) -> Result<Transformer> {
    let dir = ModelDir::open(path)?;
    load_dir(&dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_tensor_kinds_of_every_family() {
        let l = &TensorLayout::STANDARD;
        let c = |n: &str| classify(l, n, 61);
        assert_eq!(c("model.embed_tokens.weight"), TensorClass::Dense);
        assert_eq!(c("lm_head.weight"), TensorClass::Dense);
        assert_eq!(
            c("model.layers.3.self_attn.kv_b_proj.weight"),
            TensorClass::Dense
        );
        assert_eq!(c("model.layers.3.mlp.gate.weight"), TensorClass::Dense);
        assert_eq!(
            c("model.layers.3.mlp.experts.17.down_proj.weight_scale_inv"),
            TensorClass::Expert {
                layer: 3,
                expert: 17
            }
        );
        assert_eq!(
            c("model.layers.0.block_sparse_moe.experts.7.w2.weight"),
            TensorClass::Expert {
                layer: 0,
                expert: 7
            }
        );
        assert_eq!(
            c("model.layers.9.mlp.shared_experts.up_proj.weight"),
            TensorClass::SharedExpert { layer: 9 }
        );
        assert_eq!(
            c("model.layers.9.mlp.shared_expert_gate.weight"),
            TensorClass::SharedExpert { layer: 9 }
        );
        assert_eq!(
            c("model.layers.2.self_attn.indexer.wk.weight"),
            TensorClass::Indexer { layer: 2 }
        );
        assert_eq!(
            c("model.layers.61.eh_proj.weight"),
            TensorClass::Mtp { layer: 61 }
        );
        assert_eq!(c("model.layers.x.mlp.experts.1.w"), TensorClass::Dense);
        // gpt-oss: the MXFP4 blocks and scales of all experts in one tensor per
        // projection, streamed; biases stay resident.
        let g = |n: &str| classify(&gpt_oss::GptOss::LAYOUT, n, 24);
        for n in [
            "model.layers.5.mlp.experts.gate_up_proj_blocks",
            "model.layers.5.mlp.experts.down_proj_blocks",
            "model.layers.5.mlp.experts.gate_up_proj_scales",
            "model.layers.5.mlp.experts.down_proj_scales",
        ] {
            assert_eq!(g(n), TensorClass::FusedExperts { layer: 5 }, "{n}");
        }
        for n in [
            "model.layers.5.mlp.experts.down_proj_bias",
            "model.layers.5.mlp.router.weight",
            "model.layers.5.self_attn.sinks",
        ] {
            assert_eq!(g(n), TensorClass::Dense, "{n}");
        }
        assert_eq!(
            c("model.layers.5.mlp.experts.gate_up_proj_blocks"),
            TensorClass::Dense
        );
        // Qwen3.5: the text model under model.language_model, fused BF16 experts, a vision
        // tower and an MTP head that are never read.
        let q = |n: &str| classify(&qwen3_5_moe::Qwen35Moe::LAYOUT, n, 40);
        assert_eq!(
            q("model.language_model.layers.3.mlp.experts.gate_up_proj"),
            TensorClass::FusedExperts { layer: 3 }
        );
        assert_eq!(
            q("model.layers.3.mlp.experts.7.up_proj.weight"),
            TensorClass::Expert {
                layer: 3,
                expert: 7
            }
        );
        assert_eq!(
            q("model.language_model.layers.3.mlp.shared_expert_gate.weight"),
            TensorClass::SharedExpert { layer: 3 }
        );
        for n in ["model.visual.blocks.0.attn.qkv.weight", "mtp.fc.weight"] {
            assert_eq!(q(n), TensorClass::Ignored, "{n}");
        }
        assert_eq!(
            q("model.language_model.embed_tokens.weight"),
            TensorClass::Dense
        );
        // DeepSeek-V4 in both spellings: the release's per-expert FP4 weights and their
        // scales stream; transformers' fused experts; MTP ignored.
        let v = |n: &str| classify(&deepseek_v4::DeepseekV4::LAYOUT, n, 43);
        for n in [
            "layers.7.ffn.experts.200.w2.weight",
            "layers.7.ffn.experts.200.w2.scale",
        ] {
            assert_eq!(
                v(n),
                TensorClass::Expert {
                    layer: 7,
                    expert: 200
                },
                "{n}"
            );
        }
        for n in [
            "layers.7.attn.wq_b.scale",
            "layers.7.ffn.gate.tid2eid",
            "hc_head_fn",
        ] {
            assert_eq!(v(n), TensorClass::Dense, "{n}");
        }
        assert_eq!(
            v("layers.7.ffn.shared_experts.w1.weight"),
            TensorClass::SharedExpert { layer: 7 }
        );
        assert_eq!(
            v("layers.7.attn.indexer.wq_b.weight"),
            TensorClass::Indexer { layer: 7 }
        );
        assert_eq!(
            v("model.layers.3.mlp.experts.gate_up_proj"),
            TensorClass::FusedExperts { layer: 3 }
        );
        assert_eq!(v("mtp.0.attn.wq_a.weight"), TensorClass::Ignored);
    }
}
