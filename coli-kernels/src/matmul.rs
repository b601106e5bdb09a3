//! Weight matrix × activations, parallel over output rows.
//!
//! Tiling is over rows (4 at a time share the activation loads) and tokens;
//! the inner sum of every output is exactly [`crate::dot::dot_scalar`]'s order,
//! so a batch of tokens gives the same bits as the tokens one at a time, and the
//! thread count never changes a result.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::cpu::{self, Isa};
use crate::dot::{bytemuck_f32, dot_block, dot_rows, dot_rows_prefetch, WFormat};
use crate::fast;
use crate::qdot;

/// Scales of a block-quantized matrix: element `(r, c)` is its stored value times
/// `scales[(r / block_rows) * col_blocks + c / block_cols]`, `col_blocks = ceil(cols /
/// block_cols)`; edge blocks may be partial. FP8 checkpoints use 128 x 128 blocks
/// (`weight_scale_inv`); per-row and per-group scales are the same with `block_rows = 1`.
#[derive(Clone, Copy, Debug)]
pub struct BlockScales<'a> {
    /// One scale per block, row-major over the block grid.
    pub scales: ScaleData<'a>,
    /// Rows per block.
    pub block_rows: usize,
    /// Columns per block.
    pub block_cols: usize,
}

/// How block scales are stored.
#[derive(Clone, Copy, Debug)]
pub enum ScaleData<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// E8M0 exponents (OCP MX): byte `s` is `2^(s - 127)`, 255 is NaN. A quarter of the
    /// memory of f32 for the 1 x 32 blocks of MXFP4; converted exactly as rows are read.
    E8M0(&'a [u8]),
}

impl<'a> ScaleData<'a> {
    /// Number of scales.
    pub fn len(&self) -> usize {
        match self {
            ScaleData::F32(v) => v.len(),
            ScaleData::E8M0(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Scales `start..start + out.len()` as f32.
    pub fn copy_f32(&self, start: usize, out: &mut [f32]) {
        match self {
            ScaleData::F32(v) => out.copy_from_slice(&v[start..start + out.len()]),
            ScaleData::E8M0(v) => {
                let n = out.len();
                for (o, &b) in out.iter_mut().zip(&v[start..start + n]) {
                    *o = e8m0_to_f32(b);
                }
            }
        }
    }
}

impl<'a> From<&'a [f32]> for ScaleData<'a> {
    fn from(v: &'a [f32]) -> ScaleData<'a> {
        ScaleData::F32(v)
    }
}

impl<'a> From<&'a Vec<f32>> for ScaleData<'a> {
    fn from(v: &'a Vec<f32>) -> ScaleData<'a> {
        ScaleData::F32(v)
    }
}

/// An E8M0 byte as f32: `2^(b - 127)` exactly (b = 0 is the subnormal 2^-127), 255 NaN.
#[inline]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        255 => f32::NAN,
        0 => f32::from_bits(1 << 22),
        b => f32::from_bits((b as u32) << 23),
    }
}

thread_local! {
    /// Rows dequantized for the f32 kernels; grows once per thread, then reused.
    static DEQUANT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Compact (E8M0) scales widened to f32 for the rows being computed.
    static SCALES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on the scales of block rows `first..first + n` (all their column blocks,
/// `cb` each) as f32: borrowed when stored as f32, widened into this thread's buffer
/// otherwise.
fn with_scale_rows<T>(
    s: &BlockScales,
    cb: usize,
    first: usize,
    n: usize,
    f: impl FnOnce(&[f32]) -> T,
) -> T {
    match s.scales {
        ScaleData::F32(v) => f(&v[first * cb..(first + n) * cb]),
        compact => SCALES.with(|buf| {
            let mut buf = buf.borrow_mut();
            if buf.len() < n * cb {
                buf.resize(n * cb, 0.0);
            }
            compact.copy_f32(first * cb, &mut buf[..n * cb]);
            f(&buf[..n * cb])
        }),
    }
}

/// Runs `f` on this thread's dequantization buffer, at least `len` long.
fn with_dequant_buf<T>(len: usize, f: impl FnOnce(&mut [f32]) -> T) -> T {
    DEQUANT.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        f(&mut buf[..len])
    })
}

/// A row-major weight matrix `[rows, cols]` in its stored format.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    /// Element format.
    pub fmt: WFormat,
    /// `rows * fmt.row_bytes(cols)` little-endian bytes.
    pub bytes: &'a [u8],
    /// Output dimension.
    pub rows: usize,
    /// Input dimension.
    pub cols: usize,
    /// Block scales, for quantized formats.
    pub scales: Option<BlockScales<'a>>,
}

