//! Fused dot products of block-scaled quantized rows (int8, int4, FP8 e4m3, FP4 e2m1) with an f32
//! activation vector: the stored values are loaded, widened to f32, multiplied by their
//! block's scale and accumulated in registers, with no f32 staging buffer.
//!
//! The arithmetic is the definition of a scaled format's dot product (see
//! [`crate::matmul::MatRef::dequant_row`]): element `i` is dequantized as
//! `stored(i) * scale[i / block_cols]` (one f32 multiplication) and accumulated into lane
//! `i % 16` with a fused multiply-add, lanes summed by the fixed halving tree
//! ([`crate::dot::reduce_lanes`]). So a fused kernel gives the same bits as dequantizing
//! the row and running the f32 kernel, on every instruction set (tested).
//!
//! The vector loops need each 16-element chunk to lie in one scale block:
//! [`fused_layout`] says when a layout qualifies (a block width that is a multiple of 16,
//! or one block spanning the whole row, as per-row scales do).

use crate::cpu::Isa;
use crate::dot::{reduce_lanes, WFormat, LANES};

/// Whether the fused kernels cover rows of `cols` elements of `fmt` scaled in blocks of
/// `block_cols` columns.
pub fn fused_layout(fmt: WFormat, block_cols: usize, cols: usize) -> bool {
    matches!(
        fmt,
        WFormat::I8 | WFormat::I4 | WFormat::F8E4M3 | WFormat::F4E2M1
    ) && block_cols > 0
        && (block_cols.is_multiple_of(LANES) || block_cols >= cols)
}

/// Whether the vector FP8 loops may fold their 2^8 exponent correction into these
/// scales: `v * (s * 2^8)` rounds like `(v * 2^8) * s` exactly when `s * 2^8` is exact,
/// i.e. does not overflow a finite `s` (infinite and NaN scales stay what they are). Rows
/// with a scale beyond 2^120 take the scalar path.
fn fold_fp8_rescale(scales: &[f32]) -> bool {
    scales
        .iter()
        .all(|&s| !s.is_finite() || (s * 256.0).is_finite())
}

/// Whether FP8 e4m3 bytes hold a NaN encoding (`S.1111.111`): `(b & 0x7F) + 1` reaches
/// 0x80 for those bytes only. One pass without an early exit, so it vectorizes; the vector
/// loops then skip the NaN mapping for rows without any.
#[inline(always)]
fn fp8_has_nan(row: &[u8]) -> bool {
    row.iter().fold(0u8, |m, &b| m | ((b & 0x7F) + 1)) & 0x80 != 0
}

/// Accumulates elements `start..` (the part a vector loop left) into their lanes.
#[inline(always)]
fn tail_scaled(
    fmt: WFormat,
    row: &[u8],
    scales: &[f32],
    block_cols: usize,
    x: &[f32],
    start: usize,
    acc: &mut [f32; LANES],
) {
    for (i, &xi) in x.iter().enumerate().skip(start) {
        let w = fmt.load(row, i) * scales[i / block_cols];
        acc[i % LANES] = w.mul_add(xi, acc[i % LANES]);
    }
}

/// The reference: one scaled row, in the fixed order.
pub fn dot_scaled_scalar(
    fmt: WFormat,
    row: &[u8],
    scales: &[f32],
    block_cols: usize,
    x: &[f32],
) -> f32 {
    let mut acc = [0.0f32; LANES];
    tail_scaled(fmt, row, scales, block_cols, x, 0, &mut acc);
    reduce_lanes(acc)
}

