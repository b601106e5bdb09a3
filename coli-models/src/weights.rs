//! Loading weights by name, checking shape and dtype once at load time.

use coli_core::gguf::GgmlType;
use coli_core::{DType, ModelDir, TensorView};
use coli_kernels::matmul::{matmul, matmul_many};
use coli_kernels::{MatRef, WFormat};

use crate::error::Result;

mod scales;
pub use scales::{check_e8m0, check_streamed_scales, ScaleValues, Scales};

/// Columns per scale in coli's int4 containers.
pub const INT4_GROUP: usize = 64;

/// The kernel format of a stored dtype (`U8` weights are coli's packed int4); `None` for
/// the integer dtypes of index tables, which are never matrices.
pub fn wformat(d: DType) -> Option<WFormat> {
    match d {
        DType::F32 => Some(WFormat::F32),
        DType::BF16 => Some(WFormat::BF16),
        DType::F16 => Some(WFormat::F16),
        DType::F8E4M3 => Some(WFormat::F8E4M3),
        DType::I8 => Some(WFormat::I8),
        DType::U8 => Some(WFormat::I4),
        DType::I32 | DType::I64 | DType::F8E8M0 => None,
    }
}

/// [`wformat`] for the bf16/f16/f32 tensors the callers have already checked.
fn float_format(d: DType) -> WFormat {
    wformat(d).expect("checked to be a float dtype")
}

/// A linear layer `y = W x (+ b)` with `W` stored `[rows, cols]`, read in place from the mapping.
#[derive(Clone, Debug)]
pub struct Linear {
    view: TensorView,
    fmt: WFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    bias: Option<Vec<f32>>,
    scales: Option<Scales>,
    /// The checkpoint stores the matrix input-major, `[cols, rows]` (gpt-oss' unquantized
    /// fused experts). Its kernel matrix is the transpose: made once in a resident copy or
    /// by the expert store as it reads, else for each use ([`Linear::with_mat`]).
    transposed: bool,
}

impl Linear {
    /// Loads `name` (the full tensor name), checking shape `[rows, cols]`. Quantized
    /// weights stay quantized and bring their scales, read once here; the kernels
    /// dequantize as they read:
    /// * FP8 (`F8_E4M3`): `{name}_scale_inv` per `quantization_config.weight_block_size` block
    ///   (or DeepSeek-V4's `{stem}.scale`, E8M0 powers of two);
    /// * coli int8 (`I8`): `{name}_scale`, `[rows, 1]`, one per row;
    /// * coli int4 (`U8`, `[rows, ceil(cols / 2)]`, two per byte): `{name}_scale`,
    ///   `[rows, ceil(cols / 64)]`, one per 64 columns.
    pub fn load(dir: &ModelDir, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let view = dir.tensor(name)?;
        if let Some(ty) = GgmlType::from_name(&view.dtype_name).filter(|t| t.is_quantized()) {
            // A GGUF block type: whole blocks per row, each with its own scales.
            view.expect_shape(&[rows, cols])?;
            return Ok(Linear {
                view,
                fmt: WFormat::Ggml(ty),
                rows,
                cols,
                bias: None,
                scales: None,
                transposed: false,
            });
        }
        let dtype = view.dtype()?;
        let fmt = wformat(dtype).ok_or_else(|| crate::error::ModelError::BadTensor {
            name: name.to_string(),
            msg: format!("a weight matrix cannot be {dtype}"),
        })?;
        let mut view = view;
        let shape = [rows, fmt.row_bytes(cols) / fmt.size()];
        dir.unit_dims(&mut view, &shape);
        view.expect_shape(&shape)?;
        let (scale_name, block) = match dtype {
            DType::F8E4M3 => {
                let b = dir.config.fp8_block_size()?.ok_or_else(|| {
                    dir.config.error(
                        "quantization_config",
                        format!("{name} is FP8 but the config has no weight_block_size"),
                    )
                })?;
                (fp8_scale_name(dir, name), Some(b))
            }
            DType::I8 => (format!("{name}_scale"), Some((1, cols))),
            DType::U8 => (format!("{name}_scale"), Some((1, INT4_GROUP))),
            _ => (String::new(), None),
        };
        let scales = match block {
            None => None,
            Some((br, bc)) => {
                let s = dir.tensor_shaped(&scale_name, &[rows.div_ceil(br), cols.div_ceil(bc)])?;
                // Integers would be read as their values (a U8 `127` as 127, not E8M0's 1).
                if !matches!(
                    s.dtype()?,
                    DType::F32 | DType::BF16 | DType::F16 | DType::F8E8M0
                ) {
                    return Err(crate::error::ModelError::BadTensor {
                        name: scale_name,
                        msg: format!(
                            "scales are read as F32, BF16, F16 or F8_E8M0; found {}",
                            s.dtype_name
                        ),
                    });
                }
                // int4 group scales stay where they lie (streamed with the experts) when
                // they are f32s in place.
                let in_place = dtype == DType::U8
                    && s.dtype()? == DType::F32
                    && s.file_range().start.is_multiple_of(4)
                    && (s.bytes().as_ptr() as usize).is_multiple_of(4);
                let values = if in_place {
                    ScaleValues::F32View(s)
                } else {
                    let values = s.to_f32_vec()?;
                    if let Some(bad) = values.iter().find(|v| !v.is_finite()) {
                        return Err(crate::error::ModelError::BadTensor {
                            name: scale_name,
                            msg: format!("scale {bad} is not finite"),
                        });
                    }
                    ScaleValues::F32(values.into())
                };
                Some(Scales {
                    values,
                    block_rows: br,
                    block_cols: bc,
                })
            }
        };
        Ok(Linear {
            view,
            fmt,
            rows,
            cols,
            bias: None,
            scales,
            transposed: false,
        })
    }

