//! The AVX2 decoder of [`super`]: every block type, 16 elements at a time, into a sink
//! (the dot product's accumulators or a row of f32).

use super::GgmlType;
use crate::dot::LANES;
use coli_core::gguf::quants;
use coli_core::gguf::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use std::arch::x86_64::*;

#[inline(always)]
fn f16_at(b: *const u8, i: usize) -> f32 {
    // SAFETY: the caller's block holds bytes i and i + 1.
    let bits = unsafe { u16::from_le_bytes([*b.add(i), *b.add(i + 1)]) };
    half::f16::from_bits(bits).to_f32()
}

/// Adds chunk `(w0, w1)` (elements `i..i + 16`) times each token's `x[i..i + 16]`.
#[inline(always)]
unsafe fn fma16<const T: usize>(
    acc: &mut [[__m256; 2]; T],
    w0: __m256,
    w1: __m256,
    xs: &[&[f32]; T],
    i: usize,
) {
    for t in 0..T {
        let p = xs[t].as_ptr().add(i);
        acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(p), acc[t][0]);
        acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(p.add(8)), acc[t][1]);
    }
}

/// 16 bytes as two vectors of 8 i32 (zero-extended).
#[inline(always)]
unsafe fn u8x16_to_i32(v: __m128i) -> (__m256i, __m256i) {
    (
        _mm256_cvtepu8_epi32(v),
        _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)),
    )
}

/// 16 bytes as two vectors of 8 i32 (sign-extended).
#[inline(always)]
unsafe fn i8x16_to_i32(v: __m128i) -> (__m256i, __m256i) {
    (
        _mm256_cvtepi8_epi32(v),
        _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)),
    )
}

/// The 16 low (`hi == false`) or high nibbles of 16 bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8, hi: bool) -> __m128i {
    let v = _mm_loadu_si128(p.cast());
    let v = if hi { _mm_srli_epi16(v, 4) } else { v };
    _mm_and_si128(v, _mm_set1_epi8(0x0f))
}

#[inline(always)]
unsafe fn cvt(v: (__m256i, __m256i)) -> (__m256, __m256) {
    (_mm256_cvtepi32_ps(v.0), _mm256_cvtepi32_ps(v.1))
}

/// The low 8 bytes of `v` as f32 (zero-extended).
#[inline(always)]
unsafe fn u8x8_f32(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
}

/// The low 8 bytes of `v` as f32 (sign-extended).
#[inline(always)]
unsafe fn i8x8_f32(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// An 8-byte grid entry at `p`, in the low half.
#[inline(always)]
unsafe fn load8(p: *const u8) -> __m128i {
    _mm_loadl_epi64(p.cast())
}

/// Two 4-byte grid entries side by side, in the low half.
#[inline(always)]
unsafe fn two4(a: &[u8; 4], b: &[u8; 4]) -> __m128i {
    _mm_set_epi32(0, 0, i32::from_le_bytes(*b), i32::from_le_bytes(*a))
}

/// Lane `i`: `-1.0` where bit `i` of `bits` is set, else `1.0` (the reference
/// multiplies by these).
#[inline(always)]
unsafe fn signs8(bits: u8) -> __m256 {
    let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits as i32), bit), bit);
    let sign = _mm256_and_si256(set, _mm256_set1_epi32(i32::MIN));
    _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_castsi256_ps(sign))
}

/// Byte `i`: `val` where bit `i` of `bits` is set, else 0.
#[inline(always)]
unsafe fn bits16_bytes(bits: u16, val: i8) -> __m128i {
    let v = _mm_shuffle_epi8(
        _mm_set1_epi16(bits as i16),
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
    );
    let bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    let set = _mm_cmpeq_epi8(_mm_and_si128(v, bit), bit);
    _mm_and_si128(set, _mm_set1_epi8(val))
}

