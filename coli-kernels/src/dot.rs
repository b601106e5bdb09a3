//! Dot products of a stored weight row with an f32 activation vector.
//!
//! The reduction order is fixed and independent of the instruction set: element
//! `i` is accumulated into lane `i % 16` with a fused multiply-add, in increasing
//! `i`; the 16 lanes are then summed by a fixed halving tree (lane l += lane l+8,
//! then l+4, l+2, l+1). The scalar reference below is that definition; the AVX2
//! and AVX-512 paths compute exactly the same operations and are tested against
//! it bit for bit. Several rows may be processed together (sharing the activation
//! loads) without changing any row's order.

use coli_core::gguf::GgmlType;

use crate::cpu::Isa;

/// Accumulator lanes of every dot product.
pub const LANES: usize = 16;

/// Storage format of a weight row. Every format converts to f32 exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WFormat {
    /// Little-endian f32.
    F32,
    /// Little-endian bfloat16.
    BF16,
    /// Little-endian IEEE half.
    F16,
    /// `float8_e4m3fn`, one byte per element. Block-scaled in checkpoints: matrices of this
    /// format carry [`crate::matmul::BlockScales`] and are dequantized row by row before the
    /// f32 dot product (see [`crate::matmul`]).
    F8E4M3,
    /// Signed 8-bit integers (coli containers: one f32 scale per row).
    I8,
    /// Signed 4-bit integers stored as `q + 8` in nibbles, even column in the low nibble
    /// (coli containers: one f32 scale per 64 columns of a row).
    I4,
    /// OCP MX FP4 (`e2m1`: sign, 2 exponent bits, 1 mantissa bit) stored two per byte,
    /// even column in the low nibble (gpt-oss' MXFP4 `_blocks`, DeepSeek-V4's FP4 experts;
    /// scaled per 32 columns).
    F4E2M1,
    /// A ggml block type read in place from a GGUF file: each row is whole blocks that
    /// carry their own scales. Element `i` is its block's value as
    /// [`coli_core::gguf::quants`] (gguf-py's definition) decodes it; the dot product is
    /// that row's in the fixed order above.
    Ggml(GgmlType),
}

/// The 16 `e2m1` values, by nibble.
pub const FP4_E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

impl WFormat {
    /// Bytes per element (packed formats: per byte-aligned element, 1).
    pub fn size(self) -> usize {
        match self {
            WFormat::F32 => 4,
            WFormat::BF16 | WFormat::F16 => 2,
            WFormat::F8E4M3 | WFormat::I8 | WFormat::I4 | WFormat::F4E2M1 => 1,
            WFormat::Ggml(t) => t.block().1.div_ceil(t.block().0),
        }
    }

    /// Bytes of a row of `cols` elements.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            WFormat::I4 | WFormat::F4E2M1 => cols.div_ceil(2),
            WFormat::Ggml(t) => t.row_bytes(cols),
            f => cols * f.size(),
        }
    }

    /// Formats the vector kernels read directly; the others are dequantized to f32 rows
    /// first (the scalar definition, the same bits).
    pub fn has_vector_path(self) -> bool {
        matches!(self, WFormat::F32 | WFormat::BF16 | WFormat::F16)
    }

    /// Element `i` of a row, as f32 (exact).
    #[inline(always)]
    pub fn load(self, row: &[u8], i: usize) -> f32 {
        match self {
            WFormat::F32 => {
                f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
            }
            WFormat::BF16 => {
                f32::from_bits((u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) as u32) << 16)
            }
            WFormat::F16 => {
                half::f16::from_bits(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])).to_f32()
            }
            WFormat::F8E4M3 => coli_core::FP8_E4M3_TABLE[row[i] as usize],
            WFormat::I8 => row[i] as i8 as f32,
            WFormat::I4 => {
                let b = row[i / 2];
                let nib = if i.is_multiple_of(2) { b & 15 } else { b >> 4 };
                (nib as i32 - 8) as f32
            }
            WFormat::F4E2M1 => {
                let b = row[i / 2];
                FP4_E2M1_VALUES[if i.is_multiple_of(2) { b & 15 } else { b >> 4 } as usize]
            }
            WFormat::Ggml(t) => {
                let (bs, bb) = t.block();
                let mut block = [0.0f32; 256];
                coli_core::gguf::quants::dequantize_block(t, &row[i / bs * bb..][..bb], &mut block);
                block[i % bs]
            }
        }
    }

    /// Whether rows are whole blocks that carry their own scales (GGUF): a row is only
    /// ever a whole number of blocks long, and is decoded a block at a time.
    pub fn is_block(self) -> bool {
        matches!(self, WFormat::Ggml(t) if t.is_quantized())
    }

    /// A whole row as f32 (`out.len()` elements): each element exactly as [`WFormat::load`]
    /// gives it, block formats decoded a block at a time.
    pub fn load_row(self, row: &[u8], out: &mut [f32]) {
        if let WFormat::Ggml(t) = self {
            // The fused types decode in registers (the same bits), the others by the
            // reference decoder.
            if !crate::ggml_dot::dequant_row(crate::cpu::best(), t, row, out) {
                coli_core::gguf::dequantize(t, row, out).expect("a row of whole blocks");
            }
            return;
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.load(row, i);
        }
    }
}

