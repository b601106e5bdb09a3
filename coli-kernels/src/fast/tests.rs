//! The fast mode's tests: the vector kernel against its scalar definition, the
//! definition against an independent f64 computation of int8-activation arithmetic, and
//! the matmul's thread and batch invariance.
use super::*;
use crate::matmul::{matmul_many_int8_acts, matmul_reference, BlockScales, ScaleData};
use proptest::prelude::*;

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Uniform in [-a, a).
fn uniform(next: &mut impl FnMut() -> u64, a: f32) -> f32 {
    ((next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
}

/// Random rows of `fmt` (any byte), their scales in blocks of `bc`, and activations with
/// an all-zero block and a wide range of magnitudes.
#[allow(clippy::type_complexity)]
fn case(fmt: WFormat, k: usize, bc: usize, seed: u64) -> (Vec<Vec<u8>>, Vec<Vec<f32>>, Vec<f32>) {
    let mut next = rng(seed);
    let rows = (0..4)
        .map(|_| {
            (0..fmt.row_bytes(k))
                .map(|_| (next() >> 32) as u8)
                .collect()
        })
        .collect();
    let scales = (0..4)
        .map(|_| {
            (0..k.div_ceil(bc))
                .map(|_| uniform(&mut next, 0.02).abs() + 1e-4)
                .collect()
        })
        .collect();
    let x = (0..k)
        .map(|i| {
            if (32..64).contains(&i) {
                0.0
            } else {
                let e = (next() % 9) as i32 - 4;
                uniform(&mut next, 4.0) * 2f32.powi(e)
            }
        })
        .collect();
    (rows, scales, x)
}

/// The int8 activations of `x` by the definition, element by element: per `block`
/// elements `d = max|x| / 127`, `q = round(x / d)`, ties to even.
fn dequantized_activations(x: &[f32], block: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for b in x.chunks(block) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for &v in b {
            out.push(if amax == 0.0 {
                0.0
            } else {
                let d = amax / 127.0;
                (v / d).round_ties_even() as f64 * d as f64
            });
        }
    }
    out
}

/// The stored weights of a row as signed integers, element order, from the format's own
/// definition ([`WFormat::load`]).
fn weights(fmt: WFormat, row: &[u8], k: usize) -> Vec<f64> {
    (0..k).map(|i| fmt.load(row, i) as f64).collect()
}

/// A proptest's case: `chunks` of 64 columns, scale blocks of 64, 128 or the whole row.
struct Case {
    fmt: WFormat,
    k: usize,
    bc: usize,
    rows: Vec<Vec<u8>>,
    scales: Vec<Vec<f32>>,
    x: Vec<f32>,
}

fn drawn(chunks: usize, blocks: usize, seed: u64, int4: bool) -> Case {
    let fmt = if int4 { WFormat::I4 } else { WFormat::I8 };
    let k = chunks * 64;
    // Scale blocks of one and two groups (64 and 128 columns for int4; int8's groups are
    // up to 256 wide), or the whole row.
    let group = chunks_per_group(fmt, k) * 64;
    let bc = [group, 2 * group, k][blocks];
    let (rows, scales, x) = case(fmt, k, bc, seed);
    Case {
        fmt,
        k,
        bc,
        rows,
        scales,
        x,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// The vector kernel gives the scalar definition's bits, 4 rows and 1, int8 and
    /// int4, block widths of 64, 128 and the whole row.
    #[test]
    fn vector_kernels_match_the_scalar_definition_bit_for_bit(
        chunks in 1usize..40,
        blocks in 0usize..3,
        seed in any::<u64>(),
        int4 in any::<bool>(),
    ) {
        let Case { fmt, k, bc, rows, scales, x } = drawn(chunks, blocks, seed, int4);
        let a = Int8Acts::quantize(fmt, &x).expect("finite, whole chunks");
        let r4 = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
        let s4 = [&scales[0][..], &scales[1], &scales[2], &scales[3]];
        let want = dot_rows_scalar(r4, s4, bc, &a).map(f32::to_bits);
        prop_assert_eq!(dot_rows(r4, s4, bc, &a, &rows[0]).map(f32::to_bits), want);
        prop_assert_eq!(dot_rows([r4[2]], [s4[2]], bc, &a, &[])[0].to_bits(), want[2]);
        #[cfg(target_arch = "x86_64")]
        if vnni_available() {
            // SAFETY: the CPU has the kernel's instructions; the lengths match (checked by
            // `dot_rows` above on the same inputs).
            let v = unsafe { super::x86::dot_block_vnni(r4, s4, bc, [&a], &[]) };
            prop_assert_eq!(v[0].map(f32::to_bits), want);
        }
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            // SAFETY: as above, for AVX2 and FMA.
            let v = unsafe { super::avx2::dot_rows_avx2(r4, s4, bc, &a, &rows[3]) };
            prop_assert_eq!(v.map(f32::to_bits), want);
            let v = unsafe { super::avx2::dot_rows_avx2([r4[1]], [s4[1]], bc, &a, &[]) };
            prop_assert_eq!(v[0].to_bits(), want[1]);
        }
        // Three tokens in one block: each the definition of its own.
        let (_, _, y) = case(fmt, k, bc, seed ^ 0x5555);
        let b = Int8Acts::quantize(fmt, &y).expect("finite");
        let got = dot_block(r4, s4, bc, [&b, &a, &b], &rows[1]);
        let want_b = dot_rows_scalar(r4, s4, bc, &b).map(f32::to_bits);
        prop_assert_eq!(got.map(|v| v.map(f32::to_bits)), [want_b, want, want_b]);
    }

    /// The definition against int8-activation arithmetic done independently in f64:
    /// `Σ w_i · scale · (q_i · d)` over the elements in their natural order. The only
    /// difference allowed is f32 rounding of the per-lane partial sums, far below one
    /// quantization step.
    #[test]
    fn definition_is_the_dot_with_quantized_activations(
        chunks in 1usize..40,
        blocks in 0usize..3,
        seed in any::<u64>(),
        int4 in any::<bool>(),
    ) {
        let Case { fmt, k, bc, rows, scales, x } = drawn(chunks, blocks, seed, int4);
        let a = Int8Acts::quantize(fmt, &x).expect("finite");
        let xq = dequantized_activations(&x, act_block(fmt, k));
        for r in 0..4 {
            let w = weights(fmt, &rows[r], k);
            let terms: Vec<f64> = (0..k).map(|i| w[i] * scales[r][i / bc] as f64 * xq[i]).collect();
            let want: f64 = terms.iter().sum();
            let mag: f64 = terms.iter().map(|t| t.abs()).sum();
            let got = dot_rows_scalar([&rows[r][..]], [&scales[r][..]], bc, &a)[0] as f64;
            prop_assert!((got - want).abs() <= 1e-6 * mag + 1e-30, "{} vs {} (mag {})", got, want, mag);
        }
    }
}

/// The extremes of both operands, where a 16-bit pair sum could saturate (`vpmaddubsw`):
/// int8 weights of -128 and 127, int4 nibbles of 0 and 15, against activations that round
/// to ±127. Every vector kernel gives the definition's bits, and with one scale block of
/// 1.0 and activations of exactly ±d·127 the result is the exact integer dot product
/// (computed here in i64 from the formats' own `load`) times `d`.
#[test]
fn extreme_weights_and_activations_do_not_saturate() {
    for fmt in [WFormat::I8, WFormat::I4] {
        let k = 256;
        let bytes = fmt.row_bytes(k);
        let rows: Vec<Vec<u8>> = [[0x80u8, 0x80], [0x7F, 0x7F], [0x80, 0x7F], [0xFF, 0x00]]
            .iter()
            .map(|p| (0..bytes).map(|i| p[(i / 3) % 2]).collect())
            .collect();
        let rows: Vec<Vec<u8>> = match fmt {
            // int4: all nibbles 0 (value -8), all 15 (value 7), and mixes.
            WFormat::I4 => vec![
                vec![0x00; bytes],
                vec![0xFF; bytes],
                vec![0x0F; bytes],
                rows[3].clone(),
            ],
            _ => rows,
        };
        let d = 0.5f32;
        for signs in [[1.0f32, 1.0], [-1.0, -1.0], [1.0, -1.0]] {
            let x: Vec<f32> = (0..k).map(|i| signs[(i / 5) % 2] * d * 127.0).collect();
            let a = Int8Acts::quantize(fmt, &x).expect("finite");
            let ones = [1.0f32; 1];
            let r4 = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
            let s4 = [&ones[..]; 4];
            let want = dot_rows_scalar(r4, s4, k, &a);
            for r in 0..4 {
                let exact: i64 = (0..k)
                    .map(|i| fmt.load(&rows[r], i) as i64 * (signs[(i / 5) % 2] as i64) * 127)
                    .sum();
                assert_eq!(want[r], exact as f32 * d, "{fmt:?} row {r} signs {signs:?}");
            }
            let got = dot_rows(r4, s4, k, &a, &[]);
            assert_eq!(
                got.map(f32::to_bits),
                want.map(f32::to_bits),
                "{fmt:?} {signs:?}"
            );
            #[cfg(target_arch = "x86_64")]
            if avx2_available() {
                // SAFETY: the CPU has AVX2 and FMA; the lengths are the ones `dot_rows` took.
                let v = unsafe { super::avx2::dot_rows_avx2(r4, s4, k, &a, &[]) };
                assert_eq!(
                    v.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "{fmt:?} {signs:?}"
                );
            }
        }
    }
}

/// The fast result stays within the activation rounding of the exact dot product: each
/// element is off by at most half a step `d / 2` of its block, so the dot is off by at most
/// `Σ |w_i · scale| · d_i / 2` (a bound from the quantization rule alone).
#[test]
fn fast_dot_is_within_half_a_step_of_the_exact_one() {
    for (seed, int4) in [(1u64, false), (2, true), (3, false), (4, true)] {
        let fmt = if int4 { WFormat::I4 } else { WFormat::I8 };
        let (k, bc) = (2048, if int4 { 64 } else { 2048 });
        let (rows, scales, x) = case(fmt, k, bc, seed);
        let a = Int8Acts::quantize(fmt, &x).expect("finite");
        for r in 0..4 {
            let w = weights(fmt, &rows[r], k);
            let exact: f64 = (0..k)
                .map(|i| w[i] * scales[r][i / bc] as f64 * x[i] as f64)
                .sum();
            let block = act_block(fmt, k);
            let bound: f64 = x
                .chunks(block)
                .enumerate()
                .map(|(b, xs)| {
                    let d = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                    (0..block)
                        .map(|j| {
                            let i = b * block + j;
                            (w[i] * scales[r][i / bc] as f64).abs() * d / 2.0
                        })
                        .sum::<f64>()
                })
                .sum();
            let got = dot_rows([&rows[r][..]], [&scales[r][..]], bc, &a, &[])[0] as f64;
            assert!(
                (got - exact).abs() <= bound * 1.0001,
                "{fmt:?} row {r}: {got} vs exact {exact}, bound {bound}"
            );
            assert!(
                bound > 0.0 && (got - exact).abs() > 0.0,
                "the mode does round"
            );
        }
    }
}

#[test]
fn quantize_refuses_what_the_kernels_cannot_take() {
    let x = vec![1.0f32; 128];
    assert!(Int8Acts::quantize(WFormat::I8, &x).is_some());
    assert!(
        Int8Acts::quantize(WFormat::I8, &x[..96]).is_none(),
        "not whole chunks"
    );
    assert!(
        Int8Acts::quantize(WFormat::F8E4M3, &x).is_none(),
        "not int8/int4"
    );
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut y = x.clone();
        y[70] = bad;
        assert!(Int8Acts::quantize(WFormat::I4, &y).is_none(), "{bad}");
    }
    // Every value of a block at ±max|x| is ±127; zero blocks stay zero (192 int8 columns:
    // groups of one chunk, activation blocks of 32).
    assert_eq!(
        (
            chunks_per_group(WFormat::I8, 192),
            act_block(WFormat::I8, 192)
        ),
        (1, 32)
    );
    assert_eq!(
        (
            chunks_per_group(WFormat::I8, 384),
            act_block(WFormat::I8, 384)
        ),
        (2, 128)
    );
    assert_eq!(
        (
            chunks_per_group(WFormat::I8, 2048),
            act_block(WFormat::I8, 2048)
        ),
        (4, 256)
    );
    assert_eq!(act_block(WFormat::I4, 2048), ACT_BLOCK);
    let mut y = vec![0.0f32; 192];
    y[0] = -3.0;
    y[1] = 3.0;
    y[2] = 1.5;
    let a = Int8Acts::quantize(WFormat::I8, &y).unwrap();
    assert_eq!(&a.q[..3], &[-127, 127, 64]);
    assert!(a.q[3..].iter().all(|&q| q == 0) && a.d[8..].iter().all(|&d| d == 0.0));
    assert!(a.d[..8].iter().all(|&d| d == 3.0 / 127.0));
}

