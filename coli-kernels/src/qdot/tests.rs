//! The fused quantized dot products' tests.
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
    /// Half the lengths are whole chunks of 16, summed in registers.
    #[test]
    fn fused_matches_dequantized_bit_for_bit(
        n in prop_oneof![0usize..300, (1usize..19).prop_map(|c| c * 16)],
        blocks in 0usize..6,
        seed in any::<u64>(),
        fmt_i in 0usize..4,
    ) {
        let fmt = [WFormat::I8, WFormat::I4, WFormat::F8E4M3, WFormat::F4E2M1][fmt_i];
        // 48 and 80: blocks of three and five 16-column steps (AVX2's int4 loop takes
        // four steps at a time, then single ones).
        let bc = [16, 32, 48, 64, 80, n.max(1)][blocks];
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
        // AVX-512 without VBMI: int4 and e2m1 keep the 16-element loop.
        #[cfg(target_arch = "x86_64")]
        if cpu::supports(cpu::Isa::Avx512) && (fmt != WFormat::F8E4M3 || scales.iter().all(|s| fold_fp8_rescale(s, x86::F16_RESCALE))) {
            // SAFETY: AVX-512 checked; the lengths are the layout's.
            let got = unsafe { x86::dot_rows_scaled_avx512(fmt, [&rows[0][..], &rows[1], &rows[2], &rows[3]], [&scales[0][..], &scales[1], &scales[2], &scales[3]], bc, &x, &[], false) };
            prop_assert_eq!(got.map(canon).to_vec(), want.clone(), "AVX-512 without VBMI, {:?}", fmt);
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
                    let got =
                        dot_rows_scaled(isa, WFormat::F4E2M1, [&row[..]], [&s[..]], bc, &x, &[])[0];
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
    // Scales whose 2^8 multiple (AVX-512's correction) or 2^120 multiple (AVX2's)
    // overflows: the vector loops cannot fold them and must still give the reference's
    // bits (here finite products for small weights).
    let n = 64;
    let row: Vec<u8> = (0..n).map(|i| (i % 8) as u8).collect(); // e4m3 subnormals
    let x: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 0.01).collect();
    for scale in [f32::MAX / 2.0, 1.0e5, 3.0e38 / 2f32.powi(120)] {
        let scales = [scale];
        let want = dot_scaled_scalar(WFormat::F8E4M3, &row, &scales, n, &x);
        assert!(want.is_finite());
        for isa in cpu::available() {
            let got = dot_rows_scaled(isa, WFormat::F8E4M3, [&row[..]], [&scales[..]], n, &x, &[]);
            assert_eq!(got[0].to_bits(), want.to_bits(), "{isa:?} scale {scale}");
        }
    }
}

#[test]
fn int4_scales_the_lane_factors_cannot_take_give_the_reference_bits() {
    // AVX2 keeps each nibble where it lies in its 32-bit word (lane j holds
    // `(n - 8) * 16^j`) and gives the scale the factor `16^-j`: exact only while
    // `s * 2^-28` is a normal f32. Scales at and beyond that bound, subnormal, huge,
    // infinite and NaN ones must still give the reference's bits; every nibble value
    // sits in every lane.
    let n = 64;
    let row: Vec<u8> = (0..n / 2)
        .map(|i| (i as u8).wrapping_mul(37) ^ 0x5A)
        .collect();
    let x: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 0.37).collect();
    let pow2 = |e: i32| f32::from_bits(((127 + e) as u32) << 23);
    let (lo, hi) = (pow2(-98), pow2(125));
    let below = |v: f32| f32::from_bits(v.to_bits() - 1);
    for scale in [
        lo,
        below(lo),
        -f32::from_bits(lo.to_bits() + 1),
        pow2(-106),
        1.0e-35,
        1.0e-40,
        0.0,
        -0.0,
        below(hi),
        hi,
        -hi,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ] {
        let scales = [scale];
        let want = canon(dot_scaled_scalar(WFormat::I4, &row, &scales, n, &x));
        for isa in cpu::available() {
            let got = dot_rows_scaled(isa, WFormat::I4, [&row[..]], [&scales[..]], n, &x, &[]);
            assert_eq!(canon(got[0]), want, "{isa:?} scale {scale:e}");
        }
    }
}

