//! The fast mode on AVX2 (no VNNI): the integer sums of [`super::dot_rows_scalar`] with
//! `vpmaddubsw` (unsigned bytes times signed bytes, adjacent pairs added into 16 bits)
//! and `vpmaddwd` against ones (adjacent 16-bit pairs added into 32 bits), so each 32-bit
//! lane of a 32-byte step holds the sum of four products, positions `4l..4l + 4`, as the
//! definition's lanes do. The float work per group is the definition's.
//!
//! `vpmaddubsw` saturates its 16-bit pair sums, so the operands must keep them below
//! 2^15. int4 nibbles (0..=15) times activations (|q| ≤ 127) reach 3,810: the nibbles
//! are multiplied as stored and the group starts from the precomputed correction, as in
//! the definition. int8 weights read with their offset (`w + 128`, up to 255) could reach
//! 64,770, so they are multiplied signed instead: `|w|` (0..=128, unsigned) times `q`
//! carrying `w`'s sign (`vpsignb`; |q| ≤ 127 never overflows when negated), at most
//! 32,512 per pair. That computes `Σ w·q` exactly, the integer the definition's
//! `neg + Σ (w + 128)·q` equals (`neg = −128·Σ q`), so the group starts from zero.

use super::{Int8Acts, CHUNK};
use crate::dot::x86::{prefetch_next, reduce16_avx2};
use crate::dot::{WFormat, LANES};
use std::arch::x86_64::*;

/// Four-product lane sums of 32 unsigned bytes `w` with 32 signed bytes `q`.
#[inline(always)]
unsafe fn lane_sums(w: __m256i, q: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), _mm256_set1_epi16(1))
}

/// The vector form of [`super::dot_rows_scalar`] for `R` rows and one token on AVX2 (the
/// caller runs several tokens one at a time: their accumulators together would not fit
/// in the sixteen registers).
///
/// # Safety
/// The CPU must have AVX2 and FMA, and the lengths must be those `super::check` accepts.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_rows_avx2<const R: usize>(
    rows: [&[u8]; R],
    scales: [&[f32]; R],
    block_cols: usize,
    a: &Int8Acts,
    next: &[u8],
) -> [f32; R] {
    if a.fmt == WFormat::I4 {
        int4_token(rows, scales, block_cols, a, next)
    } else {
        int8_token(rows, scales, block_cols, a, next)
    }
}

/// Groups per scale block, each group of `span` columns lying in one block
/// (`super::takes`): the loops step to the next scale by counting, not dividing.
fn groups_per_block(block_cols: usize, k: usize, span: usize) -> usize {
    if block_cols >= k {
        k / span
    } else {
        block_cols / span
    }
}

/// int8 rows with one token: a group's chunks are summed in 32-bit lanes for all rows,
/// then scaled once.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn int8_token<const R: usize>(
    rows: [&[u8]; R],
    scales: [&[f32]; R],
    block_cols: usize,
    a: &Int8Acts,
    next: &[u8],
) -> [f32; R] {
    let k = a.len();
    // Cache lines of `next` per chunk step, counted as `prefetch_next` does per LANES.
    let lines = (R * CHUNK).div_ceil(64);
    let (group, groups) = (a.group, k / CHUNK / a.group);
    let (qp, dp) = (a.q.as_ptr(), a.d.as_ptr());
    let per_block = groups_per_block(block_cols, k, group * CHUNK);
    let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
    let mut ws = [_mm256_setzero_ps(); R];
    let (mut block, mut left) = (0, 0);
    for g in 0..groups {
        if left == 0 {
            for r in 0..R {
                ws[r] = _mm256_set1_ps(scales[r][block]);
            }
            (block, left) = (block + 1, per_block);
        }
        left -= 1;
        // Σ w·q from zero: the integer the definition's `neg + Σ (w + 128)·q` equals.
        let mut sum = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
        for c in g * group..(g + 1) * group {
            prefetch_next(next, c * LANES, lines);
            let qc = qp.add(c * CHUNK);
            let (q0, q1) = (
                _mm256_loadu_si256(qc.cast()),
                _mm256_loadu_si256(qc.add(32).cast()),
            );
            for r in 0..R {
                let p = rows[r].as_ptr().add(c * CHUNK);
                let w0 = _mm256_loadu_si256(p.cast());
                let w1 = _mm256_loadu_si256(p.add(32).cast());
                let l0 = lane_sums(_mm256_abs_epi8(w0), _mm256_sign_epi8(q0, w0));
                let l1 = lane_sums(_mm256_abs_epi8(w1), _mm256_sign_epi8(q1, w1));
                sum[r].0 = _mm256_add_epi32(sum[r].0, l0);
                sum[r].1 = _mm256_add_epi32(sum[r].1, l1);
            }
        }
        let (d0, d1) = (
            _mm256_loadu_ps(dp.add(g * LANES)),
            _mm256_loadu_ps(dp.add(g * LANES + 8)),
        );
        for r in 0..R {
            let (a0, a1) = &mut acc[r];
            *a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r].0), _mm256_mul_ps(d0, ws[r]), *a0);
            *a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r].1), _mm256_mul_ps(d1, ws[r]), *a1);
        }
    }
    acc.map(|(a0, a1)| reduce16_avx2(a0, a1))
}

/// int4 rows with one token: a group is one chunk, so each row's
/// lane sums become f32 as soon as they are formed, and only the accumulators persist.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn int4_token<const R: usize>(
    rows: [&[u8]; R],
    scales: [&[f32]; R],
    block_cols: usize,
    a: &Int8Acts,
    next: &[u8],
) -> [f32; R] {
    let k = a.len();
    let groups = k / CHUNK;
    let lines = (R * CHUNK / 2).div_ceil(64);
    let low = _mm256_set1_epi8(0x0F);
    let (qp, np, dp) = (a.q.as_ptr(), a.neg.as_ptr(), a.d.as_ptr());
    let per_block = groups_per_block(block_cols, k, CHUNK);
    let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
    let mut sp = [std::ptr::null::<f32>(); R];
    let mut rp = [std::ptr::null::<u8>(); R];
    for r in 0..R {
        (sp[r], rp[r]) = (scales[r].as_ptr(), rows[r].as_ptr());
    }
    let mut left = per_block;
    for g in 0..groups {
        prefetch_next(next, g * LANES, lines);
        let (n0, n1) = (
            _mm256_loadu_si256(np.add(g * LANES).cast()),
            _mm256_loadu_si256(np.add(g * LANES + 8).cast()),
        );
        let (q0, q1) = (
            _mm256_loadu_si256(qp.add(g * CHUNK).cast()),
            _mm256_loadu_si256(qp.add(g * CHUNK + 32).cast()),
        );
        let (d0, d1) = (
            _mm256_loadu_ps(dp.add(g * LANES)),
            _mm256_loadu_ps(dp.add(g * LANES + 8)),
        );
        for r in 0..R {
            let b = _mm256_loadu_si256(rp[r].add(g * CHUNK / 2).cast());
            let lo = _mm256_and_si256(b, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), low);
            let s0 = _mm256_add_epi32(n0, lane_sums(lo, q0));
            let s1 = _mm256_add_epi32(n1, lane_sums(hi, q1));
            let w = _mm256_broadcast_ss(&*sp[r]);
            let (a0, a1) = &mut acc[r];
            *a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(d0, w), *a0);
            *a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(d1, w), *a1);
        }
        left -= 1;
        if left == 0 {
            for p in &mut sp {
                *p = p.add(1);
            }
            left = per_block;
        }
    }
    acc.map(|(a0, a1)| reduce16_avx2(a0, a1))
}
