//! The AVX2 (with FMA) fused loops of [`super::dot_rows_scaled`]: sixteen lanes as
//! two 8-lane halves, one broadcast scale per block.

use super::x86::{e2m1x8, nibbles16};
use super::{tail_scaled, LANES};
use crate::dot::x86::{prefetch_next, reduce16_avx2};
use crate::dot::{reduce_lanes, WFormat};
use std::arch::x86_64::*;

/// Eight int4 weights (4 bytes, low nibble first) as f32 `(nibble - 8) * 16^j` in lane
/// `j`, in element order, without a shift or shuffle: the 32-bit word broadcast from
/// memory to every lane, lane `j` masked to its own nibble where it lies and offset by
/// `8 * 16^j` (in lane 7 the subtraction wraps to the right value). Exact integers below
/// 2^31 with four significant bits, so `cvtdq2ps` is exact; the caller's scales carry
/// the `16^-j` ([`int4_lane_scales`]).
#[inline(always)]
pub(crate) unsafe fn int4x8(p: *const u8) -> __m256 {
    let word = _mm256_set1_epi32(p.cast::<i32>().read_unaligned());
    let mask = _mm256_setr_epi32(
        0xF,
        0xF0,
        0xF00,
        0xF000,
        0xF_0000,
        0xF0_0000,
        0xF00_0000,
        0xF000_0000u32 as i32,
    );
    let off = _mm256_setr_epi32(
        8,
        8 << 4,
        8 << 8,
        8 << 12,
        8 << 16,
        8 << 20,
        8 << 24,
        (8u32 << 28) as i32,
    );
    _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(word, mask), off))
}

/// `16^-j` in lane `j`: [`int4x8`]'s lane factor, multiplied into each block's scale.
/// `(v * 16^j) * (s * 16^-j)` is the same real product as `v * s`, so it rounds to the
/// same f32 whenever `s * 16^-j` is exact ([`int4_scales_exact`] says when).
#[inline(always)]
pub(crate) unsafe fn int4_lane_scales(s: f32) -> __m256 {
    let f = |j: i32| f32::from_bits(((127 - 4 * j) as u32) << 23);
    _mm256_mul_ps(
        _mm256_set1_ps(s),
        _mm256_setr_ps(f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7)),
    )
}

/// Whether [`int4_lane_scales`] gives every one of these scales exactly: `s * 2^-28` is
/// exact unless `s` is a finite non-zero number below 2^-98 in magnitude (the result
/// would not be a normal f32). In bits; infinities and NaNs lie above the bound. One pass
/// without an early exit, so it vectorizes.
#[inline(always)]
pub(super) fn int4_scales_exact(scales: &[f32]) -> bool {
    scales
        .iter()
        .fold(0u32, |m, &s| m | !int4_scale_exact(s) as u32)
        == 0
}

/// [`int4_scales_exact`] of one scale.
#[inline(always)]
pub(crate) fn int4_scale_exact(s: f32) -> bool {
    const MIN: u32 = (127 - 126 + 28) << 23;
    (s.to_bits() & 0x7FFF_FFFF).wrapping_sub(1) >= MIN - 1
}

/// 2^120: the exponent correction of AVX2's route straight to f32 ([`e4m3x8`]), folded
/// into each block's scale.
pub(super) const F32_RESCALE: f32 = f32::from_bits((127 + 120) << 23);

/// Eight e4m3 bytes as f32, divided by 2^120 (exact), with integer operations only:
/// each byte, sign-extended to 32 bits and shifted left by 20, puts its exponent and
/// mantissa at the bottom of an f32's exponent and the top of its mantissa (bias 127
/// against 7, hence the 2^-120), and its sign at bit 31 (the copies the extension left
/// in bits 27–30 are cleared). e4m3 subnormals become f32 subnormals of the same
/// scaled value, which the multiplication by the folded scale takes exactly. With
/// `NAN`, NaN encodings (all seven low bits set) become a quiet f32 NaN with their
/// sign; without, the caller has checked that the bytes hold none.
#[inline(always)]
unsafe fn e4m3x8<const NAN: bool>(p: *const u8) -> __m256 {
    let sx = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()));
    let mut bits = _mm256_and_si256(
        _mm256_slli_epi32(sx, 20),
        _mm256_set1_epi32(0x87F0_0000u32 as i32),
    );
    if NAN {
        let mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF_FFFF));
        let nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x07F0_0000));
        bits = _mm256_or_si256(bits, _mm256_and_si256(nan, _mm256_set1_epi32(0x7FC0_0000)));
    }
    _mm256_castsi256_ps(bits)
}

