//! Matrix-vector throughput per format and instruction set (the decode hot path).

use coli_kernels::{cpu, matmul::matmul_isa, MatRef, WFormat};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn bench(c: &mut Criterion) {
    let (rows, cols) = (1536, 576);
    let mut g = c.benchmark_group("matvec_1536x576");
    for fmt in [WFormat::F32, WFormat::BF16, WFormat::F16] {
        let w = vec![0x3cu8; rows * cols * fmt.size()];
        let x = vec![0.5f32; cols];
        let mut out = vec![0.0; rows];
        g.throughput(Throughput::Bytes(w.len() as u64));
        for isa in cpu::available() {
            let m = MatRef::new(fmt, &w, rows, cols);
            g.bench_function(format!("{fmt:?}/{isa:?}"), |b| {
                b.iter(|| matmul_isa(isa, &m, &x, 1, &mut out))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
