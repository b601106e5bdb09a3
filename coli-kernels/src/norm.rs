//! RMSNorm and SwiGLU.

use crate::cpu::{self, Isa};
use crate::dot::{dot_rows, dot_scalar, WFormat};
use crate::softmax::exp_f32;

/// RMSNorm of one row on the given instruction set:
/// `out = weight * (x * 1/sqrt(mean(x²) + eps))`, the order `transformers` uses.
pub fn rms_norm_isa(isa: Isa, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(x.len(), weight.len());
    assert_eq!(x.len(), out.len());
    let bytes = crate::dot::bytemuck_f32(x);
    let ss = match isa {
        Isa::Scalar => dot_scalar(WFormat::F32, bytes, x),
        _ => dot_rows(isa, WFormat::F32, [bytes], x)[0],
    };
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, &xi), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (xi * inv);
    }
}

/// RMSNorm of one row on the best instruction set.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_isa(cpu::best(), x, weight, eps, out)
}

/// RMSNorm in place.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    assert_eq!(x.len(), weight.len());
    let bytes = crate::dot::bytemuck_f32(x);
    let ss = dot_rows(cpu::best(), WFormat::F32, [bytes], x)[0];
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for (xi, &w) in x.iter_mut().zip(weight) {
        *xi = w * (*xi * inv);
    }
}

/// LayerNorm of one row in place: `(x - mean) / sqrt(var + eps) * weight + bias`, with the
/// biased variance (`torch.nn.LayerNorm`); sums left to right.
pub fn layer_norm_inplace(x: &mut [f32], weight: &[f32], bias: &[f32], eps: f32) {
    assert_eq!(x.len(), weight.len());
    assert_eq!(x.len(), bias.len());
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((xi, &w), &b) in x.iter_mut().zip(weight).zip(bias) {
        *xi = (*xi - mean) * inv * w + b;
    }
}

/// SiLU: `x * sigmoid(x)` computed as `x / (1 + e^-x)`, with coli's exponential
/// ([`crate::softmax::exp_f32`], the same bits on every instruction set).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp_f32(-x))
}

/// SwiGLU in place: `gate[i] = silu(gate[i]) * up[i]`.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    swiglu_isa(cpu::best(), gate, up)
}

/// [`swiglu_inplace`] on the given instruction set: the vector paths perform [`silu`]'s
/// operations and the product lane by lane, so every set gives the same bits.
///
/// # Panics
/// If the lengths differ, or `isa` does not run on this CPU.
pub fn swiglu_isa(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let done = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(cpu::supports(Isa::Avx512));
            // SAFETY: AVX-512F is available (checked); the lengths are equal (checked).
            unsafe { x86::swiglu_avx512(gate, up) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(cpu::supports(Isa::Avx2));
            // SAFETY: AVX2 and FMA are available (checked); the lengths are equal (checked).
            unsafe { x86::swiglu_avx2(gate, up) }
        }
        _ => 0,
    };
    for (g, &u) in gate[done..].iter_mut().zip(&up[done..]) {
        *g = silu(*g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::softmax::x86::{exp16, exp8};
    use std::arch::x86_64::*;

    /// `gate = gate / (1 + e^-gate) * up` over whole groups of 16; returns how many.
    ///
    /// # Safety
    /// AVX-512F must be available and `up` as long as `gate`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn swiglu_avx512(gate: &mut [f32], up: &[f32]) -> usize {
        let sign = _mm512_set1_ps(-0.0);
        let one = _mm512_set1_ps(1.0);
        let mut j = 0;
        while j + 16 <= gate.len() {
            let p = gate.as_mut_ptr().add(j);
            let g = _mm512_loadu_ps(p);
            let e = exp16(_mm512_xor_ps(g, sign));
            let s = _mm512_div_ps(g, _mm512_add_ps(one, e));
            _mm512_storeu_ps(p, _mm512_mul_ps(s, _mm512_loadu_ps(up.as_ptr().add(j))));
            j += 16;
        }
        j
    }

    /// [`swiglu_avx512`] in groups of 8.
    ///
    /// # Safety
    /// AVX2 and FMA must be available and `up` as long as `gate`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) -> usize {
        let sign = _mm256_set1_ps(-0.0);
        let one = _mm256_set1_ps(1.0);
        let mut j = 0;
        while j + 8 <= gate.len() {
            let p = gate.as_mut_ptr().add(j);
            let g = _mm256_loadu_ps(p);
            let e = exp8(_mm256_xor_ps(g, sign));
            let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(p, _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(j))));
            j += 8;
        }
        j
    }
}

/// SwiGLU with DeepSeek-V4's clamps (`swiglu_limit`), in place:
/// `gate[i] = silu(min(gate[i], limit)) * clamp(up[i], -limit, limit)`.
pub fn swiglu_clamped_inplace(gate: &mut [f32], up: &[f32], limit: f32) {
    assert_eq!(gate.len(), up.len());
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(g.min(limit)) * u.clamp(-limit, limit);
    }
}

