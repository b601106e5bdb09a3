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

/// Whether the line loop of int4 and e2m1 rows (AVX-512 with VBMI) covers rows of `cols`
/// elements scaled in blocks of `block_cols` columns.
fn nibble_lines_cover(isa: Isa, fmt: WFormat, block_cols: usize, cols: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == Isa::Avx512
            && matches!(fmt, WFormat::I4 | WFormat::F4E2M1)
            && block_cols > 0
            && (block_cols.is_multiple_of(32) || block_cols >= cols)
            && cols >= 128
            && is_x86_feature_detected!("avx512vbmi")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, fmt, block_cols, cols);
        false
    }
}

/// Whether the vector FP8 loops may fold their exponent correction `factor` (2^8 for
/// AVX-512's route through f16, 2^120 for AVX2's straight to f32) into these scales: the
/// loops convert a byte `v` to `v / factor` exactly, and `(v / factor) * (s * factor)`
/// rounds like `v * s` exactly when `s * factor` is exact, i.e. does not overflow a finite
/// `s` (infinite and NaN scales stay what they are). Rows with a scale beyond
/// `f32::MAX / factor` take the scalar path.
fn fold_fp8_rescale(scales: &[f32], factor: f32) -> bool {
    scales
        .iter()
        .all(|&s| !s.is_finite() || (s * factor).is_finite())
}

/// The exponent correction the vector FP8 loop of `isa` folds into the scales.
fn fp8_rescale(isa: Isa) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::F16_RESCALE,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::F32_RESCALE,
        _ => 1.0,
    }
}