impl<'a> MatRef<'a> {
    /// Wraps bytes, checking the size.
    pub fn new(fmt: WFormat, bytes: &'a [u8], rows: usize, cols: usize) -> MatRef<'a> {
        assert_eq!(
            bytes.len(),
            rows * fmt.row_bytes(cols),
            "MatRef: {rows}x{cols} {fmt:?} vs {} bytes",
            bytes.len()
        );
        MatRef {
            fmt,
            bytes,
            rows,
            cols,
            scales: None,
        }
    }

    /// Attaches block scales, checking that they cover the block grid.
    pub fn with_scales(mut self, s: BlockScales<'a>) -> MatRef<'a> {
        assert!(s.block_rows > 0 && s.block_cols > 0, "empty scale block");
        assert_eq!(
            s.scales.len(),
            self.rows.div_ceil(s.block_rows) * self.cols.div_ceil(s.block_cols),
            "scales do not cover a {}x{} matrix in {}x{} blocks",
            self.rows,
            self.cols,
            s.block_rows,
            s.block_cols
        );
        self.scales = Some(s);
        self
    }

    /// Row `r` as f32: each stored element converted exactly, then (if scaled) multiplied by
    /// its block's scale in one f32 multiplication. This is the definition every kernel of a
    /// scaled format reproduces.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols);
        let row = self.row(r);
        match self.scales {
            None => self.fmt.load_row(row, out),
            Some(s) => {
                let cb = self.cols.div_ceil(s.block_cols);
                with_scale_rows(&s, cb, r / s.block_rows, 1, |scales| {
                    crate::dequant::dequant_scaled(self.fmt, row, scales, s.block_cols, out)
                });
            }
        }
    }

    /// `row(r) · x` in the fixed reduction order (scaled formats: of the dequantized row).
    pub fn dot_row(&self, r: usize, x: &[f32]) -> f32 {
        let Some(s) = self.scales else {
            return crate::dot::dot(self.fmt, self.row(r), x);
        };
        if qdot::fused_layout(self.fmt, s.block_cols, self.cols) {
            let cb = self.cols.div_ceil(s.block_cols);
            let (isa, row) = (cpu::best(), self.row(r));
            return with_scale_rows(&s, cb, r / s.block_rows, 1, |scales| {
                qdot::dot_rows_scaled(isa, self.fmt, [row], [scales], s.block_cols, x, &[])[0]
            });
        }
        with_dequant_buf(self.cols, |row| {
            self.dequant_row(r, row);
            crate::dot::dot(WFormat::F32, bytemuck_f32(row), x)
        })
    }

    /// Row `r`'s bytes.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        let w = self.fmt.row_bytes(self.cols);
        &self.bytes[r * w..(r + 1) * w]
    }
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a disjoint set of output elements (its own rows).
unsafe impl Send for OutPtr {}
// SAFETY: as above; the pointer is only used to write disjoint elements.
unsafe impl Sync for OutPtr {}

/// Computes rows `r0..r1` of `out[t * m.rows + r] = m.row(r) · xs[t]` for every token `t`.
fn rows_block(isa: Isa, m: &MatRef, xs: &[f32], n_tok: usize, r0: usize, r1: usize, out: OutPtr) {
    if m.fmt.is_block() {
        if !rows_block_ggml_fused(isa, m, xs, n_tok, r0, r1, out) {
            rows_block_dequantized(isa, m, xs, n_tok, r0, r1, out);
        }
    } else if m.scales.is_some() {
        rows_block_scaled(isa, m, xs, n_tok, r0, r1, out);
    } else {
        let out = StridedOut {
            ptr: out,
            stride: m.rows,
        };
        rows_block_strided(isa, m, xs, n_tok, r0..r1, out);
    }
}

/// Tokens up to which a scaled matrix runs the fused kernels, token by token; past this
/// many, dequantizing four rows once and sharing them across the tokens costs less
/// (`cargo bench -p coli-kernels --bench matvec -- scaled_tokens`, µs for a 1024 x 2048
/// expert matrix, one core). AVX-512 on Zen 5: int8 3 tokens 128 fused against 138, 4
/// tokens 171 against 143; int4 3 tokens 168 against 253, 6 tokens 318 against 258.
/// AVX2 on Zen 2: int8 2 tokens 291 against 423, 3 tokens 421 against 394; int4 2
/// tokens 482 against 558, 3 tokens 693 against 582. Either path gives the same bits.
fn fused_max_tokens(isa: Isa) -> usize {
    match isa {
        Isa::Avx2 => 2,
        _ => 3,
    }
}

/// Scaled formats. Few tokens (decode): the fused kernels of [`crate::qdot`], four rows at
/// a time. Many tokens (prefill), or a block layout the fused loop cannot take: rows
/// dequantized to f32 ([`rows_block_dequantized`]), then the f32 kernels. Either way each
/// output is the dequantized row's dot product in the fixed order.
fn rows_block_scaled(
    isa: Isa,
    m: &MatRef,
    xs: &[f32],
    n_tok: usize,
    r0: usize,
    r1: usize,
    out: OutPtr,
) {
    let k = m.cols;
    let s = m.scales.expect("scaled matrix");
    if r0 >= r1 {
        return;
    }
    if n_tok <= fused_max_tokens(isa) && qdot::fused_layout(m.fmt, s.block_cols, k) {
        let cb = k.div_ceil(s.block_cols);
        // The scales of this task's block rows, as f32.
        let first = r0 / s.block_rows;
        let n_blocks = (r1 - 1) / s.block_rows + 1 - first;
        with_scale_rows(&s, cb, first, n_blocks, |all| {
            rows_block_fused(isa, m, &s, xs, n_tok, r0, r1, out, |r: usize| {
                &all[(r / s.block_rows - first) * cb..][..cb]
            })
        });
        return;
    }
    rows_block_dequantized(isa, m, xs, n_tok, r0, r1, out)
}

/// GGUF block rows for few tokens (decode): each row's blocks decoded in registers by
/// [`crate::ggml_dot`], shared by the tokens. `false` (nothing written) when the type, the
/// ISA or the token count has no fused path; the dequantizing path gives the same bits.
fn rows_block_ggml_fused(
    isa: Isa,
    m: &MatRef,
    xs: &[f32],
    n_tok: usize,
    r0: usize,
    r1: usize,
    out: OutPtr,
) -> bool {
    let WFormat::Ggml(ty) = m.fmt else {
        return false;
    };
    if !crate::ggml_dot::fused(ty) || n_tok == 0 || n_tok > 3 || isa == Isa::Scalar {
        return false;
    }
    match n_tok {
        1 => ggml_fused_rows::<1>(isa, ty, m, xs, r0, r1, out),
        2 => ggml_fused_rows::<2>(isa, ty, m, xs, r0, r1, out),
        _ => ggml_fused_rows::<3>(isa, ty, m, xs, r0, r1, out),
    }
}

fn ggml_fused_rows<const T: usize>(
    isa: Isa,
    ty: coli_core::gguf::GgmlType,
    m: &MatRef,
    xs: &[f32],
    r0: usize,
    r1: usize,
    out: OutPtr,
) -> bool {
    let k = m.cols;
    let x: [&[f32]; T] = std::array::from_fn(|t| &xs[t * k..(t + 1) * k]);
    let mut r0 = r0;
    if T == 1 {
        // One token: four rows at a time (four accumulator chains, the same bits each).
        while r0 + 4 <= r1 {
            let rows = std::array::from_fn(|j| m.row(r0 + j));
            // The next four rows, prefetched while these are computed.
            let w = ty.row_bytes(k);
            let next = &m.bytes[((r0 + 4) * w).min(r1 * w)..((r0 + 8) * w).min(r1 * w)];
            let Some(got) = crate::ggml_dot::dot_rows::<4>(isa, ty, rows, x[0], next) else {
                return false;
            };
            for (j, v) in got.into_iter().enumerate() {
                // SAFETY: r0 + j < r1 <= m.rows: inside `out`; the task owns rows r0..r1.
                unsafe { *out.0.add(r0 + j) = v };
            }
            r0 += 4;
        }
    }
    for r in r0..r1 {
        let Some(got) = crate::ggml_dot::dot_tokens(isa, ty, m.row(r), x) else {
            // The same type and ISA for every row: only the first can fail, nothing written.
            return false;
        };
        for (t, v) in got.into_iter().enumerate() {
            // SAFETY: t < T = n_tok and r < m.rows: inside `out` (n_tok * m.rows elements);
            // the task owns rows r0..r1.
            unsafe { *out.0.add(t * m.rows + r) = v };
        }
    }
    true
}

/// Rows `r0..r1` dequantized to f32, then the f32 kernels: each output is the dequantized
/// row's dot product in the fixed order. Six tokens or more (prefill) take the panel path
/// (`matmul/panel.rs`: a panel of rows once, the tokens in k-blocks from L1); fewer, four
/// rows at a time (per-thread buffer) through [`rows_block_strided`].
fn rows_block_dequantized(
    isa: Isa,
    m: &MatRef,
    xs: &[f32],
    n_tok: usize,
    r0: usize,
    r1: usize,
    out: OutPtr,
) {
    let k = m.cols;
    if panel::applies(isa, k, n_tok) {
        return panel::rows_panel(isa, m, xs, n_tok, r0, r1, out);
    }
    with_dequant_buf(4 * k, |buf| {
        let mut r = r0;
        while r < r1 {
            let nr = (r1 - r).min(4);
            for (j, row) in buf[..nr * k].chunks_mut(k).enumerate() {
                m.dequant_row(r + j, row);
            }
            let sub = MatRef::new(WFormat::F32, bytemuck_f32(&buf[..nr * k]), nr, k);
            // SAFETY: row r < m.rows lies inside `out`; the sub-block writes rows r..r + nr.
            let shifted = OutPtr(unsafe { out.0.add(r) });
            let out = StridedOut {
                ptr: shifted,
                stride: m.rows,
            };
            rows_block_strided(isa, &sub, xs, n_tok, 0..nr, out);
            r += nr;
        }
    })
}

/// The fused decode loop over rows `r0..r1`, four rows at a time; `scales(r)` is row `r`'s
/// scales as f32.
#[allow(clippy::too_many_arguments)]
fn rows_block_fused<'s>(
    isa: Isa,
    m: &MatRef,
    s: &BlockScales,
    xs: &[f32],
    n_tok: usize,
    r0: usize,
    r1: usize,
    out: OutPtr,
    scales: impl Fn(usize) -> &'s [f32],
) {
    let k = m.cols;
    let x = |t: usize| &xs[t * k..(t + 1) * k];
    let put = |t: usize, r: usize, v: f32| {
        // SAFETY: t < n_tok and r < m.rows, inside `out`; rows r0..r1 belong to this task.
        unsafe { *out.0.add(t * m.rows + r) = v };
    };
    let rest = row_quads(m, r0, r1, |r, rows, next| {
        let sc = [scales(r), scales(r + 1), scales(r + 2), scales(r + 3)];
        for t in 0..n_tok {
            let v = qdot::dot_rows_scaled(isa, m.fmt, rows, sc, s.block_cols, x(t), next);
            for (j, &val) in v.iter().enumerate() {
                put(t, r + j, val);
            }
        }
    });
    for r in rest..r1 {
        for t in 0..n_tok {
            let v =
                qdot::dot_rows_scaled(isa, m.fmt, [m.row(r)], [scales(r)], s.block_cols, x(t), &[]);
            put(t, r, v[0]);
        }
    }
}

