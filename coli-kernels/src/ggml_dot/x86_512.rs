//! The AVX-512 decoder of [`super`] for the block types most GGUF downloads are made of
//! (Q8_0, Q4_0, Q4_K, Q6_K): 16 elements per `zmm`, so the reduction's 16 lanes are one
//! register and each token's chunk is one fused multiply-add (the AVX2 decoder splits it
//! into two 8-lane halves). Each element's value is computed with the scalar
//! definition's operations in its order, lane `i % 16` as there: the same bits. Other
//! types take the AVX2 decoder.
//!
//! One row's dot product is a single chain of multiply-adds, bound by their latency, so
//! the decoder takes `R` rows at once and interleaves them chunk by chunk (chunk `c` of
//! every row before chunk `c + 1` of any): `R` independent chains, each row's in its own
//! order. The 4-bit types look their values up (`vpermps` over the 16 values a nibble
//! can take, each computed once per scale with the reference's operations) instead of
//! converting and scaling every element.

use super::GgmlType;
use crate::dot::LANES;
use std::arch::x86_64::*;

/// Whether `ty` has an AVX-512 decoder here.
pub(super) fn has(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::Q6_K
    )
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
    let mut dot = [Dot {
        acc: [_mm512_setzero_ps(); T],
        xs,
    }];
    decode(ty, [row], &mut dot, &[]);
    let [dot] = dot;
    dot.acc.map(|acc| reduce(acc))
}

/// `rows[r] · x` for `R` rows of `ty` (one of [`has`]'s, equal lengths), interleaved
/// chunk by chunk: each result is the single row's bit for bit. `next` (the bytes read
/// after these rows) is prefetched alongside.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_avx512<const R: usize>(
    ty: GgmlType,
    rows: [&[u8]; R],
    x: &[f32],
    next: &[u8],
) -> [f32; R] {
    let mut dots: [Dot<1>; R] = std::array::from_fn(|_| Dot {
        acc: [_mm512_setzero_ps()],
        xs: [x],
    });
    decode(ty, rows, &mut dots, next);
    dots.map(|d| reduce(d.acc[0]))
}

/// The row's values into `out`; `ty` one of [`has`]'s.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn dequant_avx512(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    decode(ty, [row], &mut [Store(out)], &[]);
}

/// The 16 lanes' sum in [`crate::dot::reduce_lanes`]'s order.
#[inline(always)]
unsafe fn reduce(acc: __m512) -> f32 {
    let mut lanes = [0.0f32; LANES];
    _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
    crate::dot::reduce_lanes(lanes)
}

/// The f16 at bytes `i..i + 2` of `b`, by F16C (exact, as every f16 is an f32).
#[inline(always)]
unsafe fn f16_at(b: *const u8, i: usize) -> f32 {
    let bits = u16::from_le_bytes([*b.add(i), *b.add(i + 1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
unsafe fn u32_at(b: *const u8, i: usize) -> u32 {
    u32::from_le_bytes([*b.add(i), *b.add(i + 1), *b.add(i + 2), *b.add(i + 3)])
}

/// `0.0, 1.0, .., 15.0`: every nibble as f32.
#[inline(always)]
unsafe fn iota() -> __m512 {
    _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    )
}

/// The 16 bytes at `p`, each widened to an i32 lane (zero-extended).
#[inline(always)]
unsafe fn widen_u8(p: *const u8) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()))
}

/// The 8 bytes of `v` (little-endian) as f32 times `d`, one multiplication each.
#[inline(always)]
unsafe fn scaled8(v: u64, d: f32) -> [f32; 8] {
    let f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
    let mut out = [0.0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(d), f));
    out
}