    /// An FP4 matrix as DeepSeek-V4 ships its routed experts: `name` `[rows, cols / 2]`
    /// (I8 or U8, two `e2m1` values per byte, even column low) and one scale per 32
    /// columns, `{stem}.scale` `[rows, cols / 32]` (`stem` is `name` without `.weight`),
    /// as E8M0 (`ue8m0`) or F32. Errors name the tensor: a width that is not whole blocks,
    /// a non-finite F32 scale, another dtype. E8M0 scales stay where they lie
    /// ([`ScaleValues::E8M0View`]); a NaN among them is an error when they are read.
    pub fn load_fp4(dir: &ModelDir, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        const BLOCK: usize = 32;
        let bad = |n: &str, msg: String| crate::error::ModelError::BadTensor {
            name: n.to_string(),
            msg,
        };
        if !cols.is_multiple_of(BLOCK) {
            return Err(bad(
                name,
                format!("FP4 rows of {cols} elements are not whole blocks of {BLOCK}"),
            ));
        }
        let view = dir.tensor_shaped(name, &[rows, cols / 2])?;
        if !matches!(view.dtype_name.as_str(), "I8" | "U8") {
            return Err(bad(
                name,
                format!(
                    "FP4 weights are packed in I8 or U8, found {}",
                    view.dtype_name
                ),
            ));
        }
        let scale_name = format!("{}.scale", name.strip_suffix(".weight").unwrap_or(name));
        let s = dir.tensor_shaped(&scale_name, &[rows, cols / BLOCK])?;
        let values = match s.dtype()? {
            // Not read here: 8.7 GB on V4-Flash, streamed with the experts.
            DType::F8E8M0 => ScaleValues::E8M0View(s),
            DType::F32 | DType::BF16 => {
                let v = s.to_f32_vec()?;
                if let Some(x) = v.iter().find(|x| !x.is_finite()) {
                    return Err(bad(&scale_name, format!("scale {x} is not finite")));
                }
                ScaleValues::F32(v.into())
            }
            other => {
                return Err(bad(
                    &scale_name,
                    format!("FP4 scales are F8_E8M0, F32 or BF16, found {other}"),
                ))
            }
        };
        Ok(Linear {
            view,
            fmt: WFormat::F4E2M1,
            rows,
            cols,
            bias: None,
            scales: Some(Scales {
                values,
                block_rows: 1,
                block_cols: BLOCK,
            }),
            transposed: false,
        })
    }