#[test]
fn int4_rows_with_one_block_the_lane_factors_cannot_take_give_the_reference_bits() {
    // One block's scale below AVX2's bound for the lane factors, in one row of the call
    // or in all five (rows in pairs and alone), the block first, in the middle or last.
    // The failing block's activations are large, so that its terms weigh as much as the
    // other blocks' and a wrong rounding of its weights shows in the result.
    let (n, bc) = (256, 64);
    let blocks = n / bc;
    let rows: Vec<Vec<u8>> = (0..5)
        .map(|r| {
            (0..n / 2)
                .map(|i| ((i * 29 + r * 7) as u8) ^ 0xA5)
                .collect()
        })
        .collect();
    let tiny = 1.0e-33f32; // below 2^-98: the lane factors would round it
    for bad_block in 0..blocks {
        let x: Vec<f32> = (0..n)
            .map(|i| {
                let v = (i % 23) as f32 * 0.11 - 1.2;
                if i / bc == bad_block {
                    v * 1.0e31
                } else {
                    v
                }
            })
            .collect();
        for bad_rows in [0b00001usize, 0b00010, 0b11111] {
            let scales: Vec<Vec<f32>> = (0..5)
                .map(|r| {
                    (0..blocks)
                        .map(|b| match (b == bad_block, bad_rows >> r & 1 == 1) {
                            (true, true) => tiny * (1.0 + r as f32 * 0.37),
                            (true, false) => 4.0e-30 * (1.0 + r as f32 * 0.1),
                            _ => 0.01 + (r * blocks + b) as f32 * 1e-3,
                        })
                        .collect()
                })
                .collect();
            let want: Vec<u32> = (0..5)
                .map(|r| dot_scaled_scalar(WFormat::I4, &rows[r], &scales[r], bc, &x).to_bits())
                .collect();
            let r = |i: usize| &rows[i][..];
            let s = |i: usize| &scales[i][..];
            for isa in cpu::available() {
                let got = dot_rows_scaled(
                    isa,
                    WFormat::I4,
                    [r(0), r(1), r(2), r(3), r(4)],
                    [s(0), s(1), s(2), s(3), s(4)],
                    bc,
                    &x,
                    &[],
                );
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{isa:?} block {bad_block} rows {bad_rows:b}");
            }
        }
    }
}

#[test]
fn rows_ending_at_an_unmapped_page_are_read_within_their_bytes() {
    // Rows that end where the mapping ends (the last row of a matrix at the end of a
    // file): the vector loops must not read past them (AVX2's int4 loop broadcasts
    // 32-bit words, AVX-512's reads whole lines). A protected page follows the rows; a
    // read beyond them faults.
    const PAGE: usize = 4096;
    // SAFETY: a fresh private anonymous mapping of two pages, the second made
    // inaccessible; unmapped at the end.
    let base = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            2 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(
            libc::mprotect(p.cast::<u8>().add(PAGE).cast(), PAGE, libc::PROT_NONE),
            0
        );
        p.cast::<u8>()
    };
    for (fmt, bc) in [
        (WFormat::I4, 64),
        (WFormat::I8, 128),
        (WFormat::F8E4M3, 128),
        (WFormat::F4E2M1, 32),
    ] {
        for n in [16usize, 128, 512] {
            let bytes = fmt.row_bytes(n);
            // SAFETY: the last `bytes` bytes of the first (writable) page.
            let row = unsafe { std::slice::from_raw_parts_mut(base.add(PAGE - bytes), bytes) };
            for (i, b) in row.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(29) & 0x77;
            }
            let row: &[u8] = row;
            let scales = vec![0.5f32; n.div_ceil(bc)];
            let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 3.0).collect();
            let want = dot_scaled_scalar(fmt, row, &scales, bc, &x);
            for isa in cpu::available() {
                let got = dot_rows_scaled(isa, fmt, [row], [&scales[..]], bc, &x, &[]);
                assert_eq!(got[0].to_bits(), want.to_bits(), "{isa:?} {fmt:?} {n}");
            }
        }
    }
    // SAFETY: the mapping made above, no longer borrowed.
    unsafe { libc::munmap(base.cast(), 2 * PAGE) };
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
