//! Matrix-vector throughput per format and instruction set (the decode hot path):
//! a 1536x576 matrix that stays in cache, and a 49152x576 one (the demo model's LM head)
//! streamed from memory, on one thread and on the whole pool.

use coli_kernels::{cpu, matmul::matmul_isa, MatRef, WFormat};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn bench(c: &mut Criterion) {
    for (rows, cols) in [(1536, 576), (49152, 576)] {
        let mut g = c.benchmark_group(format!("matvec_{rows}x{cols}"));
        for fmt in [WFormat::F32, WFormat::BF16, WFormat::F16] {
            let w: Vec<u8> = (0..rows * cols * fmt.size())
                .map(|i| (i % 61) as u8 & 0x3f)
                .collect();
            let x = vec![0.5f32; cols];
            let mut out = vec![0.0; rows];
            g.throughput(Throughput::Bytes(w.len() as u64));
            for isa in cpu::available() {
                if isa == cpu::Isa::Scalar && rows > 2000 {
                    continue;
                }
                let m = MatRef::new(fmt, &w, rows, cols);
                for threads in [1, 2] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    g.bench_function(format!("{fmt:?}/{isa:?}/{threads}t"), |b| {
                        pool.install(|| b.iter(|| matmul_isa(isa, &m, &x, 1, &mut out)))
                    });
                }
            }
        }
        g.finish();
    }
}

/// Scaled quantized matrices at an MoE expert's shape (OLMoE: 1024 x 2048), one thread:
/// the fused kernels (`matmul`, one token) against the path they replaced (four rows
/// dequantized into an f32 buffer, then the f32 kernel), in GB/s of stored weights.
fn bench_scaled(c: &mut Criterion) {
    use coli_kernels::dot::{bytemuck_f32, dot_rows};
    use coli_kernels::matmul::BlockScales;
    let (rows, cols) = (1024usize, 2048usize);
    let mut g = c.benchmark_group(format!("scaled_{rows}x{cols}"));
    for (fmt, br, bc) in [
        (WFormat::I8, 1, cols),
        (WFormat::I4, 1, 64),
        (WFormat::F8E4M3, 128, 128),
        (WFormat::F4E2M1, 1, 32),
    ] {
        let w: Vec<u8> = (0..rows * fmt.row_bytes(cols))
            .map(|i| {
                let b = (i % 61) as u8 & 0x3f;
                // e4m3: normal values only, as checkpoints scaled to a block's maximum
                // hold almost only (Gaussian weights put about 1e-4 of them below 2^-6 of
                // the range); subnormals cost AVX2 a slow multiplication each.
                if fmt == WFormat::F8E4M3 {
                    b | 0x08
                } else {
                    b
                }
            })
            .collect();
        let scales: Vec<f32> = (0..rows.div_ceil(br) * cols.div_ceil(bc))
            .map(|i| 0.01 + (i % 7) as f32 * 1e-3)
            .collect();
        let x = vec![0.5f32; cols];
        let mut out = vec![0.0; rows];
        let m = MatRef::new(fmt, &w, rows, cols).with_scales(BlockScales {
            scales: (&scales).into(),
            block_rows: br,
            block_cols: bc,
        });
        g.throughput(Throughput::Bytes(w.len() as u64));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        for isa in cpu::available() {
            if isa == cpu::Isa::Scalar {
                continue;
            }
            g.bench_function(format!("{fmt:?}/{isa:?}/fused"), |b| {
                pool.install(|| b.iter(|| matmul_isa(isa, &m, &x, 1, &mut out)))
            });
            let mut buf = vec![0.0f32; 4 * cols];
            g.bench_function(format!("{fmt:?}/{isa:?}/dequant-then-dot"), |b| {
                b.iter(|| {
                    for r in (0..rows).step_by(4) {
                        for (j, row) in buf.chunks_mut(cols).enumerate() {
                            m.dequant_row(r + j, row);
                        }
                        let f = |j: usize| bytemuck_f32(&buf[j * cols..(j + 1) * cols]);
                        let v = dot_rows(isa, WFormat::F32, [f(0), f(1), f(2), f(3)], &x);
                        out[r..r + 4].copy_from_slice(&v);
                    }
                })
            });
        }
    }
    g.finish();
}

/// Prefill: 64 tokens through the demo model's MLP shapes (up 1536 x 576, down 576 x 1536) on one thread,
/// the register-blocked path. Throughput in "elements" is floating-point operations
/// (2 per weight and token), so criterion's elem/s reads as FLOP/s; one Zen 4 core's f32
/// FMA peak is 32 FLOP per cycle.
fn bench_prefill(c: &mut Criterion) {
    for (rows, cols) in [(1536usize, 576usize), (576, 1536)] {
        bench_prefill_shape(c, rows, cols, 64);
    }
}