/// The vector part of `K` int4 rows (AVX2): each row's sixteen lanes as two
/// accumulators, the weights by [`int4x8`]. The scales must pass
/// [`int4_scales_exact`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn int4_rows<const K: usize>(
    rows: [&[u8]; K],
    scales: [&[f32]; K],
    bc: usize,
    x: &[f32],
    next: &[u8],
    main: usize,
) -> [(__m256, __m256); K] {
    let lines = (K * WFormat::I4.row_bytes(LANES)).div_ceil(64);
    let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); K];
    let xp = x.as_ptr();
    let step = |i: usize, sv: &[__m256; K], acc: &mut [(__m256, __m256); K]| {
        let x0 = _mm256_loadu_ps(xp.add(i));
        let x1 = _mm256_loadu_ps(xp.add(i + 8));
        for r in 0..K {
            let p = rows[r].as_ptr().add(i / 2);
            let w0 = _mm256_mul_ps(int4x8(p), sv[r]);
            let w1 = _mm256_mul_ps(int4x8(p.add(4)), sv[r]);
            acc[r].0 = _mm256_fmadd_ps(w0, x0, acc[r].0);
            acc[r].1 = _mm256_fmadd_ps(w1, x1, acc[r].1);
        }
    };
    // The loop runs at the rate Zen 2 issues instructions, so four steps share one
    // prefetch test and one loop test: the same steps in the same order (the same
    // bits), and the same lines of `next` prefetched as one step at a time would.
    const UNROLL: usize = 4;
    let (mut i, mut blk) = (0, 0);
    while i < main {
        let end = ((blk + 1) * bc).min(main);
        let sv = scales.map(|s| int4_lane_scales(s[blk]));
        while i + UNROLL * LANES <= end {
            let start = i / LANES * lines * 64;
            if start < next.len() {
                for l in 0..UNROLL * lines {
                    if start + l * 64 < next.len() {
                        _mm_prefetch::<_MM_HINT_T0>(next.as_ptr().add(start + l * 64).cast());
                    }
                }
            }
            for u in 0..UNROLL {
                step(i + u * LANES, &sv, &mut acc);
            }
            i += UNROLL * LANES;
        }
        while i < end {
            prefetch_next(next, i, lines);
            step(i, &sv, &mut acc);
            i += LANES;
        }
        blk += 1;
    }
    acc
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
        WFormat::I4 => {
            // Two rows at a time: four rows' accumulators, scales and the nibble
            // constants would not fit the sixteen registers (the accumulators spilled).
            // Each pass prefetches its share of `next`.
            let (mut r, share) = (0, next.len().div_ceil(R.div_ceil(2)));
            while r < R {
                let part = &next[(r / 2 * share).min(next.len())..];
                let part = &part[..share.min(part.len())];
                if r + 2 <= R {
                    let pair = int4_rows(
                        [rows[r], rows[r + 1]],
                        [scales[r], scales[r + 1]],
                        bc,
                        x,
                        part,
                        main,
                    );
                    (acc[r], acc[r + 1]) = (pair[0], pair[1]);
                    r += 2;
                } else {
                    acc[r] = int4_rows([rows[r]], [scales[r]], bc, x, part, main)[0];
                    r += 1;
                }
            }
        }
        WFormat::F8E4M3 => {
            // A row without NaN bytes skips their mapping (see `fp8_has_nan`).
            macro_rules! fp8_loop {
                ($nan:literal) => {
                    scaled_loop!(
                        |s: f32| _mm256_set1_ps(s * F32_RESCALE),
                        scales,
                        bc,
                        next,
                        lines,
                        main,
                        acc,
                        |i: usize, sv: &[__m256; R], acc: &mut [(__m256, __m256); R]| {
                            for r in 0..R {
                                let p = rows[r].as_ptr().add(i);
                                let w = (e4m3x8::<$nan>(p), e4m3x8::<$nan>(p.add(8)));
                                fma2(&mut acc[r], w, sv[r], i);
                            }
                        }
                    )
                };
            }
            if rows.iter().any(|r| super::fp8_has_nan(r)) {
                fp8_loop!(true)
            } else {
                fp8_loop!(false)
            }
        }
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