#[test]
fn takes_whole_chunks_inside_one_scale_block() {
    let bytes = vec![0u8; 4 * 256];
    let mat = |fmt: WFormat, cols: usize, bc: usize, scales: &[f32]| {
        let b = &bytes[..4 * fmt.row_bytes(cols)];
        let m = MatRef::new(fmt, b, 4, cols).with_scales(BlockScales {
            scales: ScaleData::F32(scales),
            block_rows: 1,
            block_cols: bc,
        });
        takes(&m)
    };
    let (one, two, four) = (&[1.0f32; 4][..], &[1.0f32; 8][..], &[1.0f32; 16][..]);
    assert!(mat(WFormat::I8, 128, 128, one));
    assert!(
        !mat(WFormat::I8, 128, 64, two),
        "an int8 group of 128 columns spans two blocks"
    );
    assert!(
        mat(WFormat::I8, 192, 64, &[1.0f32; 12][..]),
        "192 columns: groups of 64"
    );
    assert!(mat(WFormat::I4, 128, 64, two));
    assert!(
        !mat(WFormat::I4, 128, 32, four),
        "a 64-element chunk spans two blocks"
    );
    assert!(
        !mat(WFormat::I8, 96, 96, one),
        "96 columns are not whole chunks"
    );
    assert!(!mat(WFormat::F8E4M3, 128, 128, one), "FP8 stays exact");
    assert!(!takes(&MatRef::new(
        WFormat::BF16,
        &bytes[..4 * 256],
        4,
        128
    )));
}

