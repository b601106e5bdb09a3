//! Numerically stable softmax.

use crate::cpu::{self, Isa};

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

/// Arguments below this give 0 (e^x would be under f32's smallest normal, 2^-126).
pub const EXP_MIN: f32 = -87.336_54;
/// Arguments above this give +inf (e^x past f32's largest finite value).
pub const EXP_MAX: f32 = 88.722_83;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two: a high part with few bits (so `n · LN2_HI` is exact) and the rest.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' `expf` polynomial for e^r on |r| <= ln 2 / 2: 1 + r + r²·P(r).
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `2^n` as an f32, for `n` in `-126..=127`.
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// e^x in f32 by one fixed sequence of operations, the definition the vector paths of
/// [`softmax_isa`] follow bit for bit (unlike the C library's `expf`, which differs between
/// systems and has no vector form here): `n = round(x · log2 e)` (ties to even),
/// `r = x - n·ln 2` in two fused steps, `e^r` by Cephes' polynomial in fused steps, times
/// `2^n` in two exact halves. Within 2 ulp of e^x; 0 below [`EXP_MIN`] (no subnormal
/// results), +inf above [`EXP_MAX`], NaN for NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < EXP_MIN {
        return 0.0;
    }
    if x > EXP_MAX {
        return f32::INFINITY;
    }
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_P[0];
    for c in &EXP_P[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    let n = n as i32;
    let half = n >> 1;
    y * pow2(half) * pow2(n - half)
}

