//! Instruction-set detection, done once.

use std::sync::OnceLock;

/// The instruction sets the fast paths are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust; the reference.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F and BW (+ the AVX2 set for conversions).
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
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
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
    *BEST.get_or_init(|| choose(&available(), std::env::var("COLI_ISA").ok().as_deref()))
}

/// The set `COLI_ISA` asks for (`scalar`, or `avx2` where available), else the best of
/// `all`.
fn choose(all: &[Isa], asked: Option<&str>) -> Isa {
    match asked {
        Some("scalar") => Isa::Scalar,
        Some("avx2") if all.contains(&Isa::Avx2) => Isa::Avx2,
        _ => *all.last().expect("scalar always available"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coli_isa_picks_a_set_only_where_it_runs() {
        let all = [Isa::Scalar, Isa::Avx2, Isa::Avx512];
        assert_eq!(choose(&all, None), Isa::Avx512);
        assert_eq!(choose(&all, Some("scalar")), Isa::Scalar);
        assert_eq!(choose(&all, Some("avx2")), Isa::Avx2);
        assert_eq!(choose(&all, Some("avx9")), Isa::Avx512);
        assert_eq!(choose(&all[..1], Some("avx2")), Isa::Scalar);
    }

    #[test]
    fn supports_is_what_this_cpu_has() {
        let all = available();
        assert_eq!(all[0], Isa::Scalar);
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            assert_eq!(supports(isa), all.contains(&isa), "{isa:?}");
        }
        // An AVX-512 machine has the AVX2 set too; a set is listed only with every
        // feature it needs (std's detection is the reference).
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            assert_eq!(all.contains(&Isa::Avx2), avx2);
            assert_eq!(
                all.contains(&Isa::Avx512),
                avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
            );
        }
    }
}
