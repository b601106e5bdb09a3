//! Rotary position embeddings.
//!
//! The frequency table `inv_freq` depends only on (rotary dim, θ, scaling) and is
//! computed once ([`RopeTable::new`]); per position only `cos`/`sin` are
//! evaluated. Both layouts are supported: half-split (`transformers`'
//! `rotate_half`, pairs `(i, i + d/2)`) and interleaved (pairs `(2i, 2i + 1)`).

use coli_core::RopeScaling;

/// Which elements of a head are rotated together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs `(i, i + d/2)`.
    HalfSplit,
    /// Pairs `(2i, 2i + 1)`.
    Interleaved,
}

/// The frequency table of one (rotary dim, θ, scaling).
#[derive(Clone, Debug)]
pub struct RopeTable {
    rot_dim: usize,
    inv_freq: Vec<f32>,
    scale: f32,
}

/// Computes `inv_freq` as `transformers` does, in f32: `1 / θ^(2i/d)`, then the scaling rule.
pub fn compute_inv_freq(rot_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    assert!(
        rot_dim.is_multiple_of(2) && rot_dim > 0,
        "rotary dim must be even and positive, got {rot_dim}"
    );
    let base = theta as f32;
    let mut inv: Vec<f32> = (0..rot_dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / rot_dim as f32))
        .collect();
    match *scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            for f in &mut inv {
                *f /= factor as f32;
            }
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, lo, hi, old) = (
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                original_max_position_embeddings as f32,
            );
            let low_freq_wavelen = old / lo;
            let high_freq_wavelen = old / hi;
            for f in &mut inv {
                let wavelen = 2.0 * std::f32::consts::PI / *f;
                let scaled = if wavelen > low_freq_wavelen {
                    *f / factor
                } else {
                    *f
                };
                // transformers: ~(wavelen < high) & ~(wavelen > low); wavelengths here are finite.
                let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                *f = if medium {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    (1.0 - smooth) * scaled / factor + smooth * scaled
                } else {
                    scaled
                };
            }
        }
        RopeScaling::Yarn(ref y) => {
            // transformers' `_compute_yarn_parameters`: the correction range in f64, the
            // ramp and the blend in f32.
            let dim = rot_dim as f64;
            let correction_dim = |rotations: f64| {
                dim * (y.original_max_position_embeddings
                    / (rotations * 2.0 * std::f64::consts::PI))
                    .ln()
                    / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
            if y.truncate {
                low = low.floor();
                high = high.ceil();
            }
            let (low, mut high) = (low.max(0.0) as f32, high.min(dim - 1.0) as f32);
            if low == high {
                high += 0.001;
            }
            let factor = y.factor as f32;
            for (i, f) in inv.iter_mut().enumerate() {
                let pos_freq = base.powf((2 * i) as f32 / rot_dim as f32);
                let extrapolation = 1.0 / pos_freq;
                let interpolation = 1.0 / (factor * pos_freq);
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation_factor = 1.0 - ramp;
                *f = interpolation * (1.0 - extrapolation_factor)
                    + extrapolation * extrapolation_factor;
            }
        }
    }
    inv
}

/// The factor the scaling applies to cos and sin (YaRN's attention factor; 1 otherwise).
pub fn attention_scaling(scaling: &RopeScaling) -> f32 {
    match scaling {
        RopeScaling::Yarn(y) => y.attention_factor() as f32,
        _ => 1.0,
    }
}

/// `cos`/`sin` of `pos * inv_freq[i]` (the product rounded to f32 first, as `transformers` does),
/// each multiplied by `scale` (1 except for YaRN).
pub fn cos_sin_from(inv_freq: &[f32], scale: f32, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
    let p = pos as f32;
    for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freq) {
        let a = p * f;
        *c = a.cos() * scale;
        *s = a.sin() * scale;
    }
}

impl RopeTable {
    /// Builds the table once.
    pub fn new(rot_dim: usize, theta: f64, scaling: &RopeScaling) -> RopeTable {
        RopeTable {
            rot_dim,
            inv_freq: compute_inv_freq(rot_dim, theta, scaling),
            scale: attention_scaling(scaling),
        }
    }