    /// Expert `e` of a fused MXFP4 tensor as the gpt-oss releases store it: `{name}_blocks`
    /// `[E, rows, cols / 32, 16]` (two `e2m1` values per byte, even column low) and
    /// `{name}_scales` `[E, rows, cols / 32]` (E8M0: `2^(s - 127)`, left where they lie and
    /// checked for NaN as they are read), with the row of `{name}_bias` `[E, rows]` as the
    /// bias. Errors name the tensor: a width that is not a multiple of 32, a dtype.
    pub fn load_mxfp4_expert(
        dir: &ModelDir,
        name: &str,
        e: usize,
        n_experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Linear> {
        const BLOCK: usize = 32;
        let bad = |n: &str, msg: String| crate::error::ModelError::BadTensor {
            name: n.to_string(),
            msg,
        };
        let blocks_name = format!("{name}_blocks");
        if !cols.is_multiple_of(BLOCK) {
            return Err(bad(
                &blocks_name,
                format!("MXFP4 rows of {cols} elements are not whole blocks of {BLOCK}"),
            ));
        }
        let groups = cols / BLOCK;
        let blocks = dir.tensor_shaped(&blocks_name, &[n_experts, rows, groups, BLOCK / 2])?;
        if blocks.dtype()? != DType::U8 {
            return Err(bad(
                &blocks_name,
                format!("expected U8, found {}", blocks.dtype_name),
            ));
        }
        let scales_name = format!("{name}_scales");
        let scales = dir.tensor_shaped(&scales_name, &[n_experts, rows, groups])?;
        if scales.dtype()? != DType::U8 {
            return Err(bad(
                &scales_name,
                format!("expected U8 (E8M0), found {}", scales.dtype_name),
            ));
        }
        let bias = expert_bias(dir, name, e, n_experts, rows)?;
        Ok(Linear {
            view: blocks.outer(e)?,
            fmt: WFormat::F4E2M1,
            rows,
            cols,
            bias: Some(bias),
            // E8M0 bytes left where they lie, streamed with the expert; the kernels widen
            // a row's worth as they read it.
            scales: Some(Scales {
                values: ScaleValues::E8M0View(scales.outer(e)?),
                block_rows: 1,
                block_cols: BLOCK,
            }),
            transposed: false,
        })
    }

    /// Row block `part` of `parts` of expert `e` in an unquantized fused tensor
    /// `[E, parts * rows, cols]` (Qwen3.5's `experts.gate_up_proj`: the gate's rows, then
    /// the up projection's; `experts.down_proj`: one block). Quantized fused tensors are
    /// refused by name.
    #[allow(clippy::too_many_arguments)]
    pub fn load_fused_expert(
        dir: &ModelDir,
        name: &str,
        e: usize,
        n_experts: usize,
        part: usize,
        parts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Linear> {
        let t = dir.tensor_shaped(name, &[n_experts, parts * rows, cols])?;
        let dtype = fused_float_dtype(&t, name)?;
        let mut slice = t.outer(e)?;
        slice.shape = vec![parts, rows, cols];
        Ok(Linear {
            view: slice.outer(part)?,
            fmt: float_format(dtype),
            rows,
            cols,
            bias: None,
            scales: None,
            transposed: false,
        })
    }

    /// Expert `e` of `name` `[n_experts, cols, rows]`: each expert's matrix stored
    /// input-major, as transformers keeps gpt-oss' unquantized experts (`gate_up_proj`
    /// `[E, hidden, 2 * inter]`, `down_proj` `[E, inter, hidden]`), with its bias
    /// `{name}_bias` `[n_experts, rows]`. BF16, F16 or F32. The kernels see the transpose
    /// (see the `transposed` field).
    pub fn load_transposed_expert(
        dir: &ModelDir,
        name: &str,
        e: usize,
        n_experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Linear> {
        let t = dir.tensor_shaped(name, &[n_experts, cols, rows])?;
        let dtype = fused_float_dtype(&t, name)?;
        let bias = expert_bias(dir, name, e, n_experts, rows)?;
        Ok(Linear {
            view: t.outer(e)?,
            fmt: float_format(dtype),
            rows,
            cols,
            bias: Some(bias),
            scales: None,
            transposed: true,
        })
    }

    /// `name` `[blocks * rows, cols]` as `blocks` matrices of `rows` rows each (DeepSeek-V4's
    /// grouped output projection: one block per head group), in any format [`Linear::load`]
    /// reads. Block-scaled weights (FP8) give each block its rows' scales, one row of the
    /// scale grid per matrix row: the same value per element, so the same bits.
    pub fn load_row_blocks(
        dir: &ModelDir,
        name: &str,
        blocks: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Linear>> {
        let full = Linear::load(dir, name, blocks * rows, cols)?;
        let mut all = full.view.clone();
        all.shape = vec![blocks, rows, full.fmt.row_bytes(cols) / full.fmt.size()];
        (0..blocks)
            .map(|g| {
                Ok(Linear {
                    view: all.outer(g)?,
                    fmt: full.fmt,
                    rows,
                    cols,
                    bias: None,
                    scales: full
                        .scales
                        .as_ref()
                        .map(|s| s.row_range(g * rows, rows, cols)),
                    transposed: false,
                })
            })
            .collect()
    }

    /// The bias, if the layer has one.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// The layer with bias `b` (`rows` values).
    pub fn with_bias(mut self, b: Vec<f32>) -> Linear {
        assert_eq!(b.len(), self.rows, "{}: bias length", self.view.name);
        self.bias = Some(b);
        self
    }

    /// Loads `{prefix}.weight` and, if `bias`, `{prefix}.bias`.
    pub fn load_prefixed(
        dir: &ModelDir,
        prefix: &str,
        rows: usize,
        cols: usize,
        bias: bool,
    ) -> Result<Linear> {
        let mut l = Linear::load(dir, &format!("{prefix}.weight"), rows, cols)?;
        if bias {
            l.bias = Some(load_vector(dir, &format!("{prefix}.bias"), rows)?);
        }
        Ok(l)
    }

    /// The stored tensor.
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// The stored element format.
    pub fn format(&self) -> WFormat {
        self.fmt
    }

    /// Block scales of a quantized weight.
    pub fn scales(&self) -> Option<&Scales> {
        self.scales.as_ref()
    }

    /// The scales' tensor when they are left where they lie ([`ScaleValues::E8M0View`],
    /// [`ScaleValues::F32View`]).
    pub fn scale_view(&self) -> Option<&TensorView> {
        match self.scales.as_ref().map(|s| &s.values) {
            Some(ScaleValues::E8M0View(v) | ScaleValues::F32View(v)) => Some(v),
            _ => None,
        }
    }

    /// Refuses scales left where they lie that are not numbers (E8M0 255, a non-finite
    /// f32), reading them in full: for paths that use them without the expert store
    /// (which checks as it reads).
    pub fn check_scales(&self) -> Result<()> {
        let Some(kind) = self.scales.as_ref().and_then(|s| s.values.streamed_kind()) else {
            return Ok(());
        };
        if let Some(v) = self.scale_view() {
            check_streamed_scales(kind, v.bytes()).map_err(|msg| {
                crate::error::ModelError::BadTensor {
                    name: v.name.clone(),
                    msg,
                }
            })?;
        }
        Ok(())
    }

    /// Points the scales at another copy of the same bytes (after
    /// [`Linear::scale_view`]).
    pub fn set_scale_view(&mut self, view: TensorView) {
        if let Some(s) = self.scales.as_mut() {
            if let ScaleValues::E8M0View(v) | ScaleValues::F32View(v) = &mut s.values {
                assert_eq!(view.bytes().len(), v.bytes().len());
                *v = view;
            }
        }
    }

    /// Points the layer at another copy of the same bytes.
    pub fn set_view(&mut self, view: TensorView) {
        assert_eq!(view.bytes().len(), self.view.bytes().len());
        self.view = view;
    }

    /// Points the layer at a resident copy of its bytes ([`coli_core::make_resident`]); a
    /// matrix stored input-major is transposed once here, into a resident copy of its own.
    pub fn set_resident_view(&mut self, view: TensorView) -> Result<()> {
        if !self.transposed {
            self.set_view(view);
            return Ok(());
        }
        let t = transposed_bytes(view.bytes(), self.cols, self.rows, self.fmt.size());
        self.set_view(view.resident_with(&t)?);
        Ok(())
    }

    /// Whether the checkpoint stores this matrix input-major (`[cols, rows]`); the expert
    /// store then transposes it as it reads.
    pub fn is_transposed(&self) -> bool {
        self.transposed
    }

    /// Whether the bytes at hand are the checkpoint's input-major ones (not yet transposed).
    fn needs_transpose(&self) -> bool {
        self.transposed && !self.view.is_resident()
    }

    /// The weight as a kernel matrix. A matrix stored input-major has one only once it is
    /// resident (transposed): use [`Linear::with_mat`] where it may not be.
    pub fn mat(&self) -> MatRef<'_> {
        assert!(
            !self.needs_transpose(),
            "{}: an input-major matrix read in place has no kernel matrix (use with_mat)",
            self.view.name
        );
        self.mat_of(self.view.bytes())
    }

    fn mat_of<'a>(&'a self, bytes: &'a [u8]) -> MatRef<'a> {
        let m = MatRef::new(self.fmt, bytes, self.rows, self.cols);
        match &self.scales {
            None => m,
            Some(s) => m.with_scales(s.block_scales()),
        }
    }

    /// Runs `f` on the weight as a kernel matrix: [`Linear::mat`], or for a matrix stored
    /// input-major and read in place, its transpose in a temporary copy (the same bytes the
    /// expert store and the resident copy hold, so the same results).
    pub fn with_mat<R>(&self, f: impl FnOnce(MatRef<'_>) -> R) -> R {
        if !self.needs_transpose() {
            return f(self.mat());
        }
        let t = transposed_bytes(self.view.bytes(), self.cols, self.rows, self.fmt.size());
        f(self.mat_of(&t))
    }

    /// `out[t] = W xs[t] + b` for `n` tokens.
    pub fn forward(&self, xs: &[f32], n: usize, out: &mut [f32]) {
        self.with_mat(|m| matmul(&m, xs, n, out));
        self.add_bias(out);
    }

    /// Several layers over the same input in one parallel dispatch (same bits as one by one).
    pub fn forward_group<const N: usize>(
        layers: [&Linear; N],
        xs: &[f32],
        n: usize,
        mut outs: [&mut [f32]; N],
    ) {
        let mats = layers.map(Linear::mat);
        {
            let outs: [&mut [f32]; N] = outs.each_mut().map(|o| &mut **o);
            matmul_many(mats.each_ref(), xs, n, outs);
        }
        for (l, out) in layers.iter().zip(outs) {
            l.add_bias(out);
        }
    }

    fn add_bias(&self, out: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(self.rows) {
                for (o, &bi) in row.iter_mut().zip(b) {
                    *o += bi;
                }
            }
        }
    }

    /// `W[r] · x` for one row, in the kernels' fixed reduction order.
    pub fn dot_row(&self, r: usize, x: &[f32]) -> f32 {
        self.mat().dot_row(r, x)
    }

    /// Row `r` of the weight converted to f32 (embedding lookup).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        self.mat().dequant_row(r, out)
    }

    /// [`Linear::row_f32`] that reads a matrix left in the shard mapping (an untied
    /// embedding table: `Transformer::embedding_stays_mapped`) with `pread`, so a shard
    /// truncated since load is an error naming it, never a SIGBUS. The row's bytes go
    /// through a per-thread buffer that grows once.
    pub fn embed_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        if self.view.is_resident() || self.scales.is_some() || self.transposed {
            self.row_f32(r, out);
            return Ok(());
        }
        thread_local! {
            static ROW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let bytes = self.fmt.row_bytes(self.cols);
        ROW.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize(bytes, 0);
            self.view.read_at(r * bytes, &mut buf)?;
            MatRef::new(self.fmt, &buf, 1, self.cols).dequant_row(0, out);
            Ok(())
        })
    }
}

