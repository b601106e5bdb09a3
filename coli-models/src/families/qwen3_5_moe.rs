//! Qwen3.5-MoE (Qwen3.5-35B-A3B, …): Qwen3-Next's hybrid text model (`qwen3_next`) as the
//! hub ships it: `model_type` `qwen3_5_moe` with the text model's keys in `text_config`
//! beside a `vision_config` (read as the top level: `coli_core::RawConfig::parse`), its
//! tensors under `model.language_model.*` beside a vision tower (`model.visual.*`, not
//! loaded: the CLI says so once) and MTP layers (`mtp.*`, not loaded). Also
//! `qwen3_5_moe_text`, the text model saved alone under `model.*`. Differences from
//! Qwen3-Next: the linear-attention input projections are separate (`in_proj_qkv`, `z`,
//! `b`, `a`), every layer is a MoE that renormalises its top-k, and the experts may come
//! fused (`experts.gate_up_proj` `[E, 2I, H]`, `experts.down_proj` `[E, H, I]`, read in
//! place per expert). Text-only positions make its multimodal RoPE (`mrope_section`) plain
//! partial RoPE. Mirrors `modeling_qwen3_5_moe.py`.

use coli_core::ModelDir;

use crate::arch::{KvLayout, Transformer};
use crate::error::Result;
use crate::families::qwen3_next::{hybrid_kv_layout, load_hybrid, Variant, FUSED_EXPERTS};
use crate::families::{Capability, Family, TensorLayout};

/// The Qwen3.5-MoE family.
pub struct Qwen35Moe;

impl Family for Qwen35Moe {
    const MODEL_TYPES: &'static [&'static str] = &["qwen3_5_moe", "qwen3_5_moe_text"];
    const DISPLAY_NAME: &'static str = "Qwen3.5-MoE";
    const CAPABILITIES: &'static [Capability] = &[
        Capability::Moe,
        Capability::SharedExperts,
        Capability::Gqa,
        Capability::QkNorm,
        Capability::LinearAttention,
    ];
    /// The text model's layers under either prefix; fused expert tensors; the vision tower
    /// and the MTP head never read.
    const LAYOUT: TensorLayout = TensorLayout {
        layers: &["model.language_model.layers.", "model.layers."],
        ignored: &["model.visual.", "mtp."],
        fused_experts: FUSED_EXPERTS,
        ..TensorLayout::STANDARD
    };
    fn load(dir: &ModelDir) -> Result<Transformer> {
        load_hybrid(dir, Variant::Qwen35)
    }
    fn kv_layout(dir: &ModelDir) -> Result<KvLayout> {
        hybrid_kv_layout(dir)
    }
}