/// Softmax in place with an optional sink (see [`softmax_with_sink`]), with [`exp_f32`] for
/// the exponentials: the maximum (sink included), `e_j = exp_f32(x_j - max)` (vectorized on
/// `isa`), their sum left to right, then the sink's term, then each `e_j / sum`. Every
/// instruction set gives the same bits.
///
/// # Panics
/// If `isa` does not run on this CPU.
pub fn softmax_isa(isa: Isa, x: &mut [f32], sink: Option<f32>) {
    let max = x
        .iter()
        .copied()
        .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    let done = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(cpu::supports(Isa::Avx512));
            // SAFETY: AVX-512F is available (checked).
            unsafe { x86::exp_shifted_avx512(x, max) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(cpu::supports(Isa::Avx2));
            // SAFETY: AVX2 and FMA are available (checked).
            unsafe { x86::exp_shifted_avx2(x, max) }
        }
        _ => 0,
    };
    for v in &mut x[done..] {
        *v = exp_f32(*v - max);
    }
    let mut sum = 0.0f32;
    for v in x.iter() {
        sum += *v;
    }
    if let Some(sink) = sink {
        sum += exp_f32(sink - max);
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{EXP_MAX, EXP_MIN, EXP_P, LN2_HI, LN2_LO, LOG2E};
    use std::arch::x86_64::*;

    /// [`super::exp_f32`] of each lane: the same operations, lane by lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn exp16(v: __m512) -> __m512 {
        // Out-of-range and NaN lanes compute on 0 and are replaced at the end.
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, _mm512_set1_ps(EXP_MIN));
        let high = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, _mm512_set1_ps(EXP_MAX));
        let xv = _mm512_mask_mov_ps(v, nan | low | high, _mm512_setzero_ps());
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xv, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), xv);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut poly = _mm512_set1_ps(EXP_P[0]);
        for c in &EXP_P[1..] {
            poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(*c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(poly, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let ni = _mm512_cvtps_epi32(n);
        let half = _mm512_srai_epi32::<1>(ni);
        let bias = _mm512_set1_epi32(127);
        let p1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(half, bias)));
        let rest = _mm512_sub_epi32(ni, half);
        let p2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(rest, bias)));
        let mut e = _mm512_mul_ps(_mm512_mul_ps(y, p1), p2);
        e = _mm512_mask_mov_ps(e, low, _mm512_setzero_ps());
        e = _mm512_mask_mov_ps(e, high, _mm512_set1_ps(f32::INFINITY));
        _mm512_mask_mov_ps(e, nan, v)
    }

    /// [`super::exp_f32`] of `x[j] - max` for every element, in place, the last group
    /// under a mask (its other lanes are neither read nor written); returns how many
    /// elements it did (all).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_shifted_avx512(x: &mut [f32], max: f32) -> usize {
        let m = _mm512_set1_ps(max);
        let mut j = 0;
        while j + 16 <= x.len() {
            let p = x.as_mut_ptr().add(j);
            _mm512_storeu_ps(p, exp16(_mm512_sub_ps(_mm512_loadu_ps(p), m)));
            j += 16;
        }
        let rest = x.len() - j;
        if rest > 0 {
            let k = ((1u32 << rest) - 1) as __mmask16;
            let p = x.as_mut_ptr().add(j);
            let v = _mm512_maskz_loadu_ps(k, p);
            _mm512_mask_storeu_ps(p, k, exp16(_mm512_sub_ps(v, m)));
        }
        x.len()
    }

    /// [`exp16`] on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp8(v: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
        let low = _mm256_cmp_ps::<_CMP_LT_OQ>(v, _mm256_set1_ps(EXP_MIN));
        let high = _mm256_cmp_ps::<_CMP_GT_OQ>(v, _mm256_set1_ps(EXP_MAX));
        let out = _mm256_or_ps(_mm256_or_ps(nan, low), high);
        let xv = _mm256_andnot_ps(out, v);
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(xv, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), xv);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut poly = _mm256_set1_ps(EXP_P[0]);
        for c in &EXP_P[1..] {
            poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(*c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let ni = _mm256_cvtps_epi32(n);
        let half = _mm256_srai_epi32::<1>(ni);
        let bias = _mm256_set1_epi32(127);
        let p1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(half, bias)));
        let rest = _mm256_sub_epi32(ni, half);
        let p2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(rest, bias)));
        let mut e = _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
        e = _mm256_blendv_ps(e, _mm256_setzero_ps(), low);
        e = _mm256_blendv_ps(e, _mm256_set1_ps(f32::INFINITY), high);
        _mm256_blendv_ps(e, v, nan)
    }

    /// [`exp_shifted_avx512`] in groups of 8.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shifted_avx2(x: &mut [f32], max: f32) -> usize {
        let m = _mm256_set1_ps(max);
        let mut j = 0;
        while j + 8 <= x.len() {
            let p = x.as_mut_ptr().add(j);
            _mm256_storeu_ps(p, exp8(_mm256_sub_ps(_mm256_loadu_ps(p), m)));
            j += 8;
        }
        j
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

    /// Distance in units in the last place between two positive finite f32s.
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn exp_f32_is_within_two_ulp_of_e_to_the_x() {
        // Every 97th f32 bit pattern in [EXP_MIN, EXP_MAX] (both signs), the f64 exponential
        // rounded to f32 as the reference.
        let mut worst = 0;
        for bits in (0u32..0x42B2_0000).step_by(97) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if !(EXP_MIN..=EXP_MAX).contains(&x) {
                    continue;
                }
                let want = (x as f64).exp() as f32;
                if want == 0.0 || want.is_infinite() || want < f32::MIN_POSITIVE {
                    continue;
                }
                let d = ulps(exp_f32(x), want);
                worst = worst.max(d);
                assert!(d <= 2, "exp({x}) = {} against {want}", exp_f32(x));
            }
        }
        assert!(worst >= 1, "the sweep compared nothing");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        // The ends of the range: the smallest normal and the largest finite values.
        assert!(exp_f32(EXP_MIN) >= f32::MIN_POSITIVE * 0.99);
        assert!(exp_f32(EXP_MAX).is_finite() && exp_f32(EXP_MAX) > 3.4e38);
    }

    #[test]
    fn every_instruction_set_gives_the_scalar_softmax_bits() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        for n in [1usize, 7, 8, 15, 16, 17, 40, 100, 257] {
            for spread in [0.5f32, 30.0, 200.0] {
                let mut x: Vec<f32> = (0..n).map(|_| (rnd() - 0.5) * spread).collect();
                if n > 20 {
                    // Lanes out of range on both sides and a NaN-free -inf (masked positions).
                    x[3] = f32::NEG_INFINITY;
                    x[11] = -1e30;
                }
                for sink in [None, Some(0.25f32)] {
                    let mut want = x.clone();
                    softmax_isa(Isa::Scalar, &mut want, sink);
                    let total: f32 = want.iter().sum();
                    assert!(
                        total <= 1.0 + 1e-5 && total > if sink.is_some() { 0.0 } else { 0.999 }
                    );
                    for isa in cpu::available() {
                        let mut got = x.clone();
                        softmax_isa(isa, &mut got, sink);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{isa:?} n {n} spread {spread} {sink:?}"
                        );
                    }
                }
            }
        }
        // Elementwise, the vector exponentials against the scalar one on edge inputs (max 0).
        let edges = [
            0.0f32,
            -0.0,
            1e-30,
            -1e-30,
            0.5,
            -0.5,
            88.0,
            EXP_MAX,
            88.8,
            EXP_MIN,
            -87.4,
            -103.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.5,
            -1.5,
            2.5,
            -2.5,
            60.6,
            -60.6,
            f32::MIN_POSITIVE,
            3.4e38,
            -3.4e38,
            10.0,
            -10.0,
            0.346_573_6,
            -0.346_573_6,
            std::f32::consts::LN_2,
            1.039_720_8,
            44.0,
            -44.0,
        ];
        for isa in cpu::available() {
            let mut got = edges;
            let done = match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the set is available (listed by `available`).
                Isa::Avx512 => unsafe { x86::exp_shifted_avx512(&mut got, 0.0) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                Isa::Avx2 => unsafe { x86::exp_shifted_avx2(&mut got, 0.0) },
                _ => 0,
            };
            for (j, (&x, &g)) in edges.iter().zip(&got).enumerate().take(done) {
                let w = exp_f32(x);
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{isa:?} exp({x}) at {j}: {g} against {w}"
                );
            }
        }
    }

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
