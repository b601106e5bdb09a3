//! Block scales of quantized weights: held as f32, or left where they lie in the
//! checkpoint and streamed with their experts (checked as they are read).

use coli_core::TensorView;
use coli_kernels::matmul::{BlockScales, ScaleData};

/// Block scales of a quantized weight, read once at load time (small; shared by clones
/// and by the expert store).
#[derive(Clone, Debug)]
pub struct Scales {
    /// One scale per block, row-major over the block grid.
    pub values: ScaleValues,
    /// Rows per block.
    pub block_rows: usize,
    /// Columns per block.
    pub block_cols: usize,
}

/// How [`Scales`] keeps its values.
#[derive(Clone, Debug)]
pub enum ScaleValues {
    /// As f32 (FP8's `weight_scale_inv`, coli's int8/int4 containers).
    F32(std::sync::Arc<[f32]>),
    /// The checkpoint's E8M0 tensor where it lies, not read at load (a quarter of the
    /// memory of f32): the FP4 experts of DeepSeek-V4 and gpt-oss, whose scales the expert
    /// store streams with their matrices (and
    /// [`crate::arch::Transformer::make_experts_resident`] copies with them). Its bytes
    /// are checked for NaN (255) as they are read ([`check_e8m0`]).
    E8M0View(TensorView),
    /// f32 scales where they lie, not read at load: coli int4 containers' group scales
    /// (one per 64 weights, an eighth of the int4 bytes; held in RAM they took 402 MB of a
    /// 4.3 GB OLMoE-geometry model). Streamed with the experts like
    /// [`ScaleValues::E8M0View`], and checked finite as they are read. Only at a 4-byte
    /// aligned place in the file, so the bytes are f32s in place.
    F32View(TensorView),
}

/// Refuses streamed scales that are not numbers: E8M0 255 ([`check_e8m0`]), a non-finite
/// f32.
pub fn check_streamed_scales(
    kind: crate::experts::ScaleKind,
    bytes: &[u8],
) -> std::result::Result<(), String> {
    match kind {
        crate::experts::ScaleKind::E8M0 => check_e8m0(bytes),
        crate::experts::ScaleKind::F32 => match bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .enumerate()
            .find(|(_, v)| !v.is_finite())
        {
            Some((i, v)) => Err(format!("scale {i} is {v}, not finite")),
            None => Ok(()),
        },
    }
}

/// Refuses E8M0 scales holding 255, NaN in E8M0 (the error says which one).
pub fn check_e8m0(bytes: &[u8]) -> std::result::Result<(), String> {
    match bytes.iter().position(|&b| b == 255) {
        Some(i) => Err(format!("scale {i} is 255, NaN in E8M0")),
        None => Ok(()),
    }
}

impl ScaleValues {
    /// How scales left where they lie are stored (`None` for values held in RAM).
    pub fn streamed_kind(&self) -> Option<crate::experts::ScaleKind> {
        match self {
            ScaleValues::F32(_) => None,
            ScaleValues::E8M0View(_) => Some(crate::experts::ScaleKind::E8M0),
            ScaleValues::F32View(_) => Some(crate::experts::ScaleKind::F32),
        }
    }
}

impl Scales {
    /// The scales of rows `first..first + n` of a `[_, cols]` matrix, one grid row per
    /// matrix row (as f32: E8M0 widens exactly).
    pub fn row_range(&self, first: usize, n: usize, cols: usize) -> Scales {
        let per_row = cols.div_ceil(self.block_cols);
        let mut out = Vec::with_capacity(n * per_row);
        for r in first..first + n {
            let at = (r / self.block_rows) * per_row;
            match &self.values {
                ScaleValues::F32(v) => out.extend_from_slice(&v[at..at + per_row]),
                ScaleValues::E8M0View(v) => out.extend(
                    v.bytes()[at..at + per_row]
                        .iter()
                        .map(|&b| coli_core::dtype::e8m0_to_f32(b)),
                ),
                ScaleValues::F32View(v) => {
                    out.extend_from_slice(&bytemuck::cast_slice(v.bytes())[at..at + per_row])
                }
            }
        }
        Scales {
            values: ScaleValues::F32(out.into()),
            block_rows: 1,
            block_cols: self.block_cols,
        }
    }

    /// As the kernels take them.
    pub fn block_scales(&self) -> BlockScales<'_> {
        BlockScales {
            scales: match &self.values {
                ScaleValues::F32(v) => ScaleData::F32(v),
                ScaleValues::E8M0View(v) => ScaleData::E8M0(v.bytes()),
                // Aligned: checked at load, and resident copies start on 64 bytes.
                ScaleValues::F32View(v) => ScaleData::F32(bytemuck::cast_slice(v.bytes())),
            },
            block_rows: self.block_rows,
            block_cols: self.block_cols,
        }
    }
}
