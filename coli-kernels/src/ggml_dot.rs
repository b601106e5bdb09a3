//! Fused dot products of GGUF block rows: each block decoded in registers, 16 elements at
//! a time, and multiplied into the accumulators at once (no f32 row staged in memory).
//!
//! The reduction order is [`crate::dot`]'s, unchanged: element `i` of the row goes into
//! lane `i % 16` with one fused multiply-add, in increasing `i`, then the fixed halving
//! tree. Element `i`'s value is computed with the operations of
//! [`coli_core::gguf::quants`] (gguf-py's definition) in their order (Q4_K's
//! `dl * q - ml` a multiplication then a subtraction, never fused), so the result equals
//! [`crate::dot::dot_scalar`] bit for bit: the reference is the f32 chain over the row as
//! [`coli_core::gguf::dequantize`] decodes it. A block is 32 or 256 elements, a multiple
//! of 16, so a 16-element chunk always fills lanes 0..16 in order.
//!
//! Fused types: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K (what Q4_K_M, Q5_K_M, Q6_K and Q8_0
//! files are made of). The AVX2 kernel serves AVX-512 machines too; other types and the
//! scalar ISA take the dequantizing path.

use coli_core::gguf::GgmlType;

use crate::cpu::Isa;

/// Whether rows of `ty` have a fused kernel.
pub fn fused(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
    )
}

/// `row · xs[t]` for each of `T` tokens, on `isa`; `None` when `ty` or `isa` has no fused
/// kernel (the caller then dequantizes).
///
/// # Panics
/// If the row is not whole blocks of `ty` for the activations' length.
pub fn dot_tokens<const T: usize>(
    isa: Isa,
    ty: GgmlType,
    row: &[u8],
    xs: [&[f32]; T],
) -> Option<[f32; T]> {
    let k = xs.first().map_or(0, |x| x.len());
    for x in xs {
        assert_eq!(x.len(), k, "ggml dot: activations of different lengths");
    }
    assert_eq!(
        row.len(),
        ty.row_bytes(k),
        "ggml dot: row bytes do not match"
    );
    assert!(k.is_multiple_of(ty.block().0), "ggml dot: not whole blocks");
    if !fused(ty) {
        return None;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if crate::cpu::supports(Isa::Avx2) => {
            // SAFETY: AVX2+FMA+F16C are present (checked); the row holds k / bs whole blocks
            // and every x has k elements (checked above).
            Some(unsafe { x86::dot_avx2(ty, row, xs) })
        }
        _ => None,
    }
}

/// `row`'s values (whole blocks of `ty`) into `out`, decoded as [`dot_tokens`] decodes
/// them: the values [`coli_core::gguf::dequantize`] gives, bit for bit. `false` (nothing
/// written) when `ty` or `isa` has no such kernel.
///
/// # Panics
/// If `out` does not hold the row's elements.
pub fn dequant_row(isa: Isa, ty: GgmlType, row: &[u8], out: &mut [f32]) -> bool {
    let (bs, bb) = ty.block();
    assert_eq!(
        row.len() / bb * bs,
        out.len(),
        "ggml dequant: row and output differ"
    );
    assert!(
        row.len().is_multiple_of(bb),
        "ggml dequant: not whole blocks"
    );
    if !fused(ty) {
        return false;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if crate::cpu::supports(Isa::Avx2) => {
            // SAFETY: AVX2+FMA+F16C are present (checked); `out` holds the row's elements.
            unsafe { x86::dequant_avx2(ty, row, out) };
            true
        }
        _ => false,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::GgmlType;
    use crate::dot::LANES;
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
        let mut out = [0.0; T];
        for (o, acc) in out.iter_mut().zip(dot.acc) {
            let mut lanes = [0.0f32; LANES];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
            *o = crate::dot::reduce_lanes(lanes);
        }
        out
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
        let n_blocks = row.len() / bb;
        for blk in 0..n_blocks {
            let b = row.as_ptr().add(blk * bb);
            let base = blk * bs;
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
                                let bit = _mm_and_si128(
                                    _mm_srl_epi16(h, _mm_cvtsi32_si128(k as i32)),
                                    mask1,
                                );
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
                _ => unreachable!("not a fused type"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu;
    use proptest::prelude::*;

    fn rows_of(ty: GgmlType, blocks: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        (0..blocks)
            .flat_map(|_| coli_core::fuzzing::random_block(ty, &mut next))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Every fused type, ISA and token count: the bits of the reference chain over the
        /// row as gguf-py's definition decodes it; and the decoded row, gguf-py's values.
        #[test]
        fn fused_equals_the_dequantized_chain(ty_i in 0usize..6, blocks in 1usize..5, seed in any::<u64>()) {
            let ty = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K][ty_i];
            let k = blocks * ty.block().0;
            let row = rows_of(ty, blocks, seed);
            let x: Vec<f32> = (0..3 * k).map(|i| (((i as u64 * 2654435761) ^ seed) % 2000) as f32 / 997.0 - 1.0).collect();
            let (x0, x1, x2) = (&x[..k], &x[k..2 * k], &x[2 * k..]);
            let want = [x0, x1, x2].map(|x| crate::dot::dot_scalar(crate::dot::WFormat::Ggml(ty), &row, x).to_bits());
            for isa in cpu::available() {
                if let Some(got) = dot_tokens(isa, ty, &row, [x0]) {
                    prop_assert_eq!(got[0].to_bits(), want[0], "{:?} {:?}", ty, isa);
                }
                if let Some(got) = dot_tokens(isa, ty, &row, [x0, x1, x2]) {
                    prop_assert_eq!(got.map(f32::to_bits), want, "{:?} {:?}", ty, isa);
                }
            }
            let mut want_values = vec![0.0f32; k];
            coli_core::gguf::dequantize(ty, &row, &mut want_values).unwrap();
            for isa in cpu::available() {
                let mut got = vec![f32::NAN; k];
                if dequant_row(isa, ty, &row, &mut got) {
                    prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want_values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{:?} {:?}", ty, isa);
                }
            }
            // Some ISA of an x86 machine has the kernel.
            #[cfg(target_arch = "x86_64")]
            prop_assert!(!cpu::supports(Isa::Avx2) || dot_tokens(Isa::Avx2, ty, &row, [x0]).is_some());
        }
    }
}