/// Sums the 16 lanes with the fixed halving tree.
#[inline(always)]
pub fn reduce_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// Accumulates the elements from `start` on (the tail a vector loop left) into their lanes.
#[inline(always)]
fn tail(fmt: WFormat, row: &[u8], x: &[f32], start: usize, acc: &mut [f32; LANES]) {
    for (i, &xi) in x.iter().enumerate().skip(start) {
        acc[i % LANES] = fmt.load(row, i).mul_add(xi, acc[i % LANES]);
    }
}

/// The reference: the definition of the reduction order, one row.
pub fn dot_scalar(fmt: WFormat, row: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(row.len(), fmt.row_bytes(x.len()));
    let mut acc = [0.0f32; LANES];
    if fmt.is_block() {
        // The same chain over the row's values, decoded a block at a time rather than
        // one element at a time.
        let mut values = vec![0.0f32; x.len()];
        let WFormat::Ggml(t) = fmt else {
            unreachable!("block formats are ggml types")
        };
        coli_core::gguf::dequantize(t, row, &mut values).expect("a row of whole blocks");
        tail(WFormat::F32, bytemuck_f32(&values), x, 0, &mut acc);
        return reduce_lanes(acc);
    }
    tail(fmt, row, x, 0, &mut acc);
    reduce_lanes(acc)
}

/// Dot products of `R` rows with the same `x`, on the given instruction set.
///
/// # Panics
/// If a row's length does not match `x`, or `isa` is not available on this CPU.
#[inline]
pub fn dot_rows<const R: usize>(isa: Isa, fmt: WFormat, rows: [&[u8]; R], x: &[f32]) -> [f32; R] {
    dot_rows_prefetch(isa, fmt, rows, x, &[])
}