/// Q4_K's eight `d * scale` and `dmin * min` of the block at `b`: the 6-bit fields of
/// [`coli_core::gguf::quants::k_scale_min`], unpacked four bytes at a time.
#[inline(always)]
unsafe fn q4k_scales(b: *const u8) -> ([f32; 8], [f32; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let u = [u32_at(b, 4), u32_at(b, 8), u32_at(b, 12)];
    let sc_lo = u[0] & LOW6;
    let sc_hi = (u[2] & LOW4) | (((u[0] >> 6) & LOW2) << 4);
    let mn_lo = u[1] & LOW6;
    let mn_hi = ((u[2] >> 4) & LOW4) | (((u[1] >> 6) & LOW2) << 4);
    let sc = sc_lo as u64 | (sc_hi as u64) << 32;
    let mn = mn_lo as u64 | (mn_hi as u64) << 32;
    (scaled8(sc, d), scaled8(mn, dmin))
}

/// Q4_K's 16 values of sub-block `k` (`s` from [`q4k_scales`]): `dl * q - ml` for
/// each nibble `q`, a multiplication then a subtraction as the reference.
#[inline(always)]
unsafe fn q4k_table(s: &([f32; 8], [f32; 8]), k: usize, iota: __m512) -> __m512 {
    let dl = _mm512_set1_ps(s.0[k]);
    _mm512_sub_ps(_mm512_mul_ps(dl, iota), _mm512_set1_ps(s.1[k]))
}

/// Q6_K's `q - 32` (i8) of elements `128 * h + 64 * g ..+ 64` of the block at `b`:
/// low nibbles `ql[64 * h + j] >> 4 * g`, high bits `qh[32 * h + j % 32] >> 2 * (j / 32
/// + 2 * g)`, as the scalar definition indexes them.
#[inline(always)]
unsafe fn q6k_group(b: *const u8, h: usize, g: usize) -> __m512i {
    let low4 = _mm512_set1_epi8(0x0f);
    let ql = _mm512_loadu_si512(b.add(64 * h).cast());
    let lo = if g == 1 {
        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4)
    } else {
        _mm512_and_si512(ql, low4)
    };
    // Both 32-byte halves hold qh[32 h..32 h + 32]; the first half shifts by 4 g, the
    // second by 4 g + 2 (16-bit shifts, masked per byte afterwards).
    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(128 + 32 * h).cast()));
    let s = (4 * g) as i16;
    let shift = _mm512_inserti64x4::<1>(_mm512_set1_epi16(s), _mm256_set1_epi16(s + 2));
    let hi = _mm512_and_si512(_mm512_srlv_epi16(qh, shift), _mm512_set1_epi8(3));
    let q = _mm512_or_si512(lo, _mm512_slli_epi16::<4>(hi));
    _mm512_sub_epi8(q, _mm512_set1_epi8(32))
}