fn bench_prefill_shape(c: &mut Criterion, rows: usize, cols: usize, n_tok: usize) {
    let mut g = c.benchmark_group(format!("prefill_{rows}x{cols}x{n_tok}"));
    g.throughput(Throughput::Elements((2 * rows * cols * n_tok) as u64));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for fmt in [WFormat::F32, WFormat::BF16, WFormat::F16] {
        // Normal values in [-1, 1] in each format (byte patterns read as f32 were tiny
        // and their products subnormal, which the FPU takes slowly).
        let w: Vec<u8> = (0..rows * cols)
            .flat_map(|i| {
                let v = ((i as u64 * 2654435761) % 2000) as f32 / 1000.0 - 1.0;
                match fmt {
                    WFormat::F32 => v.to_le_bytes().to_vec(),
                    WFormat::BF16 => ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
                    _ => half::f16::from_f32(v).to_le_bytes().to_vec(),
                }
            })
            .collect();
        let xs: Vec<f32> = (0..cols * n_tok).map(|i| (i % 13) as f32 * 0.1).collect();
        let mut out = vec![0.0; rows * n_tok];
        let m = MatRef::new(fmt, &w, rows, cols);
        for isa in cpu::available() {
            if isa == cpu::Isa::Scalar {
                continue;
            }
            g.bench_function(format!("{fmt:?}/{isa:?}"), |b| {
                pool.install(|| b.iter(|| matmul_isa(isa, &m, &xs, n_tok, &mut out)))
            });
        }
    }
    g.finish();
}

/// A few tokens through one scaled expert matrix (MoE decode with drafts: each expert sees
/// the few tokens routed to it), one thread: where the per-token fused kernels stop paying
/// against dequantizing four rows once and sharing them across the tokens.
fn bench_scaled_tokens(c: &mut Criterion) {
    use coli_kernels::matmul::BlockScales;
    let (rows, cols) = (1024usize, 2048usize);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut g = c.benchmark_group(format!("scaled_tokens_{rows}x{cols}"));
    for (fmt, bc) in [(WFormat::I8, cols), (WFormat::I4, 64)] {
        let w: Vec<u8> = (0..rows * fmt.row_bytes(cols))
            .map(|i| (i % 61) as u8 & 0x3f)
            .collect();
        let scales: Vec<f32> = (0..rows * cols.div_ceil(bc))
            .map(|i| 0.01 + (i % 7) as f32 * 1e-3)
            .collect();
        let m = MatRef::new(fmt, &w, rows, cols).with_scales(BlockScales {
            scales: (&scales).into(),
            block_rows: 1,
            block_cols: bc,
        });
        let isa = cpu::best();
        for n_tok in [1usize, 2, 3, 4, 6, 8, 64] {
            let xs: Vec<f32> = (0..cols * n_tok)
                .map(|i| (i % 37) as f32 * 0.05 - 0.9)
                .collect();
            let mut out = vec![0.0; rows * n_tok];
            g.bench_function(format!("{fmt:?}/{n_tok}"), |b| {
                pool.install(|| b.iter(|| matmul_isa(isa, &m, &xs, n_tok, &mut out)))
            });
            // The optional fast mode (int8 activations, VNNI or AVX2; not exact),
            // quantization of the activations included.
            if coli_kernels::fast::kernels_available() {
                g.bench_function(format!("{fmt:?}/{n_tok}/fast-int8"), |b| {
                    pool.install(|| {
                        b.iter(|| {
                            let outs = [&mut out[..]];
                            assert!(coli_kernels::matmul::matmul_many_int8_acts(
                                [&m],
                                &xs,
                                n_tok,
                                outs
                            ))
                        })
                    })
                });
            }
        }
    }
    g.finish();
}

/// `rows x cols` of random (valid) blocks of `ty`, the same for every run.
fn random_rows(ty: coli_core::gguf::GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..rows * cols / ty.block().0)
        .flat_map(|_| coli_core::fuzzing::random_block(ty, &mut next))
        .collect()
}