/// Byte `i`: `table[idx[i]]` (every index below 16).
#[inline(always)]
unsafe fn lut16(table: &[i8; 16], idx: __m128i) -> __m128i {
    _mm_shuffle_epi8(_mm_loadu_si128(table.as_ptr().cast()), idx)
}

/// The 2-bit fields `(v >> shift) & 3` of 16 bytes at `p`.
#[inline(always)]
unsafe fn crumbs(p: *const u8, shift: usize) -> __m128i {
    let v = _mm_loadu_si128(p.cast());
    _mm_and_si128(
        _mm_srl_epi16(v, _mm_cvtsi32_si128(shift as i32)),
        _mm_set1_epi8(3),
    )
}

#[inline(always)]
fn u16_at(b: *const u8, i: usize) -> u16 {
    // SAFETY: the caller's block holds bytes i and i + 1.
    unsafe { u16::from_le_bytes([*b.add(i), *b.add(i + 1)]) }
}

#[inline(always)]
fn u32_at(b: *const u8, i: usize) -> u32 {
    // SAFETY: the caller's block holds bytes i..i + 4.
    unsafe { u32::from_le_bytes([*b.add(i), *b.add(i + 1), *b.add(i + 2), *b.add(i + 3)]) }
}

/// What is done with each decoded chunk: elements `i..i + 16` as two vectors.
pub(super) trait Sink {
    unsafe fn chunk(&mut self, w0: __m256, w1: __m256, i: usize);
}

/// Multiplies each chunk into the accumulators of `T` tokens.
struct Dot<'x, const T: usize> {
    acc: [[__m256; 2]; T],
    xs: [&'x [f32]; T],
}

impl<const T: usize> Sink for Dot<'_, T> {
    #[inline(always)]
    unsafe fn chunk(&mut self, w0: __m256, w1: __m256, i: usize) {
        fma16(&mut self.acc, w0, w1, &self.xs, i);
    }
}

/// Stores each chunk: the row as f32.
struct Store<'o>(&'o mut [f32]);

impl Sink for Store<'_> {
    #[inline(always)]
    unsafe fn chunk(&mut self, w0: __m256, w1: __m256, i: usize) {
        let p = self.0.as_mut_ptr().add(i);
        _mm256_storeu_ps(p, w0);
        _mm256_storeu_ps(p.add(8), w1);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_avx2<const T: usize>(
    ty: GgmlType,
    row: &[u8],
    xs: [&[f32]; T],
) -> [f32; T] {
    let mut dot = Dot {
        acc: [[_mm256_setzero_ps(); 2]; T],
        xs,
    };
    decode(ty, row, &mut dot);
    dot.acc.map(|acc| reduce(acc))
}

/// The 16 lanes' sum in [`crate::dot::reduce_lanes`]'s order.
#[inline(always)]
unsafe fn reduce(acc: [__m256; 2]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
    crate::dot::reduce_lanes(lanes)
}

/// `rows[r] · x` for `R` rows of `ty` (equal lengths), the rows' blocks decoded in turn
/// (block `b` of every row before block `b + 1` of any): `R` independent accumulator
/// chains where one row has one, each in [`dot_avx2`]'s order, so each result is the
/// single row's bit for bit. `next` (the bytes read after these rows) is prefetched
/// alongside.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_avx2<const R: usize>(
    ty: GgmlType,
    rows: [&[u8]; R],
    x: &[f32],
    next: &[u8],
) -> [f32; R] {
    let (bs, bb) = ty.block();
    let mut dots: [Dot<1>; R] = std::array::from_fn(|_| Dot {
        acc: [[_mm256_setzero_ps(); 2]],
        xs: [x],
    });
    for blk in 0..rows[0].len() / bb {
        super::prefetch(next, blk * R * bb, R * bb);
        for (row, dot) in rows.iter().zip(dots.iter_mut()) {
            decode_block(ty, row.as_ptr().add(blk * bb), blk * bs, dot);
        }
    }
    dots.map(|d| reduce(d.acc[0]))
}

