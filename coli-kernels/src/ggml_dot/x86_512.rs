//! The AVX-512 decoder of [`super`] for the block types most GGUF downloads are made of
//! (Q8_0, Q4_0, Q4_K): 16 elements per `zmm`, so the reduction's 16 lanes are one
//! register and each token's chunk is one fused multiply-add (the AVX2 decoder splits it
//! into two 8-lane halves). Each element's value is computed with the AVX2 decoder's
//! operations in its order, lane `i % 16` as there: the same bits. Other types take the
//! AVX2 decoder (Q6_K was tried here and measured no faster: its decode is byte shuffles
//! of 16 elements either way).

use super::x86::{f16_at, nibbles};
use super::GgmlType;
use crate::dot::LANES;
use std::arch::x86_64::*;

/// Whether `ty` has an AVX-512 decoder here.
pub(super) fn has(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_K)
}

/// What is done with each decoded chunk of 16 elements.
trait Sink {
    unsafe fn chunk(&mut self, w: __m512, i: usize);
}

/// Multiplies each chunk into the accumulators of `T` tokens.
struct Dot<'x, const T: usize> {
    acc: [__m512; T],
    xs: [&'x [f32]; T],
}

impl<const T: usize> Sink for Dot<'_, T> {
    #[inline(always)]
    unsafe fn chunk(&mut self, w: __m512, i: usize) {
        for t in 0..T {
            let x = _mm512_loadu_ps(self.xs[t].as_ptr().add(i));
            self.acc[t] = _mm512_fmadd_ps(w, x, self.acc[t]);
        }
    }
}

/// Stores each chunk: the row as f32.
struct Store<'o>(&'o mut [f32]);

impl Sink for Store<'_> {
    #[inline(always)]
    unsafe fn chunk(&mut self, w: __m512, i: usize) {
        _mm512_storeu_ps(self.0.as_mut_ptr().add(i), w);
    }
}

/// `row · xs[t]` for each token; `ty` one of [`has`]'s.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn dot_avx512<const T: usize>(
    ty: GgmlType,
    row: &[u8],
    xs: [&[f32]; T],
) -> [f32; T] {
    let mut dot = Dot {
        acc: [_mm512_setzero_ps(); T],
        xs,
    };
    decode(ty, row, &mut dot);
    let mut out = [0.0; T];
    for (o, acc) in out.iter_mut().zip(dot.acc) {
        let mut lanes = [0.0f32; LANES];
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
        *o = crate::dot::reduce_lanes(lanes);
    }
    out
}

/// The row's values into `out`; `ty` one of [`has`]'s.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn dequant_avx512(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    decode(ty, row, &mut Store(out));
}

/// 16 bytes as 16 f32, zero-extended.
#[inline(always)]
unsafe fn u8x16_f32(v: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
}

/// Decodes every block of `row` into `sink`, 16 elements at a time, in order.
#[inline(always)]
unsafe fn decode<S: Sink>(ty: GgmlType, row: &[u8], sink: &mut S) {
    let (bs, bb) = ty.block();
    for blk in 0..row.len() / bb {
        let b = row.as_ptr().add(blk * bb);
        let base = blk * bs;
        match ty {
            GgmlType::Q8_0 => {
                // (q as f32) * d
                let d = _mm512_set1_ps(f16_at(b, 0));
                for c in 0..2 {
                    let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2 + 16 * c).cast()));
                    sink.chunk(_mm512_mul_ps(_mm512_cvtepi32_ps(q), d), base + 16 * c);
                }
            }
            GgmlType::Q4_0 => {
                // d * (nibble - 8); low nibbles are elements 0..16, high 16..32.
                let d = _mm512_set1_ps(f16_at(b, 0));
                let eight = _mm512_set1_epi32(8);
                for c in 0..2 {
                    let q = _mm512_cvtepu8_epi32(nibbles(b.add(2), c == 1));
                    let q = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, eight));
                    sink.chunk(_mm512_mul_ps(d, q), base + 16 * c);
                }
            }
            GgmlType::Q4_K => {
                // Sub-block k of 32: dl * q - ml, dl = d * sc[k], ml = dmin * mn[k]; q the
                // nibble k % 2 of qs[k / 2 * 32 + j].
                let head = std::slice::from_raw_parts(b, 16);
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, mn) = coli_core::gguf::quants::k_scale_min(&head[4..16]);
                let qs = b.add(16);
                for k in 0..8 {
                    let dl = _mm512_set1_ps(d * sc[k] as f32);
                    let ml = _mm512_set1_ps(dmin * mn[k] as f32);
                    for c in 0..2 {
                        let j = 16 * c;
                        let q = u8x16_f32(nibbles(qs.add(k / 2 * 32 + j), k % 2 == 1));
                        let w = _mm512_sub_ps(_mm512_mul_ps(dl, q), ml);
                        sink.chunk(w, base + 32 * k + j);
                    }
                }
            }
            _ => unreachable!("no AVX-512 decoder for {ty:?} (see `has`)"),
        }
    }
}