/// GGUF block types at an MoE expert's shape (1024 x 2048), one thread, one token: the
/// fused kernel (`matmul`) against the reference path the types without one took (four
/// rows dequantized by `coli_core::gguf::dequantize`, then the f32 kernel). Throughput in
/// bytes of stored blocks. `COLI_BENCH_GGML=Q4_K,IQ2_XXS` picks types;
/// `COLI_BENCH_GGML_ROWS=65536` a matrix bigger than the caches, `COLI_BENCH_THREADS=2`
/// more threads (the decode case: each token's weights come from memory).
fn bench_ggml(c: &mut Criterion) {
    use coli_core::gguf::GgmlType;
    use coli_kernels::dot::{bytemuck_f32, dot_rows};
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (rows, cols) = (env("COLI_BENCH_GGML_ROWS", 1024), 2048usize);
    let pick = std::env::var("COLI_BENCH_GGML").ok();
    let mut g = c.benchmark_group(format!("ggml_{rows}x{cols}"));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(env("COLI_BENCH_THREADS", 1))
        .build()
        .unwrap();
    let isa = cpu::best();
    for ty in GgmlType::ALL.into_iter().filter(|t| t.is_quantized()) {
        if pick
            .as_ref()
            .is_some_and(|p| !p.split(',').any(|n| n == ty.name()))
        {
            continue;
        }
        let w = random_rows(ty, rows, cols);
        let m = MatRef::new(WFormat::Ggml(ty), &w, rows, cols);
        // `COLI_BENCH_X_OFFSET=4`: the activations 16 bytes past a cache line (as a heap
        // vector of f32 may be) rather than on one.
        let mut xbuf = vec![0.5f32; cols + 32];
        let skew = (64 - xbuf.as_ptr() as usize % 64) % 64 / 4 + env("COLI_BENCH_X_OFFSET", 0);
        let x = &mut xbuf[skew..skew + cols];
        let x = &*x;
        let mut out = vec![0.0; rows];
        g.throughput(Throughput::Bytes(w.len() as u64));
        // On AVX-512 the AVX2 kernel too: the types without an AVX-512 decoder take it.
        let mut isas = vec![isa];
        if isa == cpu::Isa::Avx512 {
            isas.push(cpu::Isa::Avx2);
        }
        for isa in isas {
            g.bench_function(format!("{}/{isa:?}/fused", ty.name()), |b| {
                pool.install(|| b.iter(|| matmul_isa(isa, &m, x, 1, &mut out)))
            });
        }
        let mut buf = vec![0.0f32; 4 * cols];
        let rb = ty.row_bytes(cols);
        g.bench_function(format!("{}/{isa:?}/dequant-then-dot", ty.name()), |b| {
            b.iter(|| {
                for r in (0..rows).step_by(4) {
                    for (j, row) in buf.chunks_mut(cols).enumerate() {
                        let at = (r + j) * rb;
                        coli_core::gguf::dequantize(ty, &w[at..at + rb], row).unwrap();
                    }
                    let f = |j: usize| bytemuck_f32(&buf[j * cols..(j + 1) * cols]);
                    let v = dot_rows(isa, WFormat::F32, [f(0), f(1), f(2), f(3)], x);
                    out[r..r + 4].copy_from_slice(&v);
                }
            })
        });
    }
    g.finish();
}

/// Prefill through GGUF rows at DeepSeek-V3's expert shapes (gate/up 2048 x 7168, down
/// 7168 x 2048), 128 tokens (each expert's share of a 256-token prompt), one thread: the
/// exact path dequantizes rows and runs the f32 kernels. Throughput in FLOP (2 per weight
/// and token). `COLI_BENCH_GGML=Q4_K,Q6_K` picks types (default Q4_K); `COLI_BENCH_TOKENS`.
fn bench_prefill_ggml(c: &mut Criterion) {
    use coli_core::gguf::GgmlType;
    let n_tok = std::env::var("COLI_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128usize);
    let pick = std::env::var("COLI_BENCH_GGML").unwrap_or_else(|_| "Q4_K".into());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for (rows, cols) in [(2048usize, 7168usize), (7168, 2048)] {
        let mut g = c.benchmark_group(format!("prefill_ggml_{rows}x{cols}x{n_tok}"));
        g.sample_size(10);
        g.throughput(Throughput::Elements((2 * rows * cols * n_tok) as u64));
        for ty in GgmlType::ALL
            .into_iter()
            .filter(|t| pick.split(',').any(|n| n == t.name()))
        {
            let w = random_rows(ty, rows, cols);
            let m = MatRef::new(WFormat::Ggml(ty), &w, rows, cols);
            let xs: Vec<f32> = (0..cols * n_tok).map(|i| (i % 13) as f32 * 0.1).collect();
            let mut out = vec![0.0; rows * n_tok];
            let isa = cpu::best();
            g.bench_function(format!("{}/{isa:?}", ty.name()), |b| {
                pool.install(|| b.iter(|| matmul_isa(isa, &m, &xs, n_tok, &mut out)))
            });
        }
        g.finish();
    }
}

criterion_group!(
    benches,
    bench,
    bench_prefill_ggml,
    bench_scaled,
    bench_ggml,
    bench_prefill,
    bench_scaled_tokens
);
criterion_main!(benches);