    /// The rotary dimension (elements rotated per head).
    pub fn rot_dim(&self) -> usize {
        self.rot_dim
    }

    /// The cached frequencies.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// `cos`/`sin` for a position (each `rot_dim / 2` long).
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        cos_sin_from(&self.inv_freq, self.scale, pos, cos, sin)
    }
}

/// Rotates the first `2 * cos.len()` elements of one head in place.
pub fn apply(layout: RopeLayout, x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    match layout {
        RopeLayout::HalfSplit => {
            for i in 0..half {
                let (a, b) = (x[i], x[i + half]);
                x[i] = a * cos[i] - b * sin[i];
                x[i + half] = b * cos[i] + a * sin[i];
            }
        }
        RopeLayout::Interleaved => {
            for i in 0..half {
                let (a, b) = (x[2 * i], x[2 * i + 1]);
                x[2 * i] = a * cos[i] - b * sin[i];
                x[2 * i + 1] = b * cos[i] + a * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frequencies_follow_the_formula() {
        let inv = compute_inv_freq(8, 10000.0, &RopeScaling::None);
        assert_eq!(inv.len(), 4, "one frequency per pair");
        for (i, f) in inv.iter().enumerate() {
            let want = 1.0 / 10000f64.powf(2.0 * i as f64 / 8.0);
            assert!(((*f as f64) - want).abs() / want < 1e-6);
        }
    }

    #[test]
    fn linear_and_llama3_scaling_follow_transformers_formulas() {
        let plain = compute_inv_freq(32, 500000.0, &RopeScaling::None);
        let linear = compute_inv_freq(32, 500000.0, &RopeScaling::Linear { factor: 4.0 });
        for (p, q) in plain.iter().zip(&linear) {
            assert_eq!(*q, p / 4.0);
        }
        // `_compute_llama3_parameters` in f64: kept above the high-frequency wavelength,
        // divided by the factor below the low one, smoothly blended between.
        let (factor, lo, hi, old) = (8.0f64, 1.0, 4.0, 256.0);
        let s = RopeScaling::Llama3 {
            factor,
            low_freq_factor: lo,
            high_freq_factor: hi,
            original_max_position_embeddings: old,
        };
        let got = compute_inv_freq(32, 500000.0, &s);
        let mut bands = [0; 3];
        for (p, q) in plain.iter().zip(&got) {
            let f = *p as f64;
            let wl = 2.0 * std::f64::consts::PI / f;
            let want = if wl < old / hi {
                bands[0] += 1;
                f
            } else if wl > old / lo {
                bands[2] += 1;
                f / factor
            } else {
                bands[1] += 1;
                let smooth = (old / wl - lo) / (hi - lo);
                (1.0 - smooth) * f / factor + smooth * f
            };
            assert!((*q as f64 - want).abs() <= want * 1e-6, "{q} vs {want}");
        }
        assert!(
            bands.iter().all(|&b| b > 0),
            "every band is covered: {bands:?}"
        );
    }

    #[test]
    fn yarn_follows_transformers_compute_yarn_parameters() {
        // `_compute_yarn_parameters` in f64: the correction range from beta_fast/slow
        // (rounded outward when `truncate`), a linear ramp over it, then each frequency
        // blended between interpolation (`/ factor`) and extrapolation.
        use coli_core::YarnParameters;
        for (truncate, beta_fast, beta_slow) in [(true, 32.0, 1.0), (false, 24.0, 2.0)] {
            let y = YarnParameters {
                factor: 16.0,
                beta_fast,
                beta_slow,
                original_max_position_embeddings: 4096.0,
                attention_factor: None,
                mscale: None,
                mscale_all_dim: None,
                truncate,
            };
            let (dim, base) = (64usize, 10000.0f64);
            let got = compute_inv_freq(dim, base, &RopeScaling::Yarn(y.clone()));
            let corr = |rot: f64| {
                dim as f64 * (4096.0 / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
            };
            let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, high) = (low.max(0.0), high.min(dim as f64 - 1.0));
            let mut ramped = 0;
            for (i, g) in got.iter().enumerate() {
                let pos_freq = base.powf(2.0 * i as f64 / dim as f64);
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                if ramp > 0.0 && ramp < 1.0 {
                    ramped += 1;
                }
                let extrapolation_factor = 1.0 - ramp;
                let want = 1.0 / (16.0 * pos_freq) * (1.0 - extrapolation_factor)
                    + 1.0 / pos_freq * extrapolation_factor;
                assert!(
                    (*g as f64 - want).abs() <= want * 2e-6,
                    "{i}: {g} vs {want}"
                );
            }
            assert!(ramped > 0, "the ramp is exercised");
        }
    }

    #[test]
    fn the_table_rotates_by_position_times_frequency_scaled_by_yarns_factor() {
        let y = coli_core::YarnParameters {
            factor: 4.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 64.0,
            attention_factor: None,
            mscale: None,
            mscale_all_dim: None,
            truncate: true,
        };
        let scaling = RopeScaling::Yarn(y);
        // transformers' default attention factor: 0.1 ln(factor) + 1.
        let scale = 0.1 * 4f64.ln() + 1.0;
        assert!((attention_scaling(&scaling) as f64 - scale).abs() < 1e-6);
        assert_eq!(attention_scaling(&RopeScaling::None), 1.0);
        let t = RopeTable::new(4, 10000.0, &scaling);
        assert_eq!(t.rot_dim(), 4);
        assert_eq!(t.inv_freq(), &compute_inv_freq(4, 10000.0, &scaling)[..]);
        let (mut c, mut s) = ([0.0f32; 2], [0.0f32; 2]);
        t.cos_sin(7, &mut c, &mut s);
        for i in 0..2 {
            let a = (7.0f32 * t.inv_freq()[i]) as f64;
            assert!((c[i] as f64 - a.cos() * scale).abs() < 1e-6, "cos {i}");
            assert!((s[i] as f64 - a.sin() * scale).abs() < 1e-6, "sin {i}");
        }
        // Pairs (i, i + 2) half-split, (2i, 2i + 1) interleaved: [a, b] -> [a c - b s, b c + a s].
        let x = [1.0f32, 2.0, -3.0, 0.5];
        let mut h = x;
        apply(RopeLayout::HalfSplit, &mut h, &c, &s);
        let mut v = x;
        apply(RopeLayout::Interleaved, &mut v, &c, &s);
        for i in 0..2 {
            let (a, b) = (x[i], x[i + 2]);
            assert_eq!((h[i], h[i + 2]), (a * c[i] - b * s[i], b * c[i] + a * s[i]));
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            assert_eq!(
                (v[2 * i], v[2 * i + 1]),
                (a * c[i] - b * s[i], b * c[i] + a * s[i])
            );
        }
    }

    #[test]
    fn llama3_keeps_high_and_divides_low_frequencies() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let plain = compute_inv_freq(16, 10000.0, &RopeScaling::None);
        let scaled = compute_inv_freq(16, 10000.0, &s);
        // wavelength 2π/f: < 16 kept, > 64 divided by 8, between smoothly interpolated.
        for (p, q) in plain.iter().zip(&scaled) {
            let wl = 2.0 * std::f32::consts::PI / p;
            if wl < 16.0 {
                assert_eq!(p, q);
            } else if wl > 64.0 {
                assert_eq!(*q, p / 8.0);
            } else {
                assert!(*q < *p && *q > p / 8.0);
            }
        }
    }

    #[test]
    fn rotation_preserves_norm_and_layouts_agree_up_to_permutation() {
        let t = RopeTable::new(8, 10000.0, &RopeScaling::None);
        let (mut c, mut s) = (vec![0.0; 4], vec![0.0; 4]);
        t.cos_sin(7, &mut c, &mut s);
        let x: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut h = x.clone();
        apply(RopeLayout::HalfSplit, &mut h, &c, &s);
        let n0: f32 = x.iter().map(|v| v * v).sum();
        let n1: f32 = h.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        // Interleave x, rotate interleaved, de-interleave: same as half-split.
        let mut il: Vec<f32> = (0..4).flat_map(|i| [x[i], x[i + 4]]).collect();
        apply(RopeLayout::Interleaved, &mut il, &c, &s);
        for i in 0..4 {
            assert_eq!(il[2 * i], h[i]);
            assert_eq!(il[2 * i + 1], h[i + 4]);
        }
    }
}
