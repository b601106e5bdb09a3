//! Gated DeltaNet (Qwen3-Next's linear attention): the short causal convolution, the L2
//! normalisation of queries and keys, and one step of the gated delta rule on a head's
//! `[dk, dv]` state. Plain loops in a fixed order (no ISA-dependent reductions): every
//! instruction set gives the same bits, and a prompt fed at once gives the bits of the same
//! prompt fed one token at a time, because both run these steps token after token.

use crate::norm::silu;

/// `x / sqrt(sum(x²) + eps)` in place (`l2norm` of the modeling file: eps inside the root,
/// added to the sum, not the mean). Sums left to right.
pub fn l2_normalize(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().fold(0.0, |a, &v| a + v * v);
    let inv = 1.0 / (ss + eps).sqrt();
    for v in x {
        *v *= inv;
    }
}

/// `torch.nn.functional.softplus` with its defaults (beta 1, threshold 20): `x` above 20,
/// else `ln(1 + e^x)`.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// One token of the depthwise causal convolution followed by SiLU, for every channel:
/// `out[c] = silu(sum_j w[c][j] * window_j[c])` over the `k` inputs ending at this token.
/// `history` holds the previous `k - 1` inputs, oldest first, `[k - 1, channels]`
/// (zeros before the sequence starts); `weight` is `[channels, k]`. The history then
/// shifts by one and takes `x`.
pub fn causal_conv_step(history: &mut [f32], weight: &[f32], k: usize, x: &[f32], out: &mut [f32]) {
    let c = x.len();
    assert!(k >= 1);
    assert_eq!(history.len(), (k - 1) * c);
    assert_eq!(weight.len(), c * k);
    assert_eq!(out.len(), c);
    for (ch, o) in out.iter_mut().enumerate() {
        let w = &weight[ch * k..(ch + 1) * k];
        let mut acc = 0.0f32;
        for (j, &wj) in w[..k - 1].iter().enumerate() {
            acc += wj * history[j * c + ch];
        }
        acc += w[k - 1] * x[ch];
        *o = silu(acc);
    }
    if k > 1 {
        history.copy_within(c.., 0);
        history[(k - 2) * c..].copy_from_slice(x);
    }
}

/// One token of the gated delta rule on one head's state `s` (`[dk, dv]`, row per key
/// dimension): `S *= decay; delta = beta (v - Sᵀk); S += k deltaᵀ; out = Sᵀq`. `q` and `k`
/// are already normalised (and `q` scaled); `decay` is `exp(g)`. `tmp` holds `dv` floats.
/// Sums over the key dimension run in index order.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_step(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    tmp: &mut [f32],
    out: &mut [f32],
) {
    let (dk, dv) = (k.len(), v.len());
    assert_eq!(q.len(), dk);
    assert_eq!(s.len(), dk * dv);
    assert_eq!(tmp.len(), dv);
    assert_eq!(out.len(), dv);
    tmp.fill(0.0);
    for (row, &ki) in s.chunks_exact_mut(dv).zip(k) {
        for (m, x) in tmp.iter_mut().zip(row.iter_mut()) {
            *x *= decay;
            *m += *x * ki;
        }
    }
    for (d, &vj) in tmp.iter_mut().zip(v) {
        *d = (vj - *d) * beta;
    }
    out.fill(0.0);
    for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((x, &d), o) in row.iter_mut().zip(tmp.iter()).zip(out.iter_mut()) {
            *x += ki * d;
            *o += *x * qi;
        }
    }
}

