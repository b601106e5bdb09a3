//! Dequantization of one row of a scaled format to f32: element `c` becomes
//! `stored(c) * scale[c / block_cols]`, one exact conversion and one f32 multiplication.
//! Elementwise, so every instruction set gives the same bits; the wider paths are the
//! same code compiled with more vector features (selected at run time), except int4 and
//! FP4 on AVX-512 and int4 on AVX2, which have their own vector code (tested against the
//! definition).

use crate::cpu::{self, Isa};
use crate::dot::WFormat;

/// `float8_e4m3fn` → f32 with integer and float arithmetic only (no table), so loops over
/// it vectorize: normal values rebias the exponent, subnormals are `m * 2^-9` (exact),
/// `S.1111.111` is NaN. Equal to the table for all 256 bytes (tested).
#[inline(always)]
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let b = b as u32;
    let sign = (b & 0x80) << 24;
    let e = (b >> 3) & 0xF;
    let m = b & 7;
    let normal = f32::from_bits(sign | ((e + 120) << 23) | (m << 20));
    let sub = f32::from_bits(sign | (m as f32 * (1.0 / 512.0)).to_bits());
    let v = if e == 0 { sub } else { normal };
    if b & 0x7F == 0x7F {
        f32::from_bits(sign | 0x7FC0_0000)
    } else {
        v
    }
}