/// Whether the vector loop of `isa` gives these scales the reference's bits: FP8 scales
/// must take [`fp8_rescale`]'s factor ([`fold_fp8_rescale`]), AVX2's int4 scales their
/// lane factors (`avx2::int4_scales_exact`). Calls that fail take the scalar path.
fn vector_scales_exact<const R: usize>(isa: Isa, fmt: WFormat, scales: &[&[f32]; R]) -> bool {
    match (isa, fmt) {
        (_, WFormat::F8E4M3) => scales.iter().all(|s| fold_fp8_rescale(s, fp8_rescale(isa))),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WFormat::I4) => scales.iter().all(|s| avx2::int4_scales_exact(s)),
        _ => true,
    }
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
    let isa = if vector_scales_exact(isa, fmt, &scales) {
        isa
    } else {
        Isa::Scalar
    };
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(crate::cpu::supports(Isa::Avx512));
            let vbmi = nibble_lines_cover(isa, fmt, block_cols, x.len());
            // SAFETY: the CPU supports AVX-512F and the AVX2 set (checked above), and VBMI
            // where `vbmi` says so; lengths and the layout checked above.
            unsafe { x86::dot_rows_scaled_avx512(fmt, rows, scales, block_cols, x, next, vbmi) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(crate::cpu::supports(Isa::Avx2));
            // SAFETY: the CPU supports AVX2+FMA (checked above); lengths and layout checked.
            unsafe { avx2::dot_rows_scaled_avx2(fmt, rows, scales, block_cols, x, next) }
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
#[macro_use]
mod x86 {
    use super::{tail_scaled, LANES};
    use crate::dot::x86::{prefetch_next, reduce16_avx512};
    use crate::dot::{reduce_lanes, WFormat, FP4_E2M1_VALUES};
    use std::arch::x86_64::*;

    /// Sixteen nibbles (8 bytes, low nibble first) as sixteen bytes `nibble` (0..=15).
    #[inline(always)]
    pub(super) unsafe fn nibbles16(p: *const u8) -> __m128i {
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
            scaled_loop!(from 0; $bcast, $scales, $bc, $next, $lines, $main, $acc, $body, $pair)
        }};
        (from $start:expr; $bcast:expr, $scales:expr, $bc:expr, $next:expr, $lines:expr, $main:expr, $acc:expr, $body:expr, $pair:expr) => {{
            // Blocks are counted, not divided out (a division per block cost Zen 2 time).
            let mut i = $start;
            let mut blk = i / $bc;
            while i < $main {
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
                blk += 1;
            }
        }};
    }

    /// Eight e2m1 nibbles (in the low 4 bits of i32 lanes) as f32: the magnitude from the
    /// 8-entry table by the low 3 bits, the sign from bit 3 (nibble 8 is -0, as the table).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn e2m1x8(n: __m256i) -> __m256 {
        let mags = _mm256_loadu_ps(FP4_E2M1_VALUES.as_ptr());
        let m = _mm256_permutevar8x32_ps(mags, n);
        let sign = _mm256_slli_epi32(_mm256_srli_epi32(n, 3), 31);
        _mm256_or_ps(m, _mm256_castsi256_ps(sign))
    }

    /// For lane `l`, the bytes holding elements `l + 16m` of a 128-element line, `m = 0..4`
    /// (`NIBBLE_GATHER[0]`) and `m = 4..8` (`[1]`), as the four bytes of its 32 bits in the
    /// order of `m`: element `e` lies in byte `e / 2`.
    const NIBBLE_GATHER: [[u8; 64]; 2] = {
        let mut g = [[0u8; 64]; 2];
        let mut h = 0;
        while h < 2 {
            let mut l = 0;
            while l < 16 {
                let mut j = 0;
                while j < 4 {
                    g[h][4 * l + j] = ((l + 16 * (4 * h + j)) / 2) as u8;
                    j += 1;
                }
                l += 1;
            }
            h += 1;
        }
        g
    };

    /// int4 and e2m1 rows a 128-element line (64 bytes) at a time, for `x[..wide]`, where
    /// each 32-element quarter of a line lies in one scale block. The lanes and their order
    /// are the 16-element loop's: lane `l` takes elements `l + 16m`, `m = 0..8`, in order.
    /// One byte permute per half gathers each lane's four bytes ([`NIBBLE_GATHER`]); odd
    /// lanes want the high nibbles and shift by 4; step `m`'s nibble is then the lane's low
    /// four bits after a shift by `8 (m mod 4)`, and the permute of the block's sixteen
    /// `value * scale` products reads only those four bits. Per 16 weights: 1.25 shuffles,
    /// against 3 in the 16-element loop.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2,fma")]
    unsafe fn nibble_lines<const R: usize>(
        levels: __m512,
        rows: [&[u8]; R],
        scales: [&[f32]; R],
        bc: usize,
        x: &[f32],
        wide: usize,
        next: &[u8],
        lines: usize,
        acc: &mut [__m512; R],
    ) {
        debug_assert!(wide <= x.len() && wide.is_multiple_of(128));
        let gather = NIBBLE_GATHER.map(|g| _mm512_loadu_si512(g.as_ptr().cast()));
        let odd = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
        let xp = x.as_ptr();
        // Blocks of 32 columns change the table every two steps; otherwise every half-line
        // lies in one block.
        let per32 = !(bc.is_multiple_of(64) || bc >= x.len());
        let table = |s: f32| _mm512_mul_ps(levels, _mm512_set1_ps(s));
        let mut i = 0;
        while i < wide {
            for s in 0..8 {
                prefetch_next(next, i + s * LANES, lines);
            }
            let v = rows.map(|row| _mm512_loadu_si512(row.as_ptr().add(i / 2).cast()));
            // One half-line at a time: the rows' nibbles and tables stay in registers.
            for h in 0..2 {
                let mut q =
                    v.map(|v| _mm512_srlv_epi32(_mm512_permutexvar_epi8(gather[h], v), odd));
                let mut t = scales.map(|s| table(s[(i + 64 * h) / bc]));
                for j in 0..4 {
                    if per32 && j == 2 {
                        t = scales.map(|s| table(s[(i + 64 * h + 32) / bc]));
                    }
                    let xv = _mm512_loadu_ps(xp.add(i + LANES * (4 * h + j)));
                    for r in 0..R {
                        let w = _mm512_permutexvar_ps(q[r], t[r]);
                        acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
                        q[r] = _mm512_srli_epi32::<8>(q[r]);
                    }
                }
            }
            i += 128;
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_scaled_avx512<const R: usize>(
        fmt: WFormat,
        rows: [&[u8]; R],
        scales: [&[f32]; R],
        bc: usize,
        x: &[f32],
        next: &[u8],
        vbmi: bool,
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
            // Both formats have sixteen values, one register: int4's `n - 8`, the e2m1 table.
            // Each block's values times its scale are computed once, with the same product as
            // `value * scale`, so a permute by the nibble gives the dequantized weight's bits
            // with no conversion or multiply per element.
            WFormat::I4 | WFormat::F4E2M1 => {
                let levels = _mm512_loadu_ps(crate::dequant::nibble_values(fmt).as_ptr());
                let nib = |d: __m128i| crate::dequant::nibble_indices16(d);
                // Whole cache lines first where each half of one lies in one scale block.
                let start = if vbmi {
                    let wide = x.len() / 128 * 128;
                    nibble_lines(levels, rows, scales, bc, x, wide, next, lines, &mut acc);
                    wide
                } else {
                    0
                };
                scaled_loop!(
                    from start;
                    |s: f32| _mm512_mul_ps(levels, _mm512_set1_ps(s)),
                    scales,
                    bc,
                    next,
                    lines,
                    main,
                    acc,
                    |i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                        let xv = _mm512_loadu_ps(xp.add(i));
                        for r in 0..R {
                            let b = _mm_loadl_epi64(rows[r].as_ptr().add(i / 2).cast());
                            let w = _mm512_permutexvar_ps(nib(_mm_unpacklo_epi8(b, b)), sv[r]);
                            acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
                        }
                    },
                    Some(|i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                        let x0 = _mm512_loadu_ps(xp.add(i));
                        let x1 = _mm512_loadu_ps(xp.add(i + LANES));
                        for r in 0..R {
                            let b = _mm_loadu_si128(rows[r].as_ptr().add(i / 2).cast());
                            let w0 = _mm512_permutexvar_ps(nib(_mm_unpacklo_epi8(b, b)), sv[r]);
                            let w1 = _mm512_permutexvar_ps(nib(_mm_unpackhi_epi8(b, b)), sv[r]);
                            acc[r] = _mm512_fmadd_ps(w0, x0, acc[r]);
                            acc[r] = _mm512_fmadd_ps(w1, x1, acc[r]);
                        }
                    })
                )
            }
            WFormat::F8E4M3 => {
                // A row without NaN bytes skips their mapping (see `fp8_has_nan`).
                macro_rules! fp8_loop {
                    ($nan:literal) => {
                        scaled_loop!(
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
                                    let w = e4m3x16::<$nan>(rows[r].as_ptr().add(i));
                                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(w, sv[r]), xv, acc[r]);
                                }
                            },
                            // Thirty-two weights converted in one 512-bit pass (the two
                            // halves' FMAs in element order, as two single steps).
                            Some(|i: usize, sv: &[__m512; R], acc: &mut [__m512; R]| {
                                let x0 = _mm512_loadu_ps(xp.add(i));
                                let x1 = _mm512_loadu_ps(xp.add(i + LANES));
                                for r in 0..R {
                                    let (w0, w1) = e4m3x32::<$nan>(rows[r].as_ptr().add(i));
                                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(w0, sv[r]), x0, acc[r]);
                                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(w1, sv[r]), x1, acc[r]);
                                }
                            })
                        )
                    };
                }
                if rows.iter().any(|r| super::fp8_has_nan(r)) {
                    fp8_loop!(true)
                } else {
                    fp8_loop!(false)
                }
            }
            _ => unreachable!("fused_layout admits int8, int4, FP8 and FP4 only"),
        }
        let mut out = [0.0; R];
        for r in 0..R {
            if main == x.len() {
                out[r] = reduce16_avx512(acc[r]);
                continue;
            }
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

    /// Thirty-two e4m3 bytes as two vectors of sixteen f32s, divided by 2^8 (exact): the
    /// mapping of [`e4m3_as_f16x16`] on 32 lanes at once.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn e4m3x32<const NAN: bool>(p: *const u8) -> (__m512, __m512) {
        let sx = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.cast()));
        let mut bits = _mm512_and_si512(
            _mm512_slli_epi16::<7>(sx),
            _mm512_set1_epi16(0xBFFFu16 as i16),
        );
        if NAN {
            let mag = _mm512_and_si512(bits, _mm512_set1_epi16(0x7FFF));
            let nan = _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x3F80));
            bits = _mm512_mask_blend_epi16(
                nan,
                bits,
                _mm512_or_si512(bits, _mm512_set1_epi16(0x7E00)),
            );
        }
        (
            _mm512_cvtph_ps(_mm512_castsi512_si256(bits)),
            _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(bits)),
        )
    }

    // The AVX2 loops are in `avx2.rs` (they use `scaled_loop!`, hence `macro_use`).
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

#[cfg(test)]
mod tests;