/// Gated RMSNorm of one value head's output (`RMSNormGated`): normalise, scale by `weight`,
/// then multiply by `silu(z)`.
pub fn rms_norm_gated(x: &mut [f32], weight: &[f32], z: &[f32], eps: f32) {
    assert_eq!(x.len(), weight.len());
    assert_eq!(x.len(), z.len());
    let ss: f32 = x.iter().fold(0.0, |a, &v| a + v * v);
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((xi, &w), &zi) in x.iter_mut().zip(weight).zip(z) {
        *xi = w * (*xi * inv) * silu(zi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The delta rule written as matrices in f64, from its definition.
    fn reference_step(
        s: &[f64],
        q: &[f64],
        k: &[f64],
        v: &[f64],
        decay: f64,
        beta: f64,
    ) -> (Vec<f64>, Vec<f64>) {
        let (dk, dv) = (k.len(), v.len());
        let decayed: Vec<f64> = s.iter().map(|x| x * decay).collect();
        let mut new = decayed.clone();
        for j in 0..dv {
            let sk: f64 = (0..dk).map(|i| decayed[i * dv + j] * k[i]).sum();
            let delta = beta * (v[j] - sk);
            for i in 0..dk {
                new[i * dv + j] += k[i] * delta;
            }
        }
        let out = (0..dv)
            .map(|j| (0..dk).map(|i| new[i * dv + j] * q[i]).sum())
            .collect();
        (new, out)
    }

    proptest! {
        #[test]
        fn delta_step_matches_the_matrix_definition(
            dk in 1usize..9, dv in 1usize..9, seed in any::<u64>(),
            decay in 0.0f32..1.0, beta in 0.0f32..1.0,
        ) {
            let mut r = seed;
            let mut next = || {
                r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            };
            let s: Vec<f32> = (0..dk * dv).map(|_| next()).collect();
            let q: Vec<f32> = (0..dk).map(|_| next()).collect();
            let k: Vec<f32> = (0..dk).map(|_| next()).collect();
            let v: Vec<f32> = (0..dv).map(|_| next()).collect();
            let f = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<_>>();
            let (want_s, want_o) =
                reference_step(&f(&s), &f(&q), &f(&k), &f(&v), decay as f64, beta as f64);
            let mut got_s = s.clone();
            let (mut tmp, mut out) = (vec![0.0; dv], vec![0.0; dv]);
            gated_delta_step(&mut got_s, &q, &k, &v, decay, beta, &mut tmp, &mut out);
            for (a, b) in got_s.iter().zip(&want_s).chain(out.iter().zip(&want_o)) {
                prop_assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn the_convolution_sees_the_last_k_inputs_and_zeros_before_them() {
        // Two channels, 3 taps: out = silu(w0 x[t-2] + w1 x[t-1] + w2 x[t]).
        let w = [1.0, 10.0, 100.0, -1.0, 0.5, 2.0];
        let mut hist = vec![0.0; 4];
        let mut out = [0.0; 2];
        let xs = [[1.0, 2.0], [3.0, -4.0], [5.0, 6.0], [7.0, 8.0]];
        let mut got = vec![];
        for x in &xs {
            causal_conv_step(&mut hist, &w, 3, x, &mut out);
            got.push(out);
        }
        let want = |t: usize, ch: usize| {
            let at = |i: isize| if i < 0 { 0.0 } else { xs[i as usize][ch] };
            let t = t as isize;
            silu(w[ch * 3] * at(t - 2) + w[ch * 3 + 1] * at(t - 1) + w[ch * 3 + 2] * at(t))
        };
        for (t, o) in got.iter().enumerate() {
            for (ch, &v) in o.iter().enumerate() {
                assert_eq!(v, want(t, ch), "t {t} ch {ch}");
            }
        }
        assert_eq!(hist, vec![5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn softplus_and_l2_norm_follow_torch() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!((softplus(-30.0) - (-30.0f32).exp()).abs() < 1e-20);
        // Above the threshold softplus is x itself, however large (e^x overflows f32).
        assert_eq!(softplus(100.0), 100.0);
        let mut x = [3.0, 4.0];
        l2_normalize(&mut x, 0.0);
        assert_eq!(x, [0.6, 0.8]);
        // eps inside the root, added to the sum: 1 / sqrt(25 + 11) = 1/6.
        let mut x = [3.0f32, 4.0];
        l2_normalize(&mut x, 11.0);
        assert!(
            (x[0] - 0.5).abs() < 1e-7 && (x[1] - 4.0 / 6.0).abs() < 1e-7,
            "{x:?}"
        );
        let mut g = [2.0, 2.0];
        rms_norm_gated(&mut g, &[1.0, 3.0], &[0.0, 40.0], 0.0);
        assert_eq!(g, [0.0, 3.0 * 40.0]);
    }

    #[test]
    fn gated_rms_norm_follows_its_definition() {
        // w * x / sqrt(mean(x²) + eps) * silu(z), in f64.
        let (x, w, z, eps) = (
            [1.0f32, -3.0, 0.5],
            [2.0f32, 5.0, -0.7],
            [1.0f32, -2.0, 0.3],
            0.5,
        );
        let mean = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 3.0;
        let silu = |v: f64| v / (1.0 + (-v).exp());
        let mut got = x;
        rms_norm_gated(&mut got, &w, &z, eps);
        for i in 0..3 {
            let want = w[i] as f64 * x[i] as f64 / (mean + eps as f64).sqrt() * silu(z[i] as f64);
            assert!(
                (got[i] as f64 - want).abs() < 1e-6,
                "{i}: {} vs {want}",
                got[i]
            );
        }
    }

    #[test]
    fn the_convolution_follows_its_definition_for_every_width() {
        // out[t] = silu(sum_j w[j] x[t - (k - 1) + j]), zeros before the first input, for
        // widths from one tap (no history) up.
        let xs: Vec<[f32; 2]> = (0..7)
            .map(|t| [t as f32 * 0.5 - 1.0, 2.0 - t as f32])
            .collect();
        for k in 1..6 {
            let w: Vec<f32> = (0..2 * k).map(|i| i as f32 * 0.25 - 0.6).collect();
            let mut hist = vec![0.0; (k - 1) * 2];
            let mut out = [0.0; 2];
            for (t, x) in xs.iter().enumerate() {
                causal_conv_step(&mut hist, &w, k, x, &mut out);
                for ch in 0..2 {
                    let mut acc = 0.0f32;
                    for j in 0..k {
                        let i = t as isize - (k as isize - 1) + j as isize;
                        let v = if i < 0 { 0.0 } else { xs[i as usize][ch] };
                        acc += w[ch * k + j] * v;
                    }
                    assert_eq!(out[ch], silu(acc), "k {k} t {t} ch {ch}");
                }
            }
        }
    }
}
