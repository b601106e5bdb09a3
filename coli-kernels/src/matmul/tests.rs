//! The matmul kernels against the plain reference and the formats' definitions.

use super::*;
use proptest::prelude::*;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn e8m0_bytes_are_powers_of_two_as_the_ocp_mx_spec_says() {
    for b in 0..=254u8 {
        let want = 2f64.powi(b as i32 - 127) as f32;
        assert_eq!(e8m0_to_f32(b).to_bits(), want.to_bits(), "{b}");
    }
    assert!(e8m0_to_f32(255).is_nan());
}

/// Long rows and many tokens: several token tiles, each token count left over by the
/// 3- and 4-token groups, on every instruction set, in f32 and bf16, against the
/// reference.
#[test]
fn the_best_isa_entry_points_give_the_reference_bits() {
    let (rows, cols, n_tok) = (37, 45, 3);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let w2: Vec<f32> = w.iter().map(|v| v * 0.5 + 0.125).collect();
    let xs: Vec<f32> = (0..n_tok * cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let (a, b) = (
        MatRef::new(WFormat::F32, bytemuck_f32(&w), rows, cols),
        MatRef::new(WFormat::F32, bytemuck_f32(&w2), rows, cols),
    );
    let (mut want_a, mut want_b) = (vec![0.0; n_tok * rows], vec![0.0; n_tok * rows]);
    matmul_reference(&a, &xs, n_tok, &mut want_a);
    matmul_reference(&b, &xs, n_tok, &mut want_b);
    let mut got = vec![0.0; n_tok * rows];
    matmul(&a, &xs, n_tok, &mut got);
    assert_eq!(bits(&got), bits(&want_a));
    let (mut ga, mut gb) = (vec![0.0; n_tok * rows], vec![0.0; n_tok * rows]);
    matmul_many([&a, &b], &xs, n_tok, [&mut ga, &mut gb]);
    assert_eq!((bits(&ga), bits(&gb)), (bits(&want_a), bits(&want_b)));
}

#[test]
#[should_panic(expected = "activations are not n_tok x cols")]
fn activations_of_the_wrong_length_are_refused() {
    let w = vec![0.0f32; 6];
    let m = MatRef::new(WFormat::F32, bytemuck_f32(&w), 2, 3);
    matmul(&m, &[0.0; 4], 1, &mut [0.0; 2]);
}

#[test]
#[should_panic(expected = "output is not n_tok x rows")]
fn an_output_of_the_wrong_length_is_refused() {
    let w = vec![0.0f32; 6];
    let m = MatRef::new(WFormat::F32, bytemuck_f32(&w), 2, 3);
    matmul(&m, &[0.0; 3], 1, &mut [0.0; 3]);
}

#[test]
fn scale_data_reads_any_range_as_f32() {
    let f = [0.5f32, 2.0, 8.0, 0.25];
    let e = [126u8, 128, 130, 125];
    for s in [ScaleData::F32(&f), ScaleData::E8M0(&e)] {
        assert_eq!(s.len(), 4);
        assert!(!s.is_empty());
        let mut out = [0.0; 2];
        s.copy_f32(1, &mut out);
        assert_eq!(out, [2.0, 8.0]);
        s.copy_f32(2, &mut out);
        assert_eq!(out, [8.0, 0.25]);
    }
    assert!(ScaleData::F32(&[]).is_empty() && ScaleData::E8M0(&[]).is_empty());
}

#[test]
fn token_tiles_give_the_reference_bits() {
    // 61 rows of these lengths span several row panels (28 rows of f32, 60 of bf16 at
    // 2064 columns) and leave one row over.
    for cols in [2064, 2071] {
        for rows in [23, 61] {
            tiles_at(cols, rows);
        }
    }
}

/// [`token_tiles_give_the_reference_bits`] at one row length (2071: a tail of 7).
fn tiles_at(cols: usize, rows: usize) {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let f32w: Vec<u8> = (0..rows * cols).flat_map(|_| rnd().to_le_bytes()).collect();
    let bf16w: Vec<u8> = (0..rows * cols)
        .flat_map(|_| half::bf16::from_f32(rnd()).to_bits().to_le_bytes())
        .collect();
    for n_tok in [25, 26, 27, 40] {
        let xs: Vec<f32> = (0..n_tok * cols).map(|_| rnd()).collect();
        for m in [
            MatRef::new(WFormat::F32, &f32w, rows, cols),
            MatRef::new(WFormat::BF16, &bf16w, rows, cols),
        ] {
            let mut want = vec![0.0; n_tok * rows];
            matmul_reference(&m, &xs, n_tok, &mut want);
            for isa in cpu::available() {
                let mut got = vec![0.0; n_tok * rows];
                matmul_isa(isa, &m, &xs, n_tok, &mut got);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{isa:?} {:?} {n_tok} {rows}",
                    m.fmt
                );
                // One thread: the whole range in one task, so in several panels.
                let mut got = vec![0.0; n_tok * rows];
                one.install(|| matmul_isa(isa, &m, &xs, n_tok, &mut got));
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{isa:?} {:?} {n_tok} {rows} alone",
                    m.fmt
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    /// Batched, parallel, SIMD == one token at a time, serial, scalar; for any thread count.
    #[test]
    fn matmul_equals_reference(rows in 1usize..70, cols in 1usize..90, n_tok in 1usize..6, seed in any::<u64>(), threads in 1usize..4) {
        let mut s = seed | 1;
        let mut rnd = move || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5 };
        let w: Vec<u8> = (0..rows * cols).flat_map(|_| half::bf16::from_f32(rnd()).to_bits().to_le_bytes()).collect();
        let xs: Vec<f32> = (0..n_tok * cols).map(|_| rnd()).collect();
        let m = MatRef::new(WFormat::BF16, &w, rows, cols);
        let mut want = vec![0.0; n_tok * rows];
        matmul_reference(&m, &xs, n_tok, &mut want);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for isa in cpu::available() {
            let mut got = vec![0.0; n_tok * rows];
            pool.install(|| matmul_isa(isa, &m, &xs, n_tok, &mut got));
            prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            // Two matrices in one dispatch give the same bits as each alone.
            let mut a = vec![0.0; n_tok * rows];
            let mut b2 = vec![0.0; n_tok * rows];
            pool.install(|| matmul_many_isa(isa, [&m, &m], &xs, n_tok, [&mut a, &mut b2]));
            prop_assert_eq!(bits(&a), bits(&want));
            prop_assert_eq!(bits(&b2), bits(&want));
            // One token at a time gives the same bits as the batch.
            for t in 0..n_tok {
                let mut one = vec![0.0; rows];
                pool.install(|| matmul_isa(isa, &m, &xs[t * cols..(t + 1) * cols], 1, &mut one));
                prop_assert_eq!(one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            }
        }
    }

    /// E8M0 scales give the bits of the same scales stored as f32, on every path: the
    /// fused decode loop (1-2 tokens), the dequantize-then-f32 loop (more tokens), one
    /// row at a time and the reference; with 1 x 32 blocks (MXFP4) and taller ones.
    #[test]
    fn e8m0_scales_equal_their_f32_values(fmt_i in 0usize..3, rows in 1usize..40, cols in 1usize..200, n_tok in 1usize..5, br in 1usize..3, seed in any::<u64>()) {
        let fmt = [WFormat::F4E2M1, WFormat::I4, WFormat::I8][fmt_i];
        let bc = 32;
        let mut s = seed | 1;
        let mut next = move || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
        let w: Vec<u8> = (0..rows * fmt.row_bytes(cols)).map(|_| (next() >> 32) as u8).collect();
        // Exponents around 2^-7, never 255 (NaN).
        let e8: Vec<u8> = (0..rows.div_ceil(br) * cols.div_ceil(bc)).map(|_| 115 + (next() % 20) as u8).collect();
        let f: Vec<f32> = e8.iter().map(|&b| e8m0_to_f32(b)).collect();
        let xs: Vec<f32> = (0..n_tok * cols).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
        let compact = MatRef::new(fmt, &w, rows, cols).with_scales(BlockScales { scales: ScaleData::E8M0(&e8), block_rows: br, block_cols: bc });
        let wide = MatRef::new(fmt, &w, rows, cols).with_scales(BlockScales { scales: (&f).into(), block_rows: br, block_cols: bc });
        let mut want = vec![0.0; n_tok * rows];
        matmul_reference(&wide, &xs, n_tok, &mut want);
        let mut got = vec![0.0; n_tok * rows];
        matmul_reference(&compact, &xs, n_tok, &mut got);
        prop_assert_eq!(bits(&got), bits(&want));
        for isa in cpu::available() {
            let mut got = vec![0.0; n_tok * rows];
            matmul_isa(isa, &compact, &xs, n_tok, &mut got);
            prop_assert_eq!(bits(&got), bits(&want), "{:?}", isa);
        }
        for (r, w) in want[..rows].iter().enumerate() {
            prop_assert_eq!(compact.dot_row(r, &xs[..cols]).to_bits(), w.to_bits());
        }
    }

    /// Scaled formats (FP8, int8, int4, FP4) with block scales and partial edge blocks:
    /// batched, parallel, SIMD == the scalar reference on the dequantized rows == a plain
    /// f32 matrix holding the dequantized values; one row at a time (`dot_row`) too.
    #[test]
    fn scaled_matmul_equals_reference(fmt_i in 0usize..4, rows in 1usize..70, cols in 1usize..90, n_tok in 1usize..5, br in 1usize..40, bc in 1usize..50, seed in any::<u64>(), threads in 1usize..3) {
        let fmt = [WFormat::F8E4M3, WFormat::I8, WFormat::I4, WFormat::F4E2M1][fmt_i];
        let mut s = seed | 1;
        let mut next = move || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
        let rb = fmt.row_bytes(cols);
        // Any byte but FP8's NaN encodings.
        let w: Vec<u8> = (0..rows * rb).map(|_| { let b = (next() >> 32) as u8; if fmt == WFormat::F8E4M3 && b & 0x7F == 0x7F { b ^ 1 } else { b } }).collect();
        let scales: Vec<f32> = (0..rows.div_ceil(br) * cols.div_ceil(bc)).map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 + 0.01) * 0.01).collect();
        let xs: Vec<f32> = (0..n_tok * cols).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
        let m = MatRef::new(fmt, &w, rows, cols).with_scales(BlockScales { scales: (&scales).into(), block_rows: br, block_cols: bc });
        let mut want = vec![0.0; n_tok * rows];
        matmul_reference(&m, &xs, n_tok, &mut want);
        // The same values stored as f32: the format's definition.
        let deq: Vec<f32> = (0..rows * cols).map(|i| {
            let (r, c) = (i / cols, i % cols);
            fmt.load(&w[r * rb..(r + 1) * rb], c) * scales[(r / br) * cols.div_ceil(bc) + c / bc]
        }).collect();
        let plain = MatRef::new(WFormat::F32, bytemuck_f32(&deq), rows, cols);
        let mut want_plain = vec![0.0; n_tok * rows];
        matmul_reference(&plain, &xs, n_tok, &mut want_plain);
        prop_assert_eq!(bits(&want), bits(&want_plain));
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for isa in cpu::available() {
            let mut got = vec![0.0; n_tok * rows];
            pool.install(|| matmul_isa(isa, &m, &xs, n_tok, &mut got));
            prop_assert_eq!(bits(&got), bits(&want));
        }
        for t in 0..n_tok {
            for r in 0..rows {
                prop_assert_eq!(m.dot_row(r, &xs[t * cols..(t + 1) * cols]).to_bits(), want[t * rows + r].to_bits());
            }
        }
    }
}

/// `rows` rows of `cols / block` random blocks of `ty` each.
fn ggml_rows(ty: coli_core::gguf::GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let blocks = rows * cols / ty.block().0;
    (0..blocks)
        .flat_map(|_| coli_core::fuzzing::random_block(ty, &mut next))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// GGUF block formats: every instruction set, token count and thread count gives the
    /// bits of the reference, which is the f32 chain over gguf-py's values
    /// (`coli_core::gguf::dequantize`, itself tested against gguf-py).
    #[test]
    fn ggml_block_matmul_equals_the_dequantized_reference(ty_i in 0usize..20, rows in 1usize..13, blocks in 1usize..4, n_tok in 1usize..9, seed in any::<u64>(), threads in 1usize..3) {
        let quantized: Vec<_> = coli_core::gguf::GgmlType::ALL.into_iter().filter(|t| t.is_quantized()).collect();
        let ty = quantized[ty_i];
        let cols = blocks * ty.block().0;
        let w = ggml_rows(ty, rows, cols, seed);
        let fmt = WFormat::Ggml(ty);
        let m = MatRef::new(fmt, &w, rows, cols);
        let xs: Vec<f32> = (0..n_tok * cols).map(|i| (((i as u64 * 2654435761) ^ seed) % 2000) as f32 / 1000.0 - 1.0).collect();
        let mut values = vec![0.0f32; rows * cols];
        coli_core::gguf::dequantize(ty, &w, &mut values).unwrap();
        let plain = MatRef::new(WFormat::F32, bytemuck_f32(&values), rows, cols);
        let mut want = vec![0.0; n_tok * rows];
        matmul_reference(&plain, &xs, n_tok, &mut want);
        let mut reference = vec![0.0; n_tok * rows];
        matmul_reference(&m, &xs, n_tok, &mut reference);
        prop_assert_eq!(bits(&reference), bits(&want));
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for isa in cpu::available() {
            let mut got = vec![0.0; n_tok * rows];
            pool.install(|| matmul_isa(isa, &m, &xs, n_tok, &mut got));
            prop_assert_eq!(bits(&got), bits(&want), "{:?} {:?}", ty, isa);
            for (r, w) in want[..rows].iter().enumerate() {
                prop_assert_eq!(m.dot_row(r, &xs[..cols]).to_bits(), w.to_bits());
            }
        }
    }
}

/// The panel path (prefill through quantized rows, `matmul/panel.rs`) against the scalar
/// reference: `rows` across panel and quad edges, `cols` across k-blocks (a partial last
/// one for scaled rows), tokens across groups of 6 and 12 and past one packed chunk.
fn panel_case(m: &MatRef, n_tok: usize, threads: usize, seed: u64) -> Result<(), TestCaseError> {
    let cols = m.cols;
    let xs: Vec<f32> = (0..n_tok * cols)
        .map(|i| (((i as u64 * 2654435761) ^ seed) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let mut want = vec![0.0; n_tok * m.rows];
    matmul_reference(m, &xs, n_tok, &mut want);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    for isa in cpu::available() {
        let mut got = vec![0.0; n_tok * m.rows];
        pool.install(|| matmul_isa(isa, m, &xs, n_tok, &mut got));
        prop_assert_eq!(bits(&got), bits(&want), "{:?} {:?}", m.fmt, isa);
    }
    Ok(())
}

#[test]
fn panels_past_one_token_chunk_give_the_reference_bits() {
    use coli_core::gguf::GgmlType;
    // 130 tokens: a chunk of 128 and one of 2; 70 rows: a panel and a partial one with a
    // row left over from the quads; 1024 columns: two k-blocks.
    let w = ggml_rows(GgmlType::Q4_K, 70, 1024, 7);
    let m = MatRef::new(WFormat::Ggml(GgmlType::Q4_K), &w, 70, 1024);
    panel_case(&m, 130, 2, 7).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn ggml_panels_give_the_reference_bits(ty_i in 0usize..4, rows in 1usize..80, blocks in 1usize..4, n_tok in 6usize..40, seed in any::<u64>(), threads in 1usize..3) {
        use coli_core::gguf::GgmlType;
        // A K-quant with an AVX-512 decoder, one without, a legacy type, a grid type.
        let ty = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q5_0, GgmlType::IQ2_XXS][ty_i];
        let cols = blocks * 256;
        let w = ggml_rows(ty, rows, cols, seed);
        panel_case(&MatRef::new(WFormat::Ggml(ty), &w, rows, cols), n_tok, threads, seed)?;
    }

    #[test]
    fn scaled_panels_give_the_reference_bits(fmt_i in 0usize..2, rows in 1usize..80, chunks in 1usize..70, n_tok in 6usize..30, bc in 1usize..200, seed in any::<u64>()) {
        let fmt = [WFormat::I8, WFormat::I4][fmt_i];
        let cols = chunks * 16;
        let mut s = seed | 1;
        let mut next = move || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
        let w: Vec<u8> = (0..rows * fmt.row_bytes(cols)).map(|_| (next() >> 32) as u8).collect();
        let scales: Vec<f32> = (0..rows * cols.div_ceil(bc)).map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 + 0.01) * 0.01).collect();
        let m = MatRef::new(fmt, &w, rows, cols).with_scales(BlockScales { scales: (&scales).into(), block_rows: 1, block_cols: bc });
        panel_case(&m, n_tok, 2, seed)?;
    }
}