/// Expert `e`'s row of `{name}_bias` `[n_experts, rows]` (gpt-oss keeps its experts'
/// biases fused per layer, whatever the layout of their matrices).
pub fn expert_bias(
    dir: &ModelDir,
    name: &str,
    e: usize,
    n_experts: usize,
    rows: usize,
) -> Result<Vec<f32>> {
    Ok(dir
        .tensor_shaped(&format!("{name}_bias"), &[n_experts, rows])?
        .outer(e)?
        .to_f32_vec()?)
}

/// The dtype of an unquantized fused expert tensor: BF16, F16 or F32, else an error naming
/// it.
fn fused_float_dtype(t: &TensorView, name: &str) -> Result<DType> {
    let dtype = t.dtype()?;
    if !matches!(dtype, DType::BF16 | DType::F16 | DType::F32) {
        return Err(crate::error::ModelError::BadTensor {
            name: name.to_string(),
            msg: format!(
                "fused experts are read as BF16, F16 or F32; found {}",
                t.dtype_name
            ),
        });
    }
    Ok(dtype)
}

/// `src` `[rows, cols]` of `elem`-byte elements, transposed: `[cols, rows]`.
pub(crate) fn transposed_bytes(src: &[u8], rows: usize, cols: usize, elem: usize) -> Vec<u8> {
    let mut dst = vec![0u8; src.len()];
    transpose_into(src, rows, cols, elem, &mut dst);
    dst
}