/// Both int4 values of a byte (low nibble first) as f32, unscaled.
const INT4_PAIRS: [[f32; 2]; 256] = {
    let mut t = [[0.0f32; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [((b & 15) as i32 - 8) as f32, ((b >> 4) as i32 - 8) as f32];
        b += 1;
    }
    t
};

/// Both `e2m1` values of a byte (low nibble first) as f32, unscaled.
const FP4_PAIRS: [[f32; 2]; 256] = {
    let v = crate::dot::FP4_E2M1_VALUES;
    let mut t = [[0.0f32; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [v[b & 15], v[b >> 4]];
        b += 1;
    }
    t
};

#[inline(always)]
fn dequant_generic(fmt: WFormat, row: &[u8], scales: &[f32], block: usize, out: &mut [f32]) {
    match fmt {
        WFormat::I8 => {
            for (b, (chunk, &s)) in out.chunks_mut(block).zip(scales).enumerate() {
                let q = &row[b * block..b * block + chunk.len()];
                for (o, &v) in chunk.iter_mut().zip(q) {
                    *o = (v as i8) as f32 * s;
                }
            }
        }
        WFormat::I4 | WFormat::F4E2M1 => {
            let table = if fmt == WFormat::I4 {
                &INT4_PAIRS
            } else {
                &FP4_PAIRS
            };
            for (b, (chunk, &s)) in out.chunks_mut(block).zip(scales).enumerate() {
                let c0 = b * block;
                if c0.is_multiple_of(2) {
                    // Whole bytes: low nibble then high nibble.
                    let bytes = &row[c0 / 2..(c0 + chunk.len()).div_ceil(2)];
                    let mut pairs = chunk.chunks_exact_mut(2);
                    for (pair, &byte) in (&mut pairs).zip(bytes) {
                        let [lo, hi] = table[byte as usize];
                        pair[0] = lo * s;
                        pair[1] = hi * s;
                    }
                    if let [last] = pairs.into_remainder() {
                        *last = table[bytes[bytes.len() - 1] as usize][0] * s;
                    }
                } else {
                    for (j, o) in chunk.iter_mut().enumerate() {
                        *o = fmt.load(row, c0 + j) * s;
                    }
                }
            }
        }
        WFormat::F8E4M3 => {
            for (b, (chunk, &s)) in out.chunks_mut(block).zip(scales).enumerate() {
                let q = &row[b * block..b * block + chunk.len()];
                for (o, &v) in chunk.iter_mut().zip(q) {
                    *o = fp8_e4m3_to_f32(v) * s;
                }
            }
        }
        _ => {
            for (b, (chunk, &s)) in out.chunks_mut(block).zip(scales).enumerate() {
                let c0 = b * block;
                for (j, o) in chunk.iter_mut().enumerate() {
                    *o = fmt.load(row, c0 + j) * s;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn dequant_avx512(fmt: WFormat, row: &[u8], scales: &[f32], block: usize, out: &mut [f32]) {
    if matches!(fmt, WFormat::I4 | WFormat::F4E2M1) && block.is_multiple_of(2) {
        return nibbles_avx512(fmt, row, scales, block, out);
    }
    dequant_generic(fmt, row, scales, block, out)
}

/// The sixteen values of a 4-bit format by nibble, unscaled: int4's `n - 8`, or e2m1's.
pub(crate) fn nibble_values(fmt: WFormat) -> [f32; 16] {
    if fmt == WFormat::I4 {
        std::array::from_fn(|n| INT4_PAIRS[n][0])
    } else {
        crate::dot::FP4_E2M1_VALUES
    }
}

/// Sixteen nibbles in element order as permute indices: `pairs` holds each byte twice
/// (`_mm_unpacklo_epi8(b, b)`), and lane i keeps the low nibble for even i, the high one
/// for odd i (a permute reads only an index's low 4 bits).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn nibble_indices16(
    pairs: std::arch::x86_64::__m128i,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    _mm512_srlv_epi32(_mm512_cvtepu8_epi32(pairs), shifts)
}

/// int4 and e2m1 rows with even blocks (every block starts on a byte): each block's sixteen
/// `value * scale` products computed once in a register (the definition's product), then
/// sixteen weights at a time are a permute of it by their nibbles; a block's last elements
/// short of sixteen take the table path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn nibbles_avx512(fmt: WFormat, row: &[u8], scales: &[f32], block: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let pairs = if fmt == WFormat::I4 {
        &INT4_PAIRS
    } else {
        &FP4_PAIRS
    };
    let levels = _mm512_loadu_ps(nibble_values(fmt).as_ptr());
    for (b, (chunk, &s)) in out.chunks_mut(block).zip(scales).enumerate() {
        let bytes = &row[b * block / 2..(b * block + chunk.len()).div_ceil(2)];
        let table = _mm512_mul_ps(levels, _mm512_set1_ps(s));
        let mut j = 0;
        while j + 16 <= chunk.len() {
            // SAFETY: bytes j/2..j/2 + 8 lie in this block's bytes (j + 16 <= its length).
            let q = _mm_loadl_epi64(bytes.as_ptr().add(j / 2).cast());
            let idx = nibble_indices16(_mm_unpacklo_epi8(q, q));
            _mm512_storeu_ps(chunk.as_mut_ptr().add(j), _mm512_permutexvar_ps(idx, table));
            j += 16;
        }
        for (k, o) in chunk.iter_mut().enumerate().skip(j) {
            *o = pairs[bytes[k / 2] as usize][k % 2] * s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dequant_avx2(fmt: WFormat, row: &[u8], scales: &[f32], block: usize, out: &mut [f32]) {
    if fmt == WFormat::I4 {
        return int4_avx2(row, scales, block, out);
    }
    dequant_generic(fmt, row, scales, block, out)
}

/// int4 on AVX2: eight weights per 32-bit word, each lane masking its nibble where it lies
/// and the scale carrying the lane's factor (the fused loop's [`int4x8`] and
/// [`int4_lane_scales`]), so `(n - 8) * s` with the generic path's bits. Blocks that do
/// not start on a word, the last elements of a block short of a word, and scales the lane
/// factors would round take the generic arithmetic.
///
/// [`int4x8`]: crate::qdot::avx2::int4x8
/// [`int4_lane_scales`]: crate::qdot::avx2::int4_lane_scales
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn int4_avx2(row: &[u8], scales: &[f32], block: usize, out: &mut [f32]) {
    use crate::qdot::avx2::{int4_lane_scales, int4_scale_exact, int4x8};
    use std::arch::x86_64::*;
    let cols = out.len();
    for (b, &s) in scales.iter().enumerate() {
        let (c0, c1) = (b * block, ((b + 1) * block).min(cols));
        let mut c = c0;
        if c0.is_multiple_of(8) && int4_scale_exact(s) {
            let sv = int4_lane_scales(s);
            while c + 8 <= c1 {
                let w = _mm256_mul_ps(int4x8(row.as_ptr().add(c / 2)), sv);
                _mm256_storeu_ps(out.as_mut_ptr().add(c), w);
                c += 8;
            }
        }
        for (j, o) in out[c..c1].iter_mut().enumerate() {
            *o = WFormat::I4.load(row, c + j) * s;
        }
    }
}

/// Dequantizes one row on the given instruction set.
pub fn dequant_scaled_isa(
    isa: Isa,
    fmt: WFormat,
    row: &[u8],
    scales: &[f32],
    block: usize,
    out: &mut [f32],
) {
    assert_eq!(
        scales.len(),
        out.len().div_ceil(block),
        "one scale per block"
    );
    assert_eq!(row.len(), fmt.row_bytes(out.len()), "row bytes");
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(cpu::supports(Isa::Avx512));
            // SAFETY: the CPU supports the features (checked); lengths checked above.
            unsafe { dequant_avx512(fmt, row, scales, block, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(cpu::supports(Isa::Avx2));
            // SAFETY: as above.
            unsafe { dequant_avx2(fmt, row, scales, block, out) }
        }
        _ => dequant_generic(fmt, row, scales, block, out),
    }
}

/// Dequantizes one row on the best instruction set.
pub fn dequant_scaled(fmt: WFormat, row: &[u8], scales: &[f32], block: usize, out: &mut [f32]) {
    dequant_scaled_isa(cpu::best(), fmt, row, scales, block, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every ISA gives the elementwise definition `load(c) * scale[c / block]`, bit for bit.
        #[test]
        fn every_isa_equals_the_definition(cols in 1usize..300, block in 1usize..130, seed in any::<u64>()) {
            let mut s = seed | 1;
            let mut next = move || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            for fmt in [WFormat::I8, WFormat::I4, WFormat::F4E2M1, WFormat::F8E4M3, WFormat::BF16] {
                let row: Vec<u8> = (0..fmt.row_bytes(cols)).map(|_| { let b = (next() >> 24) as u8; if fmt == WFormat::F8E4M3 && b & 0x7F == 0x7F { 0 } else { b } }).collect();
                let scales: Vec<f32> = (0..cols.div_ceil(block)).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 * 0.1).collect();
                let want: Vec<u32> = (0..cols).map(|c| (fmt.load(&row, c) * scales[c / block]).to_bits()).collect();
                for isa in cpu::available() {
                    let mut out = vec![0.0; cols];
                    dequant_scaled_isa(isa, fmt, &row, &scales, block, &mut out);
                    prop_assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.clone(), "{:?} {:?}", fmt, isa);
                }
            }
        }
    }

    #[test]
    fn int4_scales_the_lane_factors_cannot_take_dequantize_by_the_definition() {
        // AVX2's int4 path gives a block's scale the factors `16^-j` (exact while
        // `s * 2^-28` is a normal f32); scales at and beyond that bound, and zero, huge,
        // infinite and NaN ones, must still give the definition's bits. Blocks of 64 and
        // 12 (a block short of a word at its end, then blocks off the word boundary).
        let cols = 256usize;
        let row: Vec<u8> = (0..cols / 2)
            .map(|i| (i as u8).wrapping_mul(37) ^ 0x5A)
            .collect();
        let pow2 = |e: i32| f32::from_bits(((127 + e) as u32) << 23);
        let lo = pow2(-98);
        for scale in [
            lo,
            f32::from_bits(lo.to_bits() - 1),
            -f32::from_bits(lo.to_bits() + 1),
            1.0e-40,
            0.0,
            -0.0,
            3.0e38,
            f32::INFINITY,
            f32::NAN,
            0.013,
        ] {
            for block in [64, 12] {
                let scales = vec![scale; cols.div_ceil(block)];
                let want: Vec<u32> = (0..cols)
                    .map(|c| (WFormat::I4.load(&row, c) * scale).to_bits())
                    .collect();
                for isa in cpu::available() {
                    let mut out = vec![0.0; cols];
                    dequant_scaled_isa(isa, WFormat::I4, &row, &scales, block, &mut out);
                    let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{isa:?} scale {scale:e} block {block}");
                }
            }
        }
    }

    #[test]
    fn arithmetic_fp8_decoding_equals_the_table() {
        for b in 0..=255u8 {
            let (a, t) = (fp8_e4m3_to_f32(b), coli_core::FP8_E4M3_TABLE[b as usize]);
            assert_eq!(a.to_bits(), t.to_bits(), "{b:#x}: {a} vs {t}");
        }
    }

    #[test]
    fn int4_nibbles_are_offset_by_eight_low_first() {
        // Byte 0x9F: low nibble 15 -> 7, high nibble 9 -> 1.
        assert_eq!(WFormat::I4.load(&[0x9F], 0), 7.0);
        assert_eq!(WFormat::I4.load(&[0x9F], 1), 1.0);
        assert_eq!(WFormat::I4.load(&[0x00], 0), -8.0);
        assert_eq!(WFormat::I8.load(&[0xFF], 0), -1.0);
    }

    #[test]
    fn fp4_nibbles_decode_as_the_ocp_mx_spec_says_low_first() {
        // OCP Microscaling Formats v1.0, table for FP4 E2M1: exponent bias 1, no inf/NaN;
        // 0b0001 is the subnormal 0.5, 0b0111 the maximum 6.0.
        let spec = |n: u8| {
            let (s, e, m) = ((n >> 3) & 1, (n >> 1) & 3, n & 1);
            let mag = if e == 0 {
                0.5 * m as f32
            } else {
                2f32.powi(e as i32 - 1) * (1.0 + 0.5 * m as f32)
            };
            if s == 1 {
                -mag
            } else {
                mag
            }
        };
        for b in 0..=255u8 {
            let (lo, hi) = (WFormat::F4E2M1.load(&[b], 0), WFormat::F4E2M1.load(&[b], 1));
            assert_eq!(lo.to_bits(), spec(b & 15).to_bits(), "{b:#x} low");
            assert_eq!(hi.to_bits(), spec(b >> 4).to_bits(), "{b:#x} high");
        }
        assert_eq!(WFormat::F4E2M1.load(&[0x7F], 0), -6.0);
        assert_eq!(WFormat::F4E2M1.load(&[0x7F], 1), 6.0);
    }
}