/// The matmul: every output equals the kernel's definition for its row and token,
/// whatever the thread count and however many tokens share the call; close to the exact
/// matmul.
#[test]
fn int8_matmul_is_the_definition_on_any_threads_and_batch() {
    let (rows, k, n_tok) = (37, 256, 5);
    for fmt in [WFormat::I8, WFormat::I4] {
        let bc = if fmt == WFormat::I4 { 64 } else { k };
        let mut next = rng(if fmt == WFormat::I4 { 16 } else { 15 });
        let bytes: Vec<u8> = (0..rows * fmt.row_bytes(k))
            .map(|_| (next() >> 32) as u8)
            .collect();
        let scales: Vec<f32> = (0..rows * k.div_ceil(bc))
            .map(|_| uniform(&mut next, 0.05).abs() + 1e-3)
            .collect();
        let xs: Vec<f32> = (0..n_tok * k).map(|_| uniform(&mut next, 2.0)).collect();
        let m = MatRef::new(fmt, &bytes, rows, k).with_scales(BlockScales {
            scales: ScaleData::F32(&scales),
            block_rows: 1,
            block_cols: bc,
        });
        let mut want = vec![0.0f32; n_tok * rows];
        for t in 0..n_tok {
            let a = Int8Acts::quantize(fmt, &xs[t * k..(t + 1) * k]).unwrap();
            for r in 0..rows {
                let row = m.row(r);
                let s = &scales[r * k.div_ceil(bc)..(r + 1) * k.div_ceil(bc)];
                want[t * rows + r] = dot_rows_scalar([row], [s], bc, &a)[0];
            }
        }
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut out = vec![0.0f32; n_tok * rows];
            assert!(pool.install(|| matmul_many_int8_acts([&m], &xs, n_tok, [&mut out])));
            assert_eq!(
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{fmt:?} {threads} threads"
            );
            // One token at a time gives the same bits as the batch.
            let mut one = vec![0.0f32; rows];
            assert!(pool.install(|| matmul_many_int8_acts([&m], &xs[2 * k..3 * k], 1, [&mut one])));
            assert_eq!(
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want[2 * rows..3 * rows]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            );
        }
        let mut exact = vec![0.0f32; n_tok * rows];
        matmul_reference(&m, &xs, n_tok, &mut exact);
        let scale = exact.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (g, e) in want.iter().zip(&exact) {
            assert!((g - e).abs() <= 0.05 * scale, "{fmt:?}: {g} vs exact {e}");
        }
        // A non-finite activation leaves the call to the exact kernels.
        let mut bad = xs.clone();
        bad[3] = f32::NAN;
        let mut out = vec![0.0f32; n_tok * rows];
        assert!(!matmul_many_int8_acts([&m], &bad, n_tok, [&mut out]));
    }
}

/// The quantizer's rounding is `round_ties_even` over the range it sees (|v| ≤ 127, and
/// beyond, where it is used unclamped), ties included.
#[test]
fn magic_rounding_is_round_ties_even() {
    let mut v = -300.0f32;
    while v <= 300.0 {
        for w in [
            v,
            v + 0.5,
            v - 0.5,
            f32::from_bits(v.to_bits() + 1),
            f32::from_bits(v.to_bits().wrapping_sub(1)),
        ] {
            if w.is_finite() {
                assert_eq!(round_ties_even_small(w), w.round_ties_even(), "{w}");
            }
        }
        v += 0.125;
    }
}
