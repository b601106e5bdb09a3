//! Instruction-set detection, done once.

use std::sync::OnceLock;

/// The instruction sets the fast paths are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust; the reference.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512F (+ the AVX2 set for conversions).
    Avx512,
}

/// Instruction sets usable on this CPU, best last.
pub fn available() -> Vec<Isa> {
    let mut v = vec![Isa::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            v.push(Isa::Avx2);
            if is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
    }
    v
}

/// Whether `isa` runs on this CPU (cached; allocation-free).
pub fn supports(isa: Isa) -> bool {
    static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
    AVAILABLE.get_or_init(available).contains(&isa)
}

/// The best instruction set of this CPU, or `Scalar` if `COLI_ISA=scalar` is set.
pub fn best() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(|| {
        let all = available();
        match std::env::var("COLI_ISA").ok().as_deref() {
            Some("scalar") => Isa::Scalar,
            Some("avx2") if all.contains(&Isa::Avx2) => Isa::Avx2,
            _ => *all.last().expect("scalar always available"),
        }
    })
}
