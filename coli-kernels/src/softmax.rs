//! Numerically stable softmax.

/// Softmax in place: `exp(x - max) / sum`, summed left to right.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// Softmax in place over `x` and one more logit, `sink`, whose probability is dropped:
/// `exp(x - m) / (sum + exp(sink - m))` with `m` the maximum of both, the sink's term added
/// after the left-to-right sum (attention sinks).
pub fn softmax_with_sink(x: &mut [f32], sink: f32) {
    let max = x.iter().copied().fold(sink, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum += (sink - max).exp();
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// `log(sum(exp(x)))`, stable, accumulated in f64 (used for NLL).
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + s.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_survives_large_values() {
        let mut x = vec![1000.0, 1001.0, 999.0];
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let e = [(-1.0f64).exp(), 1.0, (-2.0f64).exp()];
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((x[i] as f64 - e[i] / s).abs() < 1e-6);
        }
        assert!((log_sum_exp(&[0.0, 0.0]) - 2f64.ln()).abs() < 1e-12);
        // A non-zero maximum: ln(e^3 + e^1) = 3 + ln(1 + e^-2).
        let want = 3.0 + (1.0 + (-2.0f64).exp()).ln();
        assert!((log_sum_exp(&[3.0, 1.0]) - want).abs() < 1e-12);
    }
}