/// Rows `r0..r1` of `m` four at a time: `f(r, rows r..r + 4, next)`, `next` the bytes of
/// the four rows after them (within `r1`), to prefetch while these are computed. Returns
/// the first row left over (fewer than four).
fn row_quads<'a>(
    m: &MatRef<'a>,
    r0: usize,
    r1: usize,
    mut f: impl FnMut(usize, [&'a [u8]; 4], &'a [u8]),
) -> usize {
    let w = m.fmt.row_bytes(m.cols);
    let mut r = r0;
    while r + 4 <= r1 {
        let rows = [m.row(r), m.row(r + 1), m.row(r + 2), m.row(r + 3)];
        f(
            r,
            rows,
            &m.bytes[((r + 4) * w).min(r1 * w)..((r + 8) * w).min(r1 * w)],
        );
        r += 4;
    }
    r
}

/// Where a row block writes: token `t`'s output `r` at `ptr[t * stride + r]`.
#[derive(Clone, Copy)]
struct StridedOut {
    ptr: OutPtr,
    stride: usize,
}

/// [`rows_block`] for an unscaled matrix: rows `rows` of every token, into `out`.
fn rows_block_strided(
    isa: Isa,
    m: &MatRef,
    xs: &[f32],
    n_tok: usize,
    rows: std::ops::Range<usize>,
    out: StridedOut,
) {
    let (r0, r1) = (rows.start, rows.end);
    let StridedOut { ptr: out, stride } = out;
    let k = m.cols;
    let x = |t: usize| &xs[t * k..(t + 1) * k];
    let put = |t: usize, r: usize, v: f32| {
        // SAFETY: t < n_tok and r < the output's rows, inside `out`; these rows belong to
        // this task only.
        unsafe { *out.0.add(t * stride + r) = v };
    };
    // Tokens in tiles whose activations stay in L2 (about 96 KiB) while every row of the
    // range passes over them; each output's reduction is the same whatever the tiling.
    let tile = (96 * 1024 / (4 * k).max(1)).clamp(12, 96) / 12 * 12;
    // Within a tile, rows in panels of about 256 KiB (in L2 beside the tile), and each
    // group of tokens (in L1) passes over every four-row block of the panel: per block,
    // four rows come from L2, not the group's activations (6 tokens of them with AVX-512).
    let w = m.fmt.row_bytes(k);
    let quads_end = r0 + (r1 - r0) / 4 * 4;
    let panel = (256 * 1024 / (4 * w).max(1)).max(1) * 4;
    let quad = |r: usize| [m.row(r), m.row(r + 1), m.row(r + 2), m.row(r + 3)];
    let mut t0 = 0;
    while t0 < n_tok {
        let t1 = (t0 + tile).min(n_tok);
        let mut p0 = r0;
        while p0 < quads_end {
            let p1 = (p0 + panel).min(quads_end);
            let blocks = (p0..p1).step_by(4);
            // Tokens in groups share each converted weight chunk (prefill); register budget:
            // 4 rows x 6 tokens of 16-lane accumulators with AVX-512 (24 of 32 registers; 4 x
            // 4 for four left over), 2 x 3 with AVX2 (4 x 2 for two tokens left over).
            let mut t = t0;
            if isa == Isa::Avx2 {
                // Two rows x three tokens: 12 accumulators, 2 weights and 1 activation fill the
                // 16 registers without spilling (4 x 2 needed 26).
                while t + 3 <= t1 {
                    for r in blocks.clone() {
                        let rows = quad(r);
                        for h in [0, 2] {
                            let pair = [rows[h], rows[h + 1]];
                            let v = dot_block(isa, m.fmt, pair, [x(t), x(t + 1), x(t + 2)]);
                            for (dt, row) in v.iter().enumerate() {
                                for (j, &val) in row.iter().enumerate() {
                                    put(t + dt, r + h + j, val);
                                }
                            }
                        }
                    }
                    t += 3;
                }
            }
            if isa == Isa::Avx512 {
                while t + 6 <= t1 {
                    let xs6 = [x(t), x(t + 1), x(t + 2), x(t + 3), x(t + 4), x(t + 5)];
                    for r in blocks.clone() {
                        let v = dot_block(isa, m.fmt, quad(r), xs6);
                        for (dt, row) in v.iter().enumerate() {
                            for (j, &val) in row.iter().enumerate() {
                                put(t + dt, r + j, val);
                            }
                        }
                    }
                    t += 6;
                }
                while t + 4 <= t1 {
                    for r in blocks.clone() {
                        let v =
                            dot_block(isa, m.fmt, quad(r), [x(t), x(t + 1), x(t + 2), x(t + 3)]);
                        for (dt, row) in v.iter().enumerate() {
                            for (j, &val) in row.iter().enumerate() {
                                put(t + dt, r + j, val);
                            }
                        }
                    }
                    t += 4;
                }
            }
            while t + 2 <= t1 {
                for r in blocks.clone() {
                    let v = dot_block(isa, m.fmt, quad(r), [x(t), x(t + 1)]);
                    for (dt, row) in v.iter().enumerate() {
                        for (j, &val) in row.iter().enumerate() {
                            put(t + dt, r + j, val);
                        }
                    }
                }
                t += 2;
            }
            while t < t1 {
                for r in blocks.clone() {
                    // The next block of rows, prefetched while these are computed (the decode
                    // path).
                    let next = &m.bytes[((r + 4) * w).min(r1 * w)..((r + 8) * w).min(r1 * w)];
                    let v = dot_rows_prefetch(isa, m.fmt, quad(r), x(t), next);
                    for (j, &val) in v.iter().enumerate() {
                        put(t, r + j, val);
                    }
                }
                t += 1;
            }
            p0 = p1;
        }
        for r in quads_end..r1 {
            let row = [m.row(r)];
            for t in t0..t1 {
                put(t, r, dot_rows(isa, m.fmt, row, x(t))[0]);
            }
        }
        t0 = t1;
    }
}

