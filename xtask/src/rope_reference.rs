//! An independent RoPE reference for `cargo xtask verify`: the pre-cache formula, written
//! again from `transformers`' `_compute_default_rope_parameters`, `_compute_linear_…`,
//! `_compute_llama3_parameters` and `_compute_yarn_parameters`, evaluated for one
//! (position, pair) at a time with the frequency recomputed by `powf` every time. It shares
//! no code with `coli_kernels::rope`, so the differential compares two implementations.

use coli_core::RopeScaling;

/// `get_mscale` of `transformers`' YaRN.
fn mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// The frequency of pair `j` of a `dim`-wide rotation.
fn inv_freq(j: usize, dim: usize, theta: f64, scaling: &RopeScaling) -> f32 {
    let exponent = (2 * j) as f32 / dim as f32;
    let pos_freq = (theta as f32).powf(exponent);
    let plain = 1.0 / pos_freq;
    match scaling {
        RopeScaling::None => plain,
        RopeScaling::Linear { factor } => plain / *factor as f32,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, lo, hi, old) = (
                *factor as f32,
                *low_freq_factor as f32,
                *high_freq_factor as f32,
                *original_max_position_embeddings as f32,
            );
            let wavelen = 2.0 * std::f32::consts::PI / plain;
            let (low_wavelen, high_wavelen) = (old / lo, old / hi);
            let llama = if wavelen > low_wavelen {
                plain / factor
            } else {
                plain
            };
            // transformers: `~(wavelen < high) & ~(wavelen > low)`, written as it says (a NaN
            // wavelength would count as medium there too).
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            let is_medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            if is_medium {
                let smooth = (old / wavelen - lo) / (hi - lo);
                (1.0 - smooth) * llama / factor + smooth * llama
            } else {
                llama
            }
        }
        RopeScaling::Yarn(y) => {
            let d = dim as f64;
            let find_dim = |rot: f64| {
                (d * (y.original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI)).ln())
                    / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (find_dim(y.beta_fast), find_dim(y.beta_slow));
            if y.truncate {
                low = low.floor();
                high = high.ceil();
            }
            let low = low.max(0.0) as f32;
            let mut high = high.min(d - 1.0) as f32;
            if low == high {
                high += 0.001;
            }
            let ramp = ((j as f32 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            let interpolation = 1.0 / (y.factor as f32 * pos_freq);
            interpolation * (1.0 - extrapolation_factor) + plain * extrapolation_factor
        }
    }
}

/// The factor YaRN applies to cos and sin (1 otherwise).
fn attention_factor(scaling: &RopeScaling) -> f32 {
    let RopeScaling::Yarn(y) = scaling else {
        return 1.0;
    };
    if let Some(a) = y.attention_factor {
        return a as f32;
    }
    let f = match (y.mscale, y.mscale_all_dim) {
        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
            mscale(y.factor, m) / mscale(y.factor, all)
        }
        _ => mscale(y.factor, 1.0),
    };
    f as f32
}

/// `(cos, sin)` of pair `j` at `pos`: the angle rounded to f32 first, as `transformers`'
/// `(inv_freq @ position_ids)` in f32 does, then scaled.
pub fn cos_sin(pos: usize, j: usize, dim: usize, theta: f64, scaling: &RopeScaling) -> (f32, f32) {
    let angle = pos as f32 * inv_freq(j, dim, theta, scaling);
    let scale = attention_factor(scaling);
    (angle.cos() * scale, angle.sin() * scale)
}