/// [`dot_rows`], also prefetching `next` (the bytes the caller reads after these rows) into
/// cache while computing: rows are short streams that the hardware prefetcher picks up too
/// late. A hint only; it never changes a result.
#[inline]
pub fn dot_rows_prefetch<const R: usize>(
    isa: Isa,
    fmt: WFormat,
    rows: [&[u8]; R],
    x: &[f32],
    next: &[u8],
) -> [f32; R] {
    for r in rows {
        assert_eq!(
            r.len(),
            fmt.row_bytes(x.len()),
            "dot: row bytes do not match the activation length"
        );
    }
    if !fmt.has_vector_path() {
        // GGUF blocks of a fused type decode in registers (the same bits); other quantized
        // matrices are dequantized to f32 rows by the matmul, and a bare quantized dot
        // takes the reference path (same bits by definition).
        if let WFormat::Ggml(ty) = fmt {
            return rows.map(|r| {
                crate::ggml_dot::dot_tokens(isa, ty, r, [x])
                    .map_or_else(|| dot_scalar(fmt, r, x), |v| v[0])
            });
        }
        return rows.map(|r| dot_scalar(fmt, r, x));
    }
    match isa {
        Isa::Scalar => rows.map(|r| dot_scalar(fmt, r, x)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(crate::cpu::supports(Isa::Avx2));
            // SAFETY: the CPU supports AVX2+FMA+F16C (checked above, cached by std); row lengths checked.
            unsafe { x86::dot_rows_avx2(fmt, rows, x, next) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(crate::cpu::supports(Isa::Avx512));
            // SAFETY: the CPU supports AVX-512F and the AVX2 set (checked above); row lengths checked.
            unsafe { x86::dot_rows_avx512(fmt, rows, x, next) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => rows.map(|r| dot_scalar(fmt, r, x)),
    }
}

/// Dot products of `R` rows with each of `T` activation vectors: `out[t][r] = rows[r] · xs[t]`.
/// Each weight chunk is loaded and converted once for all `T` tokens (the prefill path);
/// every output is still accumulated in the one fixed order, so it equals [`dot_scalar`].
#[inline]
pub fn dot_block<const R: usize, const T: usize>(
    isa: Isa,
    fmt: WFormat,
    rows: [&[u8]; R],
    xs: [&[f32]; T],
) -> [[f32; R]; T] {
    let k = xs.first().map_or(0, |x| x.len());
    for x in xs {
        assert_eq!(x.len(), k, "dot_block: activations of different lengths");
    }
    for r in rows {
        assert_eq!(
            r.len(),
            fmt.row_bytes(k),
            "dot: row bytes do not match the activation length"
        );
    }
    if !fmt.has_vector_path() {
        return xs.map(|x| rows.map(|r| dot_scalar(fmt, r, x)));
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(crate::cpu::supports(Isa::Avx2));
            // SAFETY: the CPU supports AVX2+FMA+F16C (checked above); all lengths checked.
            unsafe { x86::dot_block_avx2(fmt, rows, xs) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(crate::cpu::supports(Isa::Avx512));
            // SAFETY: the CPU supports AVX-512F and the AVX2 set (checked above); all lengths checked.
            unsafe { x86::dot_block_avx512(fmt, rows, xs) }
        }
        _ => xs.map(|x| rows.map(|r| dot_scalar(fmt, r, x))),
    }
}

/// One dot product on the best instruction set.
pub fn dot(fmt: WFormat, row: &[u8], x: &[f32]) -> f32 {
    dot_rows(crate::cpu::best(), fmt, [row], x)[0]
}

/// f32 · f32 on the best instruction set (attention scores, norms).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot(WFormat::F32, bytemuck_f32(a), b)
}

/// Views f32s as their little-endian bytes (x86_64 and aarch64 are little-endian).
pub fn bytemuck_f32(a: &[f32]) -> &[u8] {
    // SAFETY: any f32 bit pattern is valid bytes; length and lifetime carried over.
    unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), std::mem::size_of_val(a)) }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{reduce_lanes, tail, WFormat, LANES};
    use std::arch::x86_64::*;

    /// Prefetches the `lines` cache lines of `next` that belong to iteration `i / LANES`.
    #[inline(always)]
    pub(crate) unsafe fn prefetch_next(next: &[u8], i: usize, lines: usize) {
        let start = (i / LANES) * lines * 64;
        for l in 0..lines {
            let off = start + l * 64;
            if off < next.len() {
                _mm_prefetch::<_MM_HINT_T0>(next.as_ptr().add(off).cast());
            }
        }
    }

    macro_rules! avx2_loop {
        ($next:expr, $lines:expr, $rows:expr, $x:expr, $main:expr, $acc:expr, $load:expr) => {{
            let xp = $x.as_ptr();
            let mut i = 0;
            while i < $main {
                prefetch_next($next, i, $lines);
                let x0 = _mm256_loadu_ps(xp.add(i));
                let x1 = _mm256_loadu_ps(xp.add(i + 8));
                for r in 0..$rows.len() {
                    let p = $rows[r].as_ptr();
                    let (w0, w1) = $load(p, i);
                    $acc[r].0 = _mm256_fmadd_ps(w0, x0, $acc[r].0);
                    $acc[r].1 = _mm256_fmadd_ps(w1, x1, $acc[r].1);
                }
                i += LANES;
            }
        }};
    }

    /// [`reduce_lanes`] of 16 lanes held as `lo` (lanes 0..8) and `hi` (8..16), in
    /// registers: the same halving tree, so the same bits (IEEE addition commutes), without
    /// the trip through memory. For rows with no tail left.
    #[inline(always)]
    pub(crate) unsafe fn reduce16_avx2(lo: __m256, hi: __m256) -> f32 {
        let v8 = _mm256_add_ps(lo, hi); // l + (l + 8)
        let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
        let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4)); // l + (l + 2), l < 2
        _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2))) // 0 + 1
    }

    /// [`reduce_lanes`] of one AVX-512 accumulator, in registers (the same halving tree as
    /// [`reduce16_avx2`] on its two halves). For rows with no tail left.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(crate) unsafe fn reduce16_avx512(v: __m512) -> f32 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        reduce16_avx2(_mm512_castps512_ps256(v), hi)
    }

    #[inline(always)]
    unsafe fn bf16x8(p: *const u8) -> __m256 {
        let h = _mm_loadu_si128(p.cast());
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_avx2<const R: usize>(
        fmt: WFormat,
        rows: [&[u8]; R],
        x: &[f32],
        next: &[u8],
    ) -> [f32; R] {
        // Each iteration consumes LANES elements of R rows: R * size * LANES / 64 cache lines.
        let lines = (R * fmt.size() * LANES).div_ceil(64);
        let main = x.len() / LANES * LANES;
        let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
        match fmt {
            WFormat::F8E4M3 | WFormat::I8 | WFormat::I4 | WFormat::F4E2M1 | WFormat::Ggml(_) => {
                unreachable!("quantized rows take the scalar path")
            }
            WFormat::F32 => {
                avx2_loop!(next, lines, rows, x, main, acc, |p: *const u8, i: usize| {
                    let p = p.cast::<f32>().add(i);
                    (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                })
            }
            WFormat::BF16 => {
                avx2_loop!(next, lines, rows, x, main, acc, |p: *const u8, i: usize| {
                    let p = p.add(2 * i);
                    (bf16x8(p), bf16x8(p.add(16)))
                })
            }
            WFormat::F16 => {
                avx2_loop!(next, lines, rows, x, main, acc, |p: *const u8, i: usize| {
                    let p = p.add(2 * i);
                    (
                        _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                        _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
                    )
                })
            }
        }
        let mut out = [0.0; R];
        for r in 0..R {
            if main == x.len() {
                out[r] = reduce16_avx2(acc[r].0, acc[r].1);
                continue;
            }
            let mut lanes = [0.0f32; LANES];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r].0);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[r].1);
            tail(fmt, rows[r], x, main, &mut lanes);
            out[r] = reduce_lanes(lanes);
        }
        out
    }

    macro_rules! avx512_loop {
        ($next:expr, $lines:expr, $rows:expr, $x:expr, $main:expr, $acc:expr, $load:expr) => {{
            let xp = $x.as_ptr();
            let mut i = 0;
            while i < $main {
                prefetch_next($next, i, $lines);
                let xv = _mm512_loadu_ps(xp.add(i));
                for r in 0..$rows.len() {
                    let w = $load($rows[r].as_ptr(), i);
                    $acc[r] = _mm512_fmadd_ps(w, xv, $acc[r]);
                }
                i += LANES;
            }
        }};
    }

    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_avx512<const R: usize>(
        fmt: WFormat,
        rows: [&[u8]; R],
        x: &[f32],
        next: &[u8],
    ) -> [f32; R] {
        let lines = (R * fmt.size() * LANES).div_ceil(64);
        let main = x.len() / LANES * LANES;
        let mut acc = [_mm512_setzero_ps(); R];
        match fmt {
            WFormat::F8E4M3 | WFormat::I8 | WFormat::I4 | WFormat::F4E2M1 | WFormat::Ggml(_) => {
                unreachable!("quantized rows take the scalar path")
            }
            WFormat::F32 => {
                avx512_loop!(next, lines, rows, x, main, acc, |p: *const u8, i: usize| {
                    _mm512_loadu_ps(p.cast::<f32>().add(i))
                })
            }
            WFormat::BF16 => {
                avx512_loop!(next, lines, rows, x, main, acc, |p: *const u8, i: usize| {
                    let h = _mm256_loadu_si256(p.add(2 * i).cast());
                    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                })
            }
            WFormat::F16 => {
                avx512_loop!(next, lines, rows, x, main, acc, |p: *const u8, i: usize| {
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i).cast()))
                })
            }
        }
        let mut out = [0.0; R];
        for r in 0..R {
            if main == x.len() {
                out[r] = reduce16_avx512(acc[r]);
                continue;
            }
            let mut lanes = [0.0f32; LANES];
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r]);
            tail(fmt, rows[r], x, main, &mut lanes);
            out[r] = reduce_lanes(lanes);
        }
        out
    }

    /// Loads 16 weights of any format as f32 (AVX-512).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16(fmt: WFormat, p: *const u8, i: usize) -> __m512 {
        match fmt {
            WFormat::F8E4M3 | WFormat::I8 | WFormat::I4 | WFormat::F4E2M1 | WFormat::Ggml(_) => {
                unreachable!("quantized rows take the scalar path")
            }
            WFormat::F32 => _mm512_loadu_ps(p.cast::<f32>().add(i)),
            WFormat::BF16 => {
                let h = _mm256_loadu_si256(p.add(2 * i).cast());
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            }
            WFormat::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i).cast())),
        }
    }

    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dot_block_avx512<const R: usize, const T: usize>(
        fmt: WFormat,
        rows: [&[u8]; R],
        xs: [&[f32]; T],
    ) -> [[f32; R]; T] {
        let k = xs[0].len();
        let main = k / LANES * LANES;
        let mut acc = [[_mm512_setzero_ps(); R]; T];
        let mut i = 0;
        while i < main {
            // A loop, not `rows.map(..)`: a closure here was compiled out of line, without
            // the target features, one call per row and chunk.
            let mut w = [_mm512_setzero_ps(); R];
            for r in 0..R {
                w[r] = load16(fmt, rows[r].as_ptr(), i);
            }
            for t in 0..T {
                let xv = _mm512_loadu_ps(xs[t].as_ptr().add(i));
                for r in 0..R {
                    acc[t][r] = _mm512_fmadd_ps(w[r], xv, acc[t][r]);
                }
            }
            i += LANES;
        }
        let mut out = [[0.0; R]; T];
        for t in 0..T {
            for r in 0..R {
                if main == k {
                    out[t][r] = reduce16_avx512(acc[t][r]);
                    continue;
                }
                let mut lanes = [0.0f32; LANES];
                _mm512_storeu_ps(lanes.as_mut_ptr(), acc[t][r]);
                tail(fmt, rows[r], xs[t], main, &mut lanes);
                out[t][r] = reduce_lanes(lanes);
            }
        }
        out
    }

    /// Eight weights from element `i` as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8(fmt: WFormat, p: *const u8, i: usize) -> __m256 {
        match fmt {
            WFormat::F8E4M3 | WFormat::I8 | WFormat::I4 | WFormat::F4E2M1 | WFormat::Ggml(_) => {
                unreachable!("quantized rows take the scalar path")
            }
            WFormat::F32 => _mm256_loadu_ps(p.cast::<f32>().add(i)),
            WFormat::BF16 => bf16x8(p.add(2 * i)),
            WFormat::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast())),
        }
    }

    // Index loops: iterators here have been compiled out of line (see below).
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_block_avx2<const R: usize, const T: usize>(
        fmt: WFormat,
        rows: [&[u8]; R],
        xs: [&[f32]; T],
    ) -> [[f32; R]; T] {
        let k = xs[0].len();
        let main = k / LANES * LANES;
        // Output (t, r) keeps 16 lanes in two registers, `acc[t][r][0]` for lanes 0..8 of
        // every chunk and `[1]` for 8..16, as `dot_rows_avx2` does. The halves are taken one
        // after the other so that only one half's weights are live: 16 registers hold
        // 2·R·T accumulators, R weights and one activation.
        let mut acc = [[[_mm256_setzero_ps(); 2]; R]; T];
        let mut i = 0;
        while i < main {
            for h in 0..2 {
                let j = i + 8 * h;
                // A loop, not `rows.map(..)`: a closure here was compiled out of line, without
                // the target features, one call per row and chunk (a fifth of prefill's time).
                let mut w = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    w[r] = load8(fmt, rows[r].as_ptr(), j);
                }
                for t in 0..T {
                    let x = _mm256_loadu_ps(xs[t].as_ptr().add(j));
                    for r in 0..R {
                        acc[t][r][h] = _mm256_fmadd_ps(w[r], x, acc[t][r][h]);
                    }
                }
            }
            i += LANES;
        }
        let mut out = [[0.0; R]; T];
        for t in 0..T {
            for r in 0..R {
                if main == k {
                    out[t][r] = reduce16_avx2(acc[t][r][0], acc[t][r][1]);
                    continue;
                }
                let mut lanes = [0.0f32; LANES];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[t][r][0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[t][r][1]);
                tail(fmt, rows[r], xs[t], main, &mut lanes);
                out[t][r] = reduce_lanes(lanes);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu;
    use proptest::prelude::*;

    fn encode(fmt: WFormat, v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match fmt {
                WFormat::F32 => x.to_le_bytes().to_vec(),
                WFormat::BF16 => half::bf16::from_f32(x).to_bits().to_le_bytes().to_vec(),
                WFormat::F16 => half::f16::from_f32(x).to_bits().to_le_bytes().to_vec(),
                // The nearest e4m3 value (tests only).
                WFormat::F8E4M3 => vec![(0..=255u8)
                    .filter(|&b| !coli_core::FP8_E4M3_TABLE[b as usize].is_nan())
                    .min_by(|&a, &b| {
                        let d = |b: u8| (coli_core::FP8_E4M3_TABLE[b as usize] - x).abs();
                        d(a).total_cmp(&d(b))
                    })
                    .unwrap()],
                WFormat::I8 => vec![(x.round().clamp(-128.0, 127.0) as i8) as u8],
                WFormat::I4 | WFormat::F4E2M1 | WFormat::Ggml(_) => {
                    unreachable!("packed: several elements per byte")
                }
            })
            .collect()
    }

    #[test]
    fn scalar_is_exact_on_small_integers() {
        // Integer-valued inputs are summed exactly, so any order gives the true value.
        let x: Vec<f32> = (0..37).map(|i| (i % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..37).map(|i| (i % 5) as f32 - 2.0).collect();
        let want: f32 = x.iter().zip(&w).map(|(a, b)| a * b).sum();
        for fmt in [WFormat::F32, WFormat::BF16, WFormat::F16, WFormat::F8E4M3] {
            assert_eq!(dot_scalar(fmt, &encode(fmt, &w), &x), want);
        }
    }

    #[test]
    fn reduction_order_is_the_documented_one() {
        // Lane 0 gets a huge value, lane 8 its negation, lane 1 a small one: the tree adds
        // lane 0 + lane 8 first (exactly 0), so the small value survives. A sequential sum
        // (1e20 + 1 - 1e20) would lose it.
        let mut w = vec![0.0f32; 16];
        w[0] = 1e20;
        w[8] = -1e20;
        w[1] = 1.0;
        let x = vec![1.0f32; 16];
        for isa in cpu::available() {
            assert_eq!(
                dot_rows(isa, WFormat::F32, [&encode(WFormat::F32, &w)[..]], &x)[0],
                1.0,
                "{isa:?}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Every instruction set, every format, any length, 1 or 4 rows: bit-identical to scalar.
        /// Half the lengths are whole chunks of 16, where the lanes are summed in registers.
        #[test]
        fn simd_matches_scalar_bit_for_bit(
            n in prop_oneof![0usize..200, (1usize..13).prop_map(|c| c * 16)],
            seed in any::<u64>(),
            fmt_i in 0usize..3,
        ) {
            let fmt = [WFormat::F32, WFormat::BF16, WFormat::F16][fmt_i];
            let mut s = seed | 1;
            let mut rnd = move || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0 };
            let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let rows: Vec<Vec<u8>> = (0..4).map(|_| encode(fmt, &(0..n).map(|_| rnd()).collect::<Vec<_>>())).collect();
            let want: Vec<u32> = rows.iter().map(|r| dot_scalar(fmt, r, &x).to_bits()).collect();
            for isa in cpu::available() {
                let got4 = dot_rows(isa, fmt, [&rows[0][..], &rows[1], &rows[2], &rows[3]], &x);
                prop_assert_eq!(got4.map(f32::to_bits).to_vec(), want.clone(), "{:?} x4", isa);
                let x2: Vec<f32> = x.iter().map(|v| v * -0.75 + 0.125).collect();
                let blk = dot_block(isa, fmt, [&rows[0][..], &rows[1], &rows[2], &rows[3]], [&x[..], &x2, &x, &x2]);
                let want2: Vec<u32> = rows.iter().map(|r| dot_scalar(fmt, r, &x2).to_bits()).collect();
                for (t, got) in blk.iter().enumerate() {
                    let w = if t % 2 == 0 { &want } else { &want2 };
                    prop_assert_eq!(got.map(f32::to_bits).to_vec(), w.clone(), "{:?} block token {}", isa, t);
                }
                let got1 = dot_rows(isa, fmt, [&rows[2][..]], &x);
                prop_assert_eq!(got1[0].to_bits(), want[2], "{:?} x1", isa);
            }
        }
    }
}