/// Writes `src` `[rows, cols]` (elements of `elem` bytes) transposed into `dst`
/// `[cols, rows]`, in tiles so that both sides are read and written a cache line at a time.
pub(crate) fn transpose_into(src: &[u8], rows: usize, cols: usize, elem: usize, dst: &mut [u8]) {
    assert!(src.len() == rows * cols * elem && dst.len() == src.len());
    match elem {
        1 => transpose_elems::<1>(src, rows, cols, dst),
        2 => transpose_elems::<2>(src, rows, cols, dst),
        4 => transpose_elems::<4>(src, rows, cols, dst),
        _ => unreachable!("element sizes are 1, 2 or 4 bytes"),
    }
}

/// [`transpose_into`] for elements of `N` bytes, moved whole.
fn transpose_elems<const N: usize>(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) {
    const TILE: usize = 32;
    let (src, dst) = (src.as_chunks::<N>().0, dst.as_chunks_mut::<N>().0);
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * rows + r] = src[r * cols + c];
                }
            }
        }
    }
}

/// Where an FP8 matrix's block scales are: `{name}_scale_inv` (DeepSeek-V3, GLM), else
/// `{stem}.scale` (DeepSeek-V4, as F8_E8M0 powers of two), `stem` being `name` without
/// `.weight`.
fn fp8_scale_name(dir: &ModelDir, name: &str) -> String {
    let inv = format!("{name}_scale_inv");
    match name.strip_suffix(".weight") {
        Some(stem) if !dir.has(&inv) && dir.has(&format!("{stem}.scale")) => {
            format!("{stem}.scale")
        }
        _ => inv,
    }
}