fn check(m: &MatRef, xs: &[f32], n_tok: usize, out: &[f32]) {
    assert_eq!(
        xs.len(),
        n_tok * m.cols,
        "matmul: activations are not n_tok x cols"
    );
    assert_eq!(
        out.len(),
        n_tok * m.rows,
        "matmul: output is not n_tok x rows"
    );
}

/// `out[t, r] = m[r] · xs[t]` for `n_tok` tokens (`xs` is `[n_tok, cols]`, `out` `[n_tok, rows]`),
/// parallel over rows on the current rayon pool, on the given instruction set.
pub fn matmul_isa(isa: Isa, m: &MatRef, xs: &[f32], n_tok: usize, out: &mut [f32]) {
    matmul_many_isa(isa, [m], xs, n_tok, [out]);
}

/// Several matrices applied to the same activations (q/k/v, gate/up) in one parallel
/// dispatch: `outs[j][t, r] = mats[j][r] · xs[t]`. Each output is computed exactly as
/// [`matmul_isa`] computes it alone; only the scheduling is shared.
pub fn matmul_many_isa<const N: usize>(
    isa: Isa,
    mats: [&MatRef; N],
    xs: &[f32],
    n_tok: usize,
    outs: [&mut [f32]; N],
) {
    for (m, out) in mats.iter().zip(outs.iter()) {
        check(m, xs, n_tok, out);
    }
    let ptrs = outs.map(|o| OutPtr(o.as_mut_ptr()));
    for_row_blocks(mats.map(|m| m.rows), |j, r0, r1| {
        rows_block(isa, mats[j], xs, n_tok, r0, r1, ptrs[j])
    });
}

