//! RMSNorm and SwiGLU.

use crate::cpu::{self, Isa};
use crate::dot::{dot_rows, dot_scalar, WFormat};

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

/// SiLU: `x * sigmoid(x)` computed as `x / (1 + e^-x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SwiGLU in place: `gate[i] = silu(gate[i]) * up[i]`.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
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