/// Loads a 1-D tensor (norm weights, biases) as f32, checking its length (a GGUF block
/// type is dequantized as gguf-py does).
pub fn load_vector(dir: &ModelDir, name: &str, len: usize) -> Result<Vec<f32>> {
    let view = dir.tensor_shaped(name, &[len])?;
    if let Some(ty) = GgmlType::from_name(&view.dtype_name).filter(|t| t.is_quantized()) {
        let mut out = vec![0.0; len];
        coli_core::gguf::dequantize(ty, &view.read_bytes()?, &mut out).map_err(|msg| {
            crate::error::ModelError::BadTensor {
                name: name.to_string(),
                msg,
            }
        })?;
        return Ok(out);
    }
    Ok(view.to_f32_vec()?)
}

/// Loads a tensor view with a checked shape.
pub fn load_view(dir: &ModelDir, name: &str, shape: &[usize]) -> Result<TensorView> {
    Ok(dir.tensor_shaped(name, shape)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element `(r, c)` of `[rows, cols]` lands at `(c, r)`, for every element size and
    /// shapes that are and are not whole tiles.
    #[test]
    fn transposition_moves_each_element_to_its_mirror() {
        for elem in [1, 2, 4] {
            for (rows, cols) in [(1, 1), (3, 70), (64, 32), (33, 65)] {
                let src: Vec<u8> = (0..rows * cols * elem)
                    .map(|i| (i * 7 % 251) as u8)
                    .collect();
                let dst = transposed_bytes(&src, rows, cols, elem);
                for r in 0..rows {
                    for c in 0..cols {
                        let a = &src[(r * cols + c) * elem..][..elem];
                        let b = &dst[(c * rows + r) * elem..][..elem];
                        assert_eq!(a, b, "elem {elem}, {rows}x{cols} at ({r}, {c})");
                    }
                }
                assert_eq!(transposed_bytes(&dst, cols, rows, elem), src);
            }
        }
    }
}