/// Runs `f(j, r0, r1)` over blocks of rows `r0..r1` of matrices `j` with `rows[j]` rows,
/// in parallel on the current rayon pool: enough blocks to balance, each at least 16 rows
/// and a multiple of 4 (serially when one thread or one block).
fn for_row_blocks<const N: usize>(rows: [usize; N], f: impl Fn(usize, usize, usize) + Sync) {
    let threads = rayon::current_num_threads();
    let total_rows: usize = rows.iter().sum();
    let block = total_rows.div_ceil(threads * 8).max(16).next_multiple_of(4);
    if threads == 1 || total_rows <= block {
        for (j, &n) in rows.iter().enumerate() {
            f(j, 0, n);
        }
        return;
    }
    let blocks = rows.map(|n| n.div_ceil(block));
    let n_blocks: usize = blocks.iter().sum();
    (0..n_blocks).into_par_iter().for_each(|mut b| {
        let mut j = 0;
        while b >= blocks[j] {
            b -= blocks[j];
            j += 1;
        }
        let r0 = b * block;
        f(j, r0, (r0 + block).min(rows[j]));
    });
}

/// [`matmul_many_isa`] on the best instruction set; with the process's fast mode on
/// ([`fast::set_int8_activations`]), [`matmul_many_int8_acts`] where it applies.
pub fn matmul_many<const N: usize>(
    mats: [&MatRef; N],
    xs: &[f32],
    n_tok: usize,
    mut outs: [&mut [f32]; N],
) {
    if fast::int8_activations() {
        let reborrowed = outs.each_mut().map(|o| &mut **o);
        if matmul_many_int8_acts(mats, xs, n_tok, reborrowed) {
            return;
        }
    }
    matmul_many_isa(cpu::best(), mats, xs, n_tok, outs)
}

/// [`matmul_isa`] on the best instruction set (the fast mode as [`matmul_many`]).
pub fn matmul(m: &MatRef, xs: &[f32], n_tok: usize, out: &mut [f32]) {
    matmul_many([m], xs, n_tok, [out])
}

/// The plain reference: one row, one token at a time, scalar, serial.
pub fn matmul_reference(m: &MatRef, xs: &[f32], n_tok: usize, out: &mut [f32]) {
    check(m, xs, n_tok, out);
    let mut row = vec![0.0f32; m.cols];
    for t in 0..n_tok {
        for r in 0..m.rows {
            let x = &xs[t * m.cols..(t + 1) * m.cols];
            out[t * m.rows + r] = match m.scales {
                None => crate::dot::dot_scalar(m.fmt, m.row(r), x),
                Some(_) => {
                    m.dequant_row(r, &mut row);
                    crate::dot::dot_scalar(WFormat::F32, bytemuck_f32(&row), x)
                }
            };
        }
    }
}

mod int8_acts;
mod panel;
pub use int8_acts::matmul_many_int8_acts;

#[cfg(test)]
mod tests;
