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

criterion_group!(benches, bench);
criterion_main!(benches);