/// The row's values into `out` (`row`'s element count).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant_avx2(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    decode(ty, row, &mut Store(out));
}

/// Decodes every block of `row` into `sink`, 16 elements at a time, in order.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn decode<S: Sink>(ty: GgmlType, row: &[u8], sink: &mut S) {
    let (bs, bb) = ty.block();
    for blk in 0..row.len() / bb {
        decode_block(ty, row.as_ptr().add(blk * bb), blk * bs, sink);
    }
}

/// Decodes the block at `b` (elements `base..base + block size` of its row) into `sink`,
/// 16 elements at a time, in order.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn decode_block<S: Sink>(ty: GgmlType, b: *const u8, base: usize, sink: &mut S) {
    match ty {
        GgmlType::Q8_0 => {
            // (q as f32) * d
            let d = _mm256_set1_ps(f16_at(b, 0));
            for c in 0..2 {
                let q = cvt(i8x16_to_i32(_mm_loadu_si128(b.add(2 + 16 * c).cast())));
                let (w0, w1) = (_mm256_mul_ps(q.0, d), _mm256_mul_ps(q.1, d));
                sink.chunk(w0, w1, base + 16 * c);
            }
        }
        GgmlType::Q4_0 => {
            // d * (nibble - 8); low nibbles are elements 0..16, high 16..32.
            let d = _mm256_set1_ps(f16_at(b, 0));
            let eight = _mm256_set1_epi32(8);
            for c in 0..2 {
                let q = u8x16_to_i32(nibbles(b.add(2), c == 1));
                let q = cvt((_mm256_sub_epi32(q.0, eight), _mm256_sub_epi32(q.1, eight)));
                let (w0, w1) = (_mm256_mul_ps(d, q.0), _mm256_mul_ps(d, q.1));
                sink.chunk(w0, w1, base + 16 * c);
            }
        }
        GgmlType::Q4_1 => {
            // d * nibble + m
            let d = _mm256_set1_ps(f16_at(b, 0));
            let m = _mm256_set1_ps(f16_at(b, 2));
            for c in 0..2 {
                let q = cvt(u8x16_to_i32(nibbles(b.add(4), c == 1)));
                let w0 = _mm256_add_ps(_mm256_mul_ps(d, q.0), m);
                let w1 = _mm256_add_ps(_mm256_mul_ps(d, q.1), m);
                sink.chunk(w0, w1, base + 16 * c);
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // Sub-block k of 32: dl * q - ml, dl = d * sc[k], ml = dmin * mn[k];
            // q the nibble k % 2 of qs[k / 2 * 32 + j] (Q5_K: | bit k of qh[j] << 4).
            let head = std::slice::from_raw_parts(b, 16);
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (sc, mn) = coli_core::gguf::quants::k_scale_min(&head[4..16]);
            let (qh, qs) = if ty == GgmlType::Q5_K {
                (Some(b.add(16)), b.add(48))
            } else {
                (None, b.add(16))
            };
            let mask1 = _mm_set1_epi8(1);
            for k in 0..8 {
                let dl = _mm256_set1_ps(d * sc[k] as f32);
                let ml = _mm256_set1_ps(dmin * mn[k] as f32);
                for c in 0..2 {
                    let j = 16 * c;
                    let mut q = nibbles(qs.add(k / 2 * 32 + j), k % 2 == 1);
                    if let Some(qh) = qh {
                        let h = _mm_loadu_si128(qh.add(j).cast());
                        // (qh[j] >> k) & 1, then << 4: per byte through 16-bit
                        // shifts and a mask (no bit crosses a byte after the mask).
                        let bit =
                            _mm_and_si128(_mm_srl_epi16(h, _mm_cvtsi32_si128(k as i32)), mask1);
                        q = _mm_or_si128(q, _mm_slli_epi16(bit, 4));
                    }
                    let q = cvt(u8x16_to_i32(q));
                    let w0 = _mm256_sub_ps(_mm256_mul_ps(dl, q.0), ml);
                    let w1 = _mm256_sub_ps(_mm256_mul_ps(dl, q.1), ml);
                    sink.chunk(w0, w1, base + 32 * k + j);
                }
            }
        }
        GgmlType::Q6_K => {
            // Element e: h = e / 128, r = e % 128; lo = ql[h*64 + r%64] >> 4*(r/64)
            // & 15; hi = qh[h*32 + r%32] >> 2*(r/32) & 3; q = (lo | hi << 4) - 32;
            // value (d * scale[e / 16]) * q.
            let d = f16_at(b, 208);
            let (ql, qh, scales) = (b, b.add(128), b.add(192));
            let mask3 = _mm_set1_epi8(3);
            let thirty_two = _mm256_set1_epi32(32);
            for s in 0..16 {
                let e = 16 * s;
                let (h, r) = (e / 128, e % 128);
                let lo = nibbles(ql.add(h * 64 + r % 64), r / 64 == 1);
                let hv = _mm_loadu_si128(qh.add(h * 32 + r % 32).cast());
                let shift = _mm_cvtsi32_si128(2 * (r / 32) as i32);
                let hi = _mm_and_si128(_mm_srl_epi16(hv, shift), mask3);
                let q = u8x16_to_i32(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
                let q = cvt((
                    _mm256_sub_epi32(q.0, thirty_two),
                    _mm256_sub_epi32(q.1, thirty_two),
                ));
                let dl = _mm256_set1_ps(d * (*scales.add(s) as i8) as f32);
                let (w0, w1) = (_mm256_mul_ps(dl, q.0), _mm256_mul_ps(dl, q.1));
                sink.chunk(w0, w1, base + e);
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            // q = nibble | bit j of qh << 4; Q5_0: d * (q - 16), Q5_1: d * q + m.
            let q5_1 = ty == GgmlType::Q5_1;
            let d = _mm256_set1_ps(f16_at(b, 0));
            let m = _mm256_set1_ps(if q5_1 { f16_at(b, 2) } else { 0.0 });
            let at = if q5_1 { 4 } else { 2 };
            let qh = u32_at(b, at);
            let sixteen = _mm256_set1_epi32(16);
            for c in 0..2 {
                let lo = nibbles(b.add(at + 4), c == 1);
                let hi = bits16_bytes((qh >> (16 * c)) as u16, 0x10);
                let q = u8x16_to_i32(_mm_or_si128(lo, hi));
                let (w0, w1) = if q5_1 {
                    let q = cvt(q);
                    (
                        _mm256_add_ps(_mm256_mul_ps(d, q.0), m),
                        _mm256_add_ps(_mm256_mul_ps(d, q.1), m),
                    )
                } else {
                    let q = cvt((
                        _mm256_sub_epi32(q.0, sixteen),
                        _mm256_sub_epi32(q.1, sixteen),
                    ));
                    (_mm256_mul_ps(d, q.0), _mm256_mul_ps(d, q.1))
                };
                sink.chunk(w0, w1, base + 16 * c);
            }
        }
        GgmlType::Q2_K | GgmlType::Q3_K => {
            // Element e = 16 n + i: h = e / 128, s = e % 128 / 32, j = e % 32;
            // q = qs[h*32 + j] >> 2s & 3. Q2_K: (d * (sc & 15)) * q - dmin * (sc >> 4)
            // with sc = scales[n]; Q3_K: dl[n] * (q - 4 * !(hmask[j] >> e/32 & 1)).
            let q3 = ty == GgmlType::Q3_K;
            let qs = b.add(if q3 { 32 } else { 16 });
            let mut dl3 = [0.0f32; 16];
            if q3 {
                let (sc, d) = (b.add(96), f16_at(b, 108));
                for (k, v) in dl3.iter_mut().enumerate() {
                    let lo = (*sc.add(k % 8) >> (4 * (k / 8))) & 0x0f;
                    let hi = (*sc.add(8 + k % 4) >> (2 * (k / 4))) & 3;
                    *v = d * (((lo | (hi << 4)) as i8 - 32) as f32);
                }
            }
            let (d, dmin) = if q3 {
                (0.0, 0.0)
            } else {
                (f16_at(b, 80), f16_at(b, 82))
            };
            let one = _mm_set1_epi8(1);
            for n in 0..16 {
                let e = 16 * n;
                let (h, sh, j) = (e / 128, (e % 128) / 32, e % 32);
                let q = crumbs(qs.add(h * 32 + j), 2 * sh);
                let (w0, w1) = if q3 {
                    let hm = _mm_loadu_si128(b.add(j).cast());
                    let hb =
                        _mm_and_si128(_mm_srl_epi16(hm, _mm_cvtsi32_si128((e / 32) as i32)), one);
                    let four = _mm_slli_epi16(_mm_xor_si128(hb, one), 2);
                    let (q, f) = (u8x16_to_i32(q), u8x16_to_i32(four));
                    let q = cvt((_mm256_sub_epi32(q.0, f.0), _mm256_sub_epi32(q.1, f.1)));
                    let dl = _mm256_set1_ps(dl3[n]);
                    (_mm256_mul_ps(dl, q.0), _mm256_mul_ps(dl, q.1))
                } else {
                    let sc = *b.add(n);
                    let dl = _mm256_set1_ps(d * (sc & 0x0f) as f32);
                    let ml = _mm256_set1_ps(dmin * (sc >> 4) as f32);
                    let q = cvt(u8x16_to_i32(q));
                    (
                        _mm256_sub_ps(_mm256_mul_ps(dl, q.0), ml),
                        _mm256_sub_ps(_mm256_mul_ps(dl, q.1), ml),
                    )
                };
                sink.chunk(w0, w1, base + e);
            }
        }
        GgmlType::IQ4_NL | GgmlType::MXFP4 => {
            // d * table[nibble]; low nibbles are elements 0..16, high 16..32.
            let (d, table, qs) = if ty == GgmlType::MXFP4 {
                (quants::e8m0_half(*b), &quants::MXFP4_VALUES, b.add(1))
            } else {
                (f16_at(b, 0), &quants::IQ4_VALUES, b.add(2))
            };
            let d = _mm256_set1_ps(d);
            for c in 0..2 {
                let q = cvt(i8x16_to_i32(lut16(table, nibbles(qs, c == 1))));
                sink.chunk(_mm256_mul_ps(d, q.0), _mm256_mul_ps(d, q.1), base + 16 * c);
            }
        }
        GgmlType::IQ4_XS => {
            // Sub-block k of 32: dl * IQ4_VALUES[nibble s of qs[16k + i]] at
            // 32k + 16s + i, dl = d * (6-bit scale - 32).
            let d = f16_at(b, 0);
            let sh = u16_at(b, 2);
            for k in 0..8 {
                let lo = (*b.add(4 + k / 2) >> (4 * (k % 2))) & 0x0f;
                let hi = ((sh >> (2 * k)) as u8) & 3;
                let dl = _mm256_set1_ps(d * (((lo | (hi << 4)) as i8 - 32) as f32));
                for s in 0..2 {
                    let idx = nibbles(b.add(8 + 16 * k), s == 1);
                    let q = cvt(i8x16_to_i32(lut16(&quants::IQ4_VALUES, idx)));
                    let (w0, w1) = (_mm256_mul_ps(dl, q.0), _mm256_mul_ps(dl, q.1));
                    sink.chunk(w0, w1, base + 32 * k + 16 * s);
                }
            }
        }
        GgmlType::IQ2_XXS => {
            // Group g of 32: db = d * (0.5 + aux >> 28) * 0.25; piece k of 8: grid
            // entry qs[8g + k], signs KSIGNS[aux >> 7k & 127]; (db * grid) * sign.
            let d = f16_at(b, 0);
            for g in 0..8 {
                let aux = u32_at(b, 2 + 8 * g + 4);
                let db = _mm256_set1_ps(d * (0.5 + (aux >> 28) as f32) * 0.25);
                for c in 0..2 {
                    let mut w = [_mm256_setzero_ps(); 2];
                    for (h, w) in w.iter_mut().enumerate() {
                        let k = 2 * c + h;
                        let grid = &IQ2XXS_GRID[*b.add(2 + 8 * g + k) as usize];
                        let signs = quants::KSIGNS[((aux >> (7 * k)) & 127) as usize];
                        let v = _mm256_mul_ps(db, u8x8_f32(load8(grid.as_ptr())));
                        *w = _mm256_mul_ps(v, signs8(signs));
                    }
                    sink.chunk(w[0], w[1], base + 32 * g + 16 * c);
                }
            }
        }
        GgmlType::IQ2_XS | GgmlType::IQ2_S => {
            // Piece l of 8: db = d * (0.5 + scale nibble (l/2) % 2 of byte l/4) * 0.25,
            // (db * grid) * sign. IQ2_XS: a u16 of a 9-bit index and KSIGNS index;
            // IQ2_S: a byte and 2 high bits of qh as index, a sign byte.
            let xs = ty == GgmlType::IQ2_XS;
            let d = f16_at(b, 0);
            let scales = b.add(if xs { 66 } else { 74 });
            for c in 0..16 {
                let s = (*scales.add(c / 2) >> (4 * (c % 2))) & 0x0f;
                let db = _mm256_set1_ps(d * (0.5 + s as f32) * 0.25);
                let mut w = [_mm256_setzero_ps(); 2];
                for (h, w) in w.iter_mut().enumerate() {
                    let l = 2 * c + h;
                    let (grid, signs) = if xs {
                        let q = u16_at(b, 2 + 2 * l);
                        (
                            &IQ2XS_GRID[(q & 511) as usize],
                            quants::KSIGNS[(q >> 9) as usize],
                        )
                    } else {
                        let hi = ((*b.add(66 + l / 4) >> (2 * (l % 4))) & 3) as usize;
                        (
                            &IQ2S_GRID[*b.add(2 + l) as usize | (hi << 8)],
                            *b.add(34 + l),
                        )
                    };
                    let v = _mm256_mul_ps(db, u8x8_f32(load8(grid.as_ptr())));
                    *w = _mm256_mul_ps(v, signs8(signs));
                }
                sink.chunk(w[0], w[1], base + 16 * c);
            }
        }
        GgmlType::IQ3_XXS => {
            // Group g of 32: db = d * (0.5 + aux >> 28) * 0.5; piece k of 8: grid
            // entries qs[8g + 2k], qs[8g + 2k + 1] (4 values each), signs
            // KSIGNS[aux >> 7k & 127].
            let d = f16_at(b, 0);
            for g in 0..8 {
                let aux = u32_at(b, 66 + 4 * g);
                let db = _mm256_set1_ps(d * (0.5 + (aux >> 28) as f32) * 0.5);
                for c in 0..2 {
                    let mut w = [_mm256_setzero_ps(); 2];
                    for (h, w) in w.iter_mut().enumerate() {
                        let k = 2 * c + h;
                        let q = b.add(2 + 8 * g + 2 * k);
                        let v = two4(&IQ3XXS_GRID[*q as usize], &IQ3XXS_GRID[*q.add(1) as usize]);
                        let signs = quants::KSIGNS[((aux >> (7 * k)) & 127) as usize];
                        *w = _mm256_mul_ps(_mm256_mul_ps(db, u8x8_f32(v)), signs8(signs));
                    }
                    sink.chunk(w[0], w[1], base + 32 * g + 16 * c);
                }
            }
        }
        GgmlType::IQ3_S => {
            // Piece p of 8 (elements 8p..): db = d * (1 + 2 * scale nibble of
            // sub-block p / 4); grid entries l = 2p, 2p + 1, each qs[l] | bit l of
            // qh << 8; sign byte p.
            let d = f16_at(b, 0);
            for c in 0..16 {
                let k = c / 2;
                let s = (*b.add(106 + k / 2) >> (4 * (k % 2))) & 0x0f;
                let db = _mm256_set1_ps(d * (1 + 2 * s) as f32);
                let mut w = [_mm256_setzero_ps(); 2];
                for (h, w) in w.iter_mut().enumerate() {
                    let p = 2 * c + h;
                    let mut e4 = [&IQ3S_GRID[0]; 2];
                    for (i, e4) in e4.iter_mut().enumerate() {
                        let l = 2 * p + i;
                        let hi = ((*b.add(66 + l / 8) >> (l % 8)) & 1) as usize;
                        *e4 = &IQ3S_GRID[*b.add(2 + l) as usize | (hi << 8)];
                    }
                    let v = _mm256_mul_ps(db, u8x8_f32(two4(e4[0], e4[1])));
                    *w = _mm256_mul_ps(v, signs8(*b.add(74 + p)));
                }
                sink.chunk(w[0], w[1], base + 16 * c);
            }
        }
        GgmlType::IQ1_S | GgmlType::IQ1_M => {
            // Piece l of 8: dl * (grid + delta), grid IQ1S_GRID[qs[l] | 3 bits << 8].
            // IQ1_S: per group of 4 pieces a u16 of the 3-bit extensions, the scale
            // 2 * (h >> 12 & 7) + 1 and delta's sign (bit 15). IQ1_M: per piece a
            // nibble of qh (extension, delta's sign), per pair of pieces a 3-bit
            // scale, d spread over the top nibbles of the four scale u16s.
            let m = ty == GgmlType::IQ1_M;
            let (qs, d) = if m {
                let s = [48, 50, 52, 54].map(|i| u16_at(b, i));
                let bits = ((s[0] & 0xf000) >> 12)
                    | ((s[1] & 0xf000) >> 8)
                    | ((s[2] & 0xf000) >> 4)
                    | (s[3] & 0xf000);
                (b, half::f16::from_bits(bits).to_f32())
            } else {
                (b.add(2), f16_at(b, 0))
            };
            for c in 0..16 {
                let mut w = [_mm256_setzero_ps(); 2];
                for (h, w) in w.iter_mut().enumerate() {
                    let l = 2 * c + h;
                    let (dl, ext, neg) = if m {
                        let sw = u16_at(b, 48 + 2 * (l / 8));
                        let sc = (sw >> (3 * ((l / 2) % 4))) & 7;
                        let v = *b.add(32 + l / 2) >> (4 * (l % 2));
                        (d * (2 * sc + 1) as f32, (v & 7) as usize, v & 8 != 0)
                    } else {
                        let hw = u16_at(b, 34 + 2 * (l / 4));
                        let dl = d * (2 * ((hw >> 12) & 7) + 1) as f32;
                        (dl, ((hw >> (3 * (l % 4))) & 7) as usize, hw & 0x8000 != 0)
                    };
                    let delta = _mm256_set1_ps(if neg {
                        -quants::IQ1_DELTA
                    } else {
                        quants::IQ1_DELTA
                    });
                    let grid = &IQ1S_GRID[*qs.add(l) as usize | (ext << 8)];
                    let g = i8x8_f32(load8(grid.as_ptr().cast()));
                    *w = _mm256_mul_ps(_mm256_set1_ps(dl), _mm256_add_ps(g, delta));
                }
                sink.chunk(w[0], w[1], base + 16 * c);
            }
        }
        _ => unreachable!("not a fused type"),
    }
}