/// Decodes every block of `R` rows (equal lengths) into their sinks, 16 elements at a
/// time, each row in order, the rows interleaved chunk by chunk; `next`'s share of the
/// `R` blocks' bytes prefetched with each block.
#[inline(always)]
unsafe fn decode<S: Sink, const R: usize>(
    ty: GgmlType,
    rows: [&[u8]; R],
    sinks: &mut [S; R],
    next: &[u8],
) {
    let (bs, bb) = ty.block();
    for blk in 0..rows[0].len() / bb {
        super::prefetch(next, blk * R * bb, R * bb);
        let mut b = [std::ptr::null(); R];
        for r in 0..R {
            b[r] = rows[r].as_ptr().add(blk * bb);
        }
        let base = blk * bs;
        match ty {
            GgmlType::Q8_0 => {
                // (q as f32) * d
                let mut d = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    d[r] = _mm512_set1_ps(f16_at(b[r], 0));
                }
                for c in 0..2 {
                    for r in 0..R {
                        let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(b[r].add(2 + 16 * c).cast()));
                        let w = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d[r]);
                        sinks[r].chunk(w, base + 16 * c);
                    }
                }
            }
            GgmlType::Q4_0 => {
                // d * (nibble - 8); low nibbles are elements 0..16, high 16..32. The table:
                // d times each nibble - 8 (exact as f32), the reference's multiplication.
                let minus_eight = _mm512_sub_ps(iota(), _mm512_set1_ps(8.0));
                let (mut t, mut q) = ([_mm512_setzero_ps(); R], [_mm512_setzero_si512(); R]);
                for r in 0..R {
                    t[r] = _mm512_mul_ps(_mm512_set1_ps(f16_at(b[r], 0)), minus_eight);
                    q[r] = widen_u8(b[r].add(2));
                }
                for r in 0..R {
                    sinks[r].chunk(_mm512_permutexvar_ps(q[r], t[r]), base);
                }
                for r in 0..R {
                    let hi = _mm512_srli_epi32::<4>(q[r]);
                    sinks[r].chunk(_mm512_permutexvar_ps(hi, t[r]), base + 16);
                }
            }
            GgmlType::Q4_K => {
                // Sub-block k of 32: dl * q - ml, dl = d * sc[k], ml = dmin * mn[k]; q the
                // nibble k % 2 of qs[k / 2 * 32 + j]. One widening of 16 bytes serves both
                // sub-blocks of a pair (low nibbles: k, high: k + 1).
                let mut s = [([0.0f32; 8], [0.0f32; 8]); R];
                for r in 0..R {
                    s[r] = q4k_scales(b[r]);
                }
                let iota = iota();
                for pair in 0..4 {
                    let (mut lo, mut hi) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
                    let (mut q0, mut q1) =
                        ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
                    for r in 0..R {
                        lo[r] = q4k_table(&s[r], 2 * pair, iota);
                        hi[r] = q4k_table(&s[r], 2 * pair + 1, iota);
                        let p = b[r].add(16 + 32 * pair);
                        q0[r] = widen_u8(p);
                        q1[r] = widen_u8(p.add(16));
                    }
                    let e = base + 64 * pair;
                    for r in 0..R {
                        sinks[r].chunk(_mm512_permutexvar_ps(q0[r], lo[r]), e);
                    }
                    for r in 0..R {
                        sinks[r].chunk(_mm512_permutexvar_ps(q1[r], lo[r]), e + 16);
                    }
                    for r in 0..R {
                        let q = _mm512_srli_epi32::<4>(q0[r]);
                        sinks[r].chunk(_mm512_permutexvar_ps(q, hi[r]), e + 32);
                    }
                    for r in 0..R {
                        let q = _mm512_srli_epi32::<4>(q1[r]);
                        sinks[r].chunk(_mm512_permutexvar_ps(q, hi[r]), e + 48);
                    }
                }
            }
            GgmlType::Q6_K => {
                // Element e: (d * scale[e / 16]) * (q - 32), q 6 bits (see `q6k_group`);
                // the 16 scales times d computed at once, the same multiplications.
                let mut dl = [[0.0f32; 16]; R];
                for r in 0..R {
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(b[r].add(192).cast()));
                    let d = _mm512_set1_ps(f16_at(b[r], 208));
                    let v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
                    _mm512_storeu_ps(dl[r].as_mut_ptr(), v);
                }
                let mut q = [[0u8; 64]; R];
                for h in 0..2 {
                    for g in 0..2 {
                        for r in 0..R {
                            let v = q6k_group(b[r], h, g);
                            _mm512_storeu_si512(q[r].as_mut_ptr().cast(), v);
                        }
                        for c in 0..4 {
                            let s = 8 * h + 4 * g + c;
                            for r in 0..R {
                                let v = _mm_loadu_si128(q[r].as_ptr().add(16 * c).cast());
                                let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
                                let w = _mm512_mul_ps(_mm512_set1_ps(dl[r][s]), v);
                                sinks[r].chunk(w, base + 16 * s);
                            }
                        }
                    }
                }
            }
            _ => unreachable!("no AVX-512 decoder for {ty:?} (see `has`)"),
        }
    }
}