/// RMSNorm without a weight, in place: `x * 1/sqrt(mean(x²) + eps)` (DeepSeek-V4's
/// per-head query norm and the hyper-connections' input norm).
pub fn rms_norm_unweighted_inplace(x: &mut [f32], eps: f32) {
    let bytes = crate::dot::bytemuck_f32(x);
    let ss = dot_rows(cpu::best(), WFormat::F32, [bytes], x)[0];
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for xi in x.iter_mut() {
        *xi *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_gives_the_scalar_bits_on_every_isa_and_follows_the_formula() {
        let mut seed = 0x1234_5678_9ABC_DEF1u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0
        };
        for n in [1usize, 8, 15, 16, 17, 33, 100] {
            let mut gate: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let up: Vec<f32> = (0..n).map(|_| rnd()).collect();
            if n > 16 {
                // Far past the exponential's range on both sides, a zero and a NaN.
                gate[1] = 200.0;
                gate[2] = -200.0;
                gate[3] = 0.0;
                gate[4] = f32::NAN;
            }
            let mut want = gate.clone();
            swiglu_isa(Isa::Scalar, &mut want, &up);
            for (j, (&g, &u)) in gate.iter().zip(&up).enumerate() {
                let f = g as f64 / (1.0 + (-(g as f64)).exp()) * u as f64;
                if g.is_nan() {
                    assert!(want[j].is_nan());
                } else {
                    assert!(
                        (want[j] as f64 - f).abs() <= 1e-6 * f.abs().max(1.0),
                        "{g} {u}"
                    );
                }
            }
            for isa in cpu::available() {
                let mut got = gate.clone();
                swiglu_isa(isa, &mut got, &up);
                for (j, (&a, &b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "{isa:?} n {n} at {j}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn layer_norm_matches_the_formula_in_f64() {
        let mut x = [1.0f32, -2.0, 3.5, 0.25];
        let (w, b) = ([1.0f32, 2.0, 0.5, -1.0], [0.0f32, 0.1, -0.2, 0.3]);
        let xs: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let mean = xs.iter().sum::<f64>() / 4.0;
        let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
        layer_norm_inplace(&mut x, &w, &b, 1e-6);
        for i in 0..4 {
            let want = (xs[i] - mean) / (var + 1e-6).sqrt() * w[i] as f64 + b[i] as f64;
            assert!((x[i] as f64 - want).abs() < 1e-5, "{i}: {} vs {want}", x[i]);
        }
    }

    #[test]
    fn rms_norm_matches_definition_and_isas_agree() {
        let x: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let w: Vec<f32> = (0..50).map(|i| 1.0 + i as f32 * 0.01).collect();
        let mean_sq = x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / 50.0;
        let mut want = vec![0.0; 50];
        rms_norm_isa(Isa::Scalar, &x, &w, 1e-6, &mut want);
        for i in 0..50 {
            let exact = w[i] as f64 * x[i] as f64 / (mean_sq + 1e-6).sqrt();
            assert!((want[i] as f64 - exact).abs() < 1e-5, "{i}");
        }
        for isa in cpu::available() {
            let mut got = vec![0.0; 50];
            rms_norm_isa(isa, &x, &w, 1e-6, &mut got);
            assert_eq!(got, want, "{isa:?}");
        }
        let mut inplace = x.clone();
        rms_norm_inplace(&mut inplace, &w, 1e-6);
        let mut best = vec![0.0; 50];
        rms_norm(&x, &w, 1e-6, &mut best);
        assert_eq!(inplace, best);
    }

    #[test]
    fn clamped_swiglu_and_unweighted_norm_follow_their_definitions() {
        let gate = [-3.0f32, 0.5, 2.0, 9.0];
        let up = [-5.0f32, -0.25, 1.5, 4.0];
        let mut g = gate;
        swiglu_clamped_inplace(&mut g, &up, 1.0);
        // The gate is clamped from above only, up from both sides.
        let want = [
            -silu(-3.0),
            silu(0.5) * -0.25,
            silu(1.0) * 1.0,
            silu(1.0) * 1.0,
        ];
        assert_eq!(g, want);
        let x: Vec<f32> = (0..40).map(|i| (i as f32 * 0.61).cos() * 2.0).collect();
        let mean_sq = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 40.0;
        let mut y = x.clone();
        rms_norm_unweighted_inplace(&mut y, 1e-6);
        for (a, b) in x.iter().zip(&y) {
            let exact = *a as f64 / (mean_sq + 1e-6).sqrt();
            assert!((*b as f64 - exact).abs() < 1e-6);
        }
    }

    #[test]
    fn epsilons_and_plain_swiglu_follow_their_definitions() {
        // A large eps, so that adding it in the wrong place shows.
        let x0 = [1.0f32, -2.0, 3.5, 0.25];
        let xs: Vec<f64> = x0.iter().map(|&v| v as f64).collect();
        let mean = xs.iter().sum::<f64>() / 4.0;
        let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
        let mut x = x0;
        layer_norm_inplace(&mut x, &[1.0; 4], &[0.0; 4], 0.5);
        let mean_sq = xs.iter().map(|v| v * v).sum::<f64>() / 4.0;
        let mut y = x0;
        rms_norm_unweighted_inplace(&mut y, 0.5);
        for i in 0..4 {
            let want = (xs[i] - mean) / (var + 0.5).sqrt();
            assert!((x[i] as f64 - want).abs() < 1e-6, "layer norm {i}");
            let want = xs[i] / (mean_sq + 0.5).sqrt();
            assert!((y[i] as f64 - want).abs() < 1e-6, "unweighted {i}");
        }
        let mut g = [-3.0f32, 0.5, 2.0];
        swiglu_inplace(&mut g, &[-5.0, 4.0, 1.5]);
        assert_eq!(g, [silu(-3.0) * -5.0, silu(0.5) * 4.0, silu(2.0) * 1.5]);
    }

    #[test]
    fn silu_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((silu(-20.0) + 4.122_307e-8).abs() < 1e-12);
    }
}