/// Dot products of `R` scaled rows with the same `x`: row `r` has the block scales
/// `scales[r]` (one per `block_cols` columns). `next` is prefetched while computing (the
/// bytes the caller reads after these rows; a hint that never changes a result).
///
/// # Panics
/// If a row or its scales do not match `x`, the layout is not [`fused_layout`], or `isa`
/// is not available on this CPU.
#[inline]
pub fn dot_rows_scaled<const R: usize>(
    isa: Isa,
    fmt: WFormat,
    rows: [&[u8]; R],
    scales: [&[f32]; R],
    block_cols: usize,
    x: &[f32],
    next: &[u8],
) -> [f32; R] {
    assert!(
        fused_layout(fmt, block_cols, x.len()),
        "dot_rows_scaled: {fmt:?} in blocks of {block_cols} is not a fused layout"
    );
    for (r, s) in rows.iter().zip(&scales) {
        assert_eq!(
            r.len(),
            fmt.row_bytes(x.len()),
            "dot: row bytes do not match the activation length"
        );
        assert_eq!(
            s.len(),
            x.len().div_ceil(block_cols),
            "dot: one scale per block"
        );
    }
    let isa = if fmt == WFormat::F8E4M3 && !scales.iter().all(|s| fold_fp8_rescale(s)) {
        Isa::Scalar
    } else {
        isa
    };
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(crate::cpu::supports(Isa::Avx512));
            // SAFETY: the CPU supports AVX-512F and the AVX2 set (checked above); lengths
            // and the layout checked above.
            unsafe { x86::dot_rows_scaled_avx512(fmt, rows, scales, block_cols, x, next) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(crate::cpu::supports(Isa::Avx2));
            // SAFETY: the CPU supports AVX2+FMA (checked above); lengths and layout checked.
            unsafe { x86::dot_rows_scaled_avx2(fmt, rows, scales, block_cols, x, next) }
        }
        _ => {
            let mut out = [0.0; R];
            for r in 0..R {
                out[r] = dot_scaled_scalar(fmt, rows[r], scales[r], block_cols, x);
            }
            out
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{tail_scaled, LANES};
    use crate::dot::x86::{prefetch_next, reduce16_avx2};
    use crate::dot::{reduce_lanes, WFormat, FP4_E2M1_VALUES};
    use std::arch::x86_64::*;

    /// Sixteen nibbles (8 bytes, low nibble first) as sixteen bytes `nibble` (0..=15).
    #[inline(always)]
    unsafe fn nibbles16(p: *const u8) -> __m128i {
        let w16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(p.cast()));
        let lo = _mm_and_si128(w16, _mm_set1_epi16(0x0F));
        let hi = _mm_slli_epi16(_mm_srli_epi16(w16, 4), 8);
        _mm_or_si128(lo, hi)
    }

    /// The loop over a row's vector part, one broadcast scale per block.
    /// `$pair`, when given, takes 32 elements at once (the same lanes, in the same order, as
    /// two calls of `$body`).
    macro_rules! scaled_loop {
        ($bcast:expr, $scales:expr, $bc:expr, $next:expr, $lines:expr, $main:expr, $acc:expr, $body:expr) => {{
            scaled_loop!(
                $bcast,
                $scales,
                $bc,
                $next,
                $lines,
                $main,
                $acc,
                $body,
                None::<fn(usize, &_, &mut _)>
            )
        }};
        ($bcast:expr, $scales:expr, $bc:expr, $next:expr, $lines:expr, $main:expr, $acc:expr, $body:expr, $pair:expr) => {{
            let mut i = 0;
            while i < $main {
                let blk = i / $bc;
                let end = ((blk + 1) * $bc).min($main);
                let sv = $scales.map(|s| $bcast(s[blk]));
                if let Some(pair) = $pair {
                    while i + 2 * LANES <= end {
                        prefetch_next($next, i, $lines);
                        prefetch_next($next, i + LANES, $lines);
                        pair(i, &sv, &mut $acc);
                        i += 2 * LANES;
                    }
                }
                while i < end {
                    prefetch_next($next, i, $lines);
                    $body(i, &sv, &mut $acc);
                    i += LANES;
                }
            }
        }};
    }

    /// Thirty-two nibbles (16 bytes, low nibble first) as two vectors of sixteen signed
    /// bytes `nibble - 8`, in element order.
    #[inline(always)]
    unsafe fn nibbles32(p: *const u8) -> (__m128i, __m128i) {
        let b = _mm_loadu_si128(p.cast());
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(b, m);
        let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        let eight = _mm_set1_epi8(8);
        (
            _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight),
            _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight),
        )
    }

    /// Thirty-two nibbles (16 bytes, low nibble first) as two vectors of sixteen bytes
    /// `nibble` (0..=15), in element order.
    #[inline(always)]
    unsafe fn nibbles32_raw(p: *const u8) -> (__m128i, __m128i) {
        let b = _mm_loadu_si128(p.cast());
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(b, m);
        let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        (_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi))
    }

    /// Eight e2m1 nibbles (in the low 4 bits of i32 lanes) as f32: the magnitude from the
    /// 8-entry table by the low 3 bits, the sign from bit 3 (nibble 8 is -0, as the table).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn e2m1x8(n: __m256i) -> __m256 {
        let mags = _mm256_loadu_ps(FP4_E2M1_VALUES.as_ptr());
        let m = _mm256_permutevar8x32_ps(mags, n);
        let sign = _mm256_slli_epi32(_mm256_srli_epi32(n, 3), 31);
        _mm256_or_ps(m, _mm256_castsi256_ps(sign))
    }

    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_scaled_avx512<const R: usize>(
        fmt: WFormat,
        rows: [&[u8]; R],
        scales: [&[f32]; R],
        bc: usize,
        x: &[f32],
        next: &[u8],
    ) -> [f32; R] {
        let lines = (R * fmt.row_bytes(LANES)).div_ceil(64);
        let main = x.len() / LANES * LANES;
        let mut acc = [_mm512_setzero_ps(); R];
        let xp = x.as_ptr();
        let bcast = |s: f32| _mm512_set1_ps(s);
        match fmt {
            WFormat::I8 => scaled_loop!(
                bcast,
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                    let xv = _mm512_loadu_ps(xp.add(i));
                    for r in 0..R {
                        let q =
                            _mm512_cvtepi8_epi32(_mm_loadu_si128(rows[r].as_ptr().add(i).cast()));
                        let w = _mm512_mul_ps(_mm512_cvtepi32_ps(q), sv[r]);
                        acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
                    }
                }
            ),
            WFormat::I4 => scaled_loop!(
                bcast,
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                    let xv = _mm512_loadu_ps(xp.add(i));
                    let eight = _mm512_set1_epi32(8);
                    for r in 0..R {
                        let n = _mm512_cvtepu8_epi32(nibbles16(rows[r].as_ptr().add(i / 2)));
                        let q = _mm512_sub_epi32(n, eight);
                        let w = _mm512_mul_ps(_mm512_cvtepi32_ps(q), sv[r]);
                        acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
                    }
                },
                Some(|i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                    let x0 = _mm512_loadu_ps(xp.add(i));
                    let x1 = _mm512_loadu_ps(xp.add(i + LANES));
                    for r in 0..R {
                        let (q0, q1) = nibbles32(rows[r].as_ptr().add(i / 2));
                        let w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), sv[r]);
                        let w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), sv[r]);
                        acc[r] = _mm512_fmadd_ps(w0, x0, acc[r]);
                        acc[r] = _mm512_fmadd_ps(w1, x1, acc[r]);
                    }
                })
            ),
            WFormat::F8E4M3 if !rows.iter().any(|r| super::fp8_has_nan(r)) => scaled_loop!(
                |s: f32| _mm512_set1_ps(s * F16_RESCALE),
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                    let xv = _mm512_loadu_ps(xp.add(i));
                    for r in 0..R {
                        let w = _mm512_mul_ps(e4m3x16::<false>(rows[r].as_ptr().add(i)), sv[r]);
                        acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
                    }
                }
            ),
            WFormat::F8E4M3 => scaled_loop!(
                |s: f32| _mm512_set1_ps(s * F16_RESCALE),
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                    let xv = _mm512_loadu_ps(xp.add(i));
                    for r in 0..R {
                        let w = _mm512_mul_ps(e4m3x16::<true>(rows[r].as_ptr().add(i)), sv[r]);
                        acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
                    }
                }
            ),
            // The 16 e2m1 values are one register: each nibble indexes it.
            WFormat::F4E2M1 => {
                let table = _mm512_loadu_ps(FP4_E2M1_VALUES.as_ptr());
                scaled_loop!(
                    bcast,
                    scales,
                    bc,
                    next,
                    lines,
                    main,
                    acc,
                    |i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                        let xv = _mm512_loadu_ps(xp.add(i));
                        for r in 0..R {
                            let n = _mm512_cvtepu8_epi32(nibbles16(rows[r].as_ptr().add(i / 2)));
                            let w = _mm512_mul_ps(_mm512_permutexvar_ps(n, table), sv[r]);
                            acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
                        }
                    },
                    Some(|i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                        let x0 = _mm512_loadu_ps(xp.add(i));
                        let x1 = _mm512_loadu_ps(xp.add(i + LANES));
                        for r in 0..R {
                            let (n0, n1) = nibbles32_raw(rows[r].as_ptr().add(i / 2));
                            let v0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(n0), table);
                            let v1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(n1), table);
                            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(v0, sv[r]), x0, acc[r]);
                            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(v1, sv[r]), x1, acc[r]);
                        }
                    })
                )
            }
            _ => unreachable!("fused_layout admits int8, int4, FP8 and FP4 only"),
        }
        let mut out = [0.0; R];
        for r in 0..R {
            let mut lanes = [0.0f32; LANES];
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r]);
            tail_scaled(fmt, rows[r], scales[r], bc, x, main, &mut lanes);
            out[r] = reduce_lanes(lanes);
        }
        out
    }

    /// Sixteen e4m3 bytes as half-precision bit patterns of the same value divided by 2^8:
    /// the e4m3 exponent and mantissa shifted into an f16's (bias 15 against 7), so e4m3
    /// subnormals become f16 subnormals, which the hardware conversion to f32 turns into
    /// normal f32s (no denormal operand ever reaches the multiplier). The byte is
    /// sign-extended, so one shift places the sign too (the copy it leaves in the
    /// exponent's top bit is cleared). With `NAN`, NaN encodings become an f16 NaN with
    /// their sign; without, the caller has checked that the bytes hold none
    /// ([`super::fp8_has_nan`]), and the four operations that map them are skipped.
    #[inline(always)]
    unsafe fn e4m3_as_f16x16<const NAN: bool>(b: __m128i) -> __m256i {
        let sx = _mm256_cvtepi8_epi16(b);
        let bits = _mm256_and_si256(
            _mm256_slli_epi16(sx, 7),
            _mm256_set1_epi16(0xBFFFu16 as i16),
        );
        if !NAN {
            return bits;
        }
        let mag = _mm256_and_si256(bits, _mm256_set1_epi16(0x7FFF));
        let nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3F80));
        _mm256_blendv_epi8(bits, _mm256_or_si256(bits, _mm256_set1_epi16(0x7E00)), nan)
    }

    /// 2^8: the f16 route's exponent correction, folded into each block's scale (see
    /// [`super::fold_fp8_rescale`]).
    pub(super) const F16_RESCALE: f32 = 256.0;

    /// Sixteen e4m3 bytes as f32, divided by 2^8 (exact).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn e4m3x16<const NAN: bool>(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(e4m3_as_f16x16::<NAN>(_mm_loadu_si128(p.cast())))
    }

    /// Sixteen e4m3 bytes as two halves of eight f32s, divided by 2^8 (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn e4m3x8x2<const NAN: bool>(p: *const u8) -> (__m256, __m256) {
        let h = e4m3_as_f16x16::<NAN>(_mm_loadu_si128(p.cast()));
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)),
        )
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_scaled_avx2<const R: usize>(
        fmt: WFormat,
        rows: [&[u8]; R],
        scales: [&[f32]; R],
        bc: usize,
        x: &[f32],
        next: &[u8],
    ) -> [f32; R] {
        let lines = (R * fmt.row_bytes(LANES)).div_ceil(64);
        let main = x.len() / LANES * LANES;
        let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
        let xp = x.as_ptr();
        let bcast = |s: f32| _mm256_set1_ps(s);
        // Each 16-element chunk: the two 8-lane halves of every row, as i32 lanes.
        let fma2 = |acc: &mut (__m256, __m256), w: (__m256, __m256), s: __m256, i: usize| {
            let x0 = _mm256_loadu_ps(xp.add(i));
            let x1 = _mm256_loadu_ps(xp.add(i + 8));
            acc.0 = _mm256_fmadd_ps(_mm256_mul_ps(w.0, s), x0, acc.0);
            acc.1 = _mm256_fmadd_ps(_mm256_mul_ps(w.1, s), x1, acc.1);
        };
        match fmt {
            WFormat::I8 => scaled_loop!(
                bcast,
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m256; R], acc: &mut [(__m256, __m256); R]| {
                    for r in 0..R {
                        let p = rows[r].as_ptr().add(i);
                        let q0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()));
                        let q1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8).cast()));
                        let w = (_mm256_cvtepi32_ps(q0), _mm256_cvtepi32_ps(q1));
                        fma2(&mut acc[r], w, sv[r], i);
                    }
                }
            ),
            WFormat::I4 => scaled_loop!(
                bcast,
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m256; R], acc: &mut [(__m256, __m256); R]| {
                    let eight = _mm256_set1_epi32(8);
                    for r in 0..R {
                        let n = nibbles16(rows[r].as_ptr().add(i / 2));
                        let q0 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(n), eight);
                        let q1 =
                            _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(n, 8)), eight);
                        let w = (_mm256_cvtepi32_ps(q0), _mm256_cvtepi32_ps(q1));
                        fma2(&mut acc[r], w, sv[r], i);
                    }
                },
                Some(
                    |i: usize, sv: &[__m256; R], acc: &mut [(__m256, __m256); R]| {
                        for r in 0..R {
                            let (q0, q1) = nibbles32(rows[r].as_ptr().add(i / 2));
                            for (j, q) in [(0, q0), (LANES, q1)] {
                                let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                                let b =
                                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
                                fma2(&mut acc[r], (a, b), sv[r], i + j);
                            }
                        }
                    }
                )
            ),
            WFormat::F8E4M3 if !rows.iter().any(|r| super::fp8_has_nan(r)) => scaled_loop!(
                |s: f32| _mm256_set1_ps(s * F16_RESCALE),
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m256; R], acc: &mut [(__m256, __m256); R]| {
                    for r in 0..R {
                        fma2(
                            &mut acc[r],
                            e4m3x8x2::<false>(rows[r].as_ptr().add(i)),
                            sv[r],
                            i,
                        );
                    }
                }
            ),
            WFormat::F8E4M3 => scaled_loop!(
                |s: f32| _mm256_set1_ps(s * F16_RESCALE),
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m256; R], acc: &mut [(__m256, __m256); R]| {
                    for r in 0..R {
                        fma2(
                            &mut acc[r],
                            e4m3x8x2::<true>(rows[r].as_ptr().add(i)),
                            sv[r],
                            i,
                        );
                    }
                }
            ),
            WFormat::F4E2M1 => scaled_loop!(
                bcast,
                scales,
                bc,
                next,
                lines,
                main,
                acc,
                |i: usize, sv: &[__m256; R], acc: &mut [(__m256, __m256); R]| {
                    for r in 0..R {
                        let n = nibbles16(rows[r].as_ptr().add(i / 2));
                        let w = (
                            e2m1x8(_mm256_cvtepu8_epi32(n)),
                            e2m1x8(_mm256_cvtepu8_epi32(_mm_srli_si128(n, 8))),
                        );
                        fma2(&mut acc[r], w, sv[r], i);
                    }
                }
            ),
            _ => unreachable!("fused_layout admits int8, int4, FP8 and FP4 only"),
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
            tail_scaled(fmt, rows[r], scales[r], bc, x, main, &mut lanes);
            out[r] = reduce_lanes(lanes);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu;
    use proptest::prelude::*;

    /// Bits, with every NaN as one value: which NaN operand an FMA chain propagates (and so
    /// its sign) depends on the instruction form the compiler picks, not on the order.
    fn canon(v: f32) -> u32 {
        if v.is_nan() {
            0x7FC0_0000
        } else {
            v.to_bits()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Every ISA, format, length and fused block width, 1 or 4 rows: bit-identical to
        /// the scalar reference and to the dequantized row's f32 dot product.
        #[test]
        fn fused_matches_dequantized_bit_for_bit(
            n in 0usize..300,
            blocks in 0usize..3,
            seed in any::<u64>(),
            fmt_i in 0usize..4,
        ) {
            let fmt = [WFormat::I8, WFormat::I4, WFormat::F8E4M3, WFormat::F4E2M1][fmt_i];
            let bc = [16, 64, n.max(1)][blocks];
            let mut s = seed | 1;
            let mut next = move || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            let x: Vec<f32> = (0..n).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0).collect();
            // Any byte, FP8's NaN encodings included; in half the cases none (FP8 rows
            // without a NaN take the vector loops' shorter conversion).
            let nan_free = seed & 2 == 0;
            let byte = |b: u8| if nan_free && b & 0x7F == 0x7F { b ^ 1 } else { b };
            let rows: Vec<Vec<u8>> = (0..4).map(|_| (0..fmt.row_bytes(n)).map(|_| byte((next() >> 32) as u8)).collect()).collect();
            let scales: Vec<Vec<f32>> = (0..4).map(|_| (0..n.div_ceil(bc)).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 * 0.02 + 1e-4).collect()).collect();
            let want: Vec<u32> = (0..4).map(|r| {
                let mut deq = vec![0.0f32; n];
                for (c, d) in deq.iter_mut().enumerate() {
                    *d = fmt.load(&rows[r], c) * scales[r][c / bc];
                }
                canon(crate::dot::dot_scalar(WFormat::F32, crate::dot::bytemuck_f32(&deq), &x))
            }).collect();
            for r in 0..4 {
                prop_assert_eq!(canon(dot_scaled_scalar(fmt, &rows[r], &scales[r], bc, &x)), want[r]);
            }
            for isa in cpu::available() {
                let got4 = dot_rows_scaled(isa, fmt, [&rows[0][..], &rows[1], &rows[2], &rows[3]], [&scales[0][..], &scales[1], &scales[2], &scales[3]], bc, &x, &rows[0]);
                prop_assert_eq!(got4.map(canon).to_vec(), want.clone(), "{:?} {:?} x4", isa, fmt);
                let got1 = dot_rows_scaled(isa, fmt, [&rows[3][..]], [&scales[3][..]], bc, &x, &[]);
                prop_assert_eq!(canon(got1[0]), want[3], "{:?} {:?} x1", isa, fmt);
            }
        }
    }

    #[test]
    fn every_e4m3_byte_converts_exactly_on_every_isa() {
        // Each byte alone in a row of 16 (the vector part) with x = 1 and scale 1: the dot
        // is the byte's value (NaN stays NaN).
        for b in 0..=255u8 {
            let mut row = [0u8; 16];
            row[5] = b;
            let x = [1.0f32; 16];
            // The table's value (a -0 byte sums to +0: the lanes start at +0).
            let want = coli_core::FP8_E4M3_TABLE[b as usize];
            let reference = dot_scaled_scalar(WFormat::F8E4M3, &row, &[1.0], 16, &x);
            assert!(
                reference == want || (reference.is_nan() && want.is_nan()),
                "{b:#x}"
            );
            for isa in cpu::available() {
                let got =
                    dot_rows_scaled(isa, WFormat::F8E4M3, [&row[..]], [&[1.0][..]], 16, &x, &[])[0];
                assert!(
                    got.to_bits() == reference.to_bits() || (got.is_nan() && want.is_nan()),
                    "{b:#x} {isa:?}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn every_e2m1_nibble_converts_exactly_on_every_isa() {
        // Each nibble alone (low and high) in a row of 32 with x = 1 and scale 1: the dot is
        // the nibble's value from the table (-0 sums to +0: the lanes start at +0).
        for nib in 0..16u8 {
            for high in [false, true] {
                let mut row = [0u8; 16];
                row[3] = if high { nib << 4 } else { nib };
                let x = [1.0f32; 32];
                let want = FP4_VALUES_PLUS_ZERO[nib as usize];
                for isa in cpu::available() {
                    for bc in [16, 32] {
                        let s = vec![1.0f32; 32 / bc];
                        let got = dot_rows_scaled(
                            isa,
                            WFormat::F4E2M1,
                            [&row[..]],
                            [&s[..]],
                            bc,
                            &x,
                            &[],
                        )[0];
                        assert_eq!(got.to_bits(), want.to_bits(), "{nib} high={high} {isa:?}");
                    }
                }
            }
        }
    }

    /// The e2m1 values with -0 read as +0 (what a sum starting at +0 gives).
    const FP4_VALUES_PLUS_ZERO: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];

    #[test]
    fn fp8_rows_with_and_without_nan_give_the_reference_bits() {
        // Every finite e4m3 byte, both signs, in a long row; then the same row with one
        // NaN encoding (0x7F or 0xFF) placed inside the vector loop's part.
        let n = 1024;
        let finite: Vec<u8> = (0..n)
            .map(|i| {
                let b = (i * 37 % 256) as u8;
                if b & 0x7F == 0x7F {
                    b ^ 2
                } else {
                    b
                }
            })
            .collect();
        assert!(!fp8_has_nan(&finite));
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 8.0)
            .collect();
        let scales = vec![0.75f32; n / 128];
        for nan in [None, Some(0x7Fu8), Some(0xFF)] {
            let mut rows: Vec<Vec<u8>> = (0..4)
                .map(|r| {
                    let mix = |b: u8| if r == 0 { b } else { b.rotate_left(r) & 0xF7 };
                    finite.iter().map(|&b| mix(b)).collect()
                })
                .collect();
            if let Some(v) = nan {
                rows[2][300] = v;
            }
            assert_eq!(rows.iter().any(|r| fp8_has_nan(r)), nan.is_some());
            let want: Vec<u32> = rows
                .iter()
                .map(|r| canon(dot_scaled_scalar(WFormat::F8E4M3, r, &scales, 128, &x)))
                .collect();
            assert_eq!(f32::from_bits(want[2]).is_nan(), nan.is_some());
            for isa in cpu::available() {
                let got = dot_rows_scaled(
                    isa,
                    WFormat::F8E4M3,
                    [&rows[0][..], &rows[1], &rows[2], &rows[3]],
                    [&scales[..], &scales, &scales, &scales],
                    128,
                    &x,
                    &[],
                );
                for r in 0..4 {
                    assert_eq!(canon(got[r]), want[r], "{isa:?} row {r} nan {nan:?}");
                }
            }
        }
    }

    #[test]
    fn fp8_scales_too_large_to_fold_give_the_reference_bits() {
        // A scale whose 2^8 multiple overflows: the vector loops cannot fold it and must
        // still give the reference's bits (here a finite product for small weights).
        let n = 64;
        let row: Vec<u8> = (0..n).map(|i| (i % 8) as u8).collect(); // e4m3 subnormals
        let x: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 0.01).collect();
        let scales = [f32::MAX / 2.0];
        let want = dot_scaled_scalar(WFormat::F8E4M3, &row, &scales, n, &x);
        assert!(want.is_finite());
        for isa in cpu::available() {
            let got = dot_rows_scaled(isa, WFormat::F8E4M3, [&row[..]], [&scales[..]], n, &x, &[]);
            assert_eq!(got[0].to_bits(), want.to_bits(), "{isa:?}");
        }
    }

    #[test]
    fn layouts_the_vector_loop_cannot_take_are_refused() {
        assert!(fused_layout(WFormat::I8, 2048, 2048));
        assert!(fused_layout(WFormat::I4, 64, 2048));
        assert!(fused_layout(WFormat::F8E4M3, 128, 300));
        assert!(fused_layout(WFormat::F4E2M1, 32, 2880));
        assert!(!fused_layout(WFormat::F8E4M3, 24, 300));
        assert!(!fused_layout(WFormat::BF16, 64, 128));
        assert!(!fused_layout(WFormat::I8, 0, 128));
    }
}
