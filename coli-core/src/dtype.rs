//! Element types of stored tensors and their exact conversion to f32.

use std::fmt;

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16 (upper half of an f32).
    BF16,
    /// IEEE binary16.
    F16,
    /// 8-bit float, 4 exponent bits (bias 7), 3 mantissa bits, no infinities
    /// (`float8_e4m3fn`); block-scaled in FP8 checkpoints.
    F8E4M3,
    /// Signed 8-bit integer (coli int8 containers, with per-row scales).
    I8,
    /// Unsigned byte (coli int4 containers pack two 4-bit values per byte).
    U8,
    /// 8-bit power of two, `2^(b - 127)`, 255 is NaN (`float8_e8m0fnu`): block scales as
    /// DeepSeek-V4 ships them (`scale_fmt: "ue8m0"`). Never a weight matrix.
    F8E8M0,
    /// Signed 32-bit integer (index tables: DeepSeek-V4's `tid2eid` as the release ships
    /// it). Never a weight matrix.
    I32,
    /// Signed 64-bit integer (index tables as `transformers` saves them).
    I64,
}

/// `float8_e4m3fn` → f32 for every byte (exact: every e4m3 value is an f32).
pub const FP8_E4M3_TABLE: [f32; 256] = fp8_table();

const fn fp8_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut b = 0;
    while b < 256 {
        let sign = (b >> 7) as u32;
        let e = ((b >> 3) & 0xF) as u32;
        let m = (b & 7) as u32;
        let bits = if e == 0xF && m == 7 {
            0x7FC0_0000 // NaN (e4m3fn has no infinities)
        } else if e == 0 {
            // Subnormal: m/8 * 2^-6 = m * 2^-9, exact in f32.
            if m == 0 {
                0
            } else {
                // Normalise: highest set bit of m gives the exponent.
                let mut shift = 0;
                while (m << shift) & 4 == 0 {
                    shift += 1;
                }
                let mant = ((m << shift) & 3) << 21;
                // value = 1.mant * 2^(-7 - shift)
                ((127 - 7 - shift) << 23) | mant
            }
        } else {
            ((e + 127 - 7) << 23) | (m << 20)
        };
        t[b] = f32::from_bits(bits | (sign << 31));
        b += 1;
    }
    t
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::F8E4M3 | DType::I8 | DType::U8 | DType::F8E8M0 => 1,
            DType::I32 => 4,
            DType::I64 => 8,
        }
    }

    /// The safetensors spelling (`F32`, `BF16`, `F16`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F8E4M3 => "F8_E4M3",
            DType::I8 => "I8",
            DType::U8 => "U8",
            DType::F8E8M0 => "F8_E8M0",
            DType::I32 => "I32",
            DType::I64 => "I64",
        }
    }

    /// Parses the safetensors spelling; `None` for dtypes coli does not compute with.
    pub fn from_safetensors_name(s: &str) -> Option<DType> {
        match s {
            "F32" => Some(DType::F32),
            "BF16" => Some(DType::BF16),
            "F16" => Some(DType::F16),
            "F8_E4M3" => Some(DType::F8E4M3),
            "I8" => Some(DType::I8),
            "U8" => Some(DType::U8),
            "F8_E8M0" => Some(DType::F8E8M0),
            "I32" => Some(DType::I32),
            "I64" => Some(DType::I64),
            _ => None,
        }
    }

    /// Converts little-endian stored elements to f32. Exact for every float dtype here, and
    /// for integers up to 2^24 in magnitude (larger ones round to the nearest f32).
    pub fn to_f32(self, bytes: &[u8], out: &mut [f32]) {
        let n = bytes.len() / self.size();
        assert_eq!(
            n,
            out.len(),
            "to_f32: {} elements into {} slots",
            n,
            out.len()
        );
        match self {
            DType::F32 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            DType::BF16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            DType::F16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                }
            }
            DType::F8E4M3 => {
                for (o, &b) in out.iter_mut().zip(bytes) {
                    *o = FP8_E4M3_TABLE[b as usize];
                }
            }
            DType::I8 => {
                for (o, &b) in out.iter_mut().zip(bytes) {
                    *o = b as i8 as f32;
                }
            }
            DType::U8 => {
                for (o, &b) in out.iter_mut().zip(bytes) {
                    *o = b as f32;
                }
            }
            DType::F8E8M0 => {
                for (o, &b) in out.iter_mut().zip(bytes) {
                    *o = e8m0_to_f32(b);
                }
            }
            DType::I32 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
                }
            }
            DType::I64 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                    *o = i64::from_le_bytes(c.try_into().expect("8 bytes")) as f32;
                }
            }
        }
    }

    /// Converts stored elements to a new f32 vector.
    pub fn to_f32_vec(self, bytes: &[u8]) -> Vec<f32> {
        let mut v = vec![0.0; bytes.len() / self.size()];
        self.to_f32(bytes, &mut v);
        v
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

/// E8M0 to f32: `2^(b - 127)` (exact, including 2^-127, an f32 subnormal); 255 is NaN.
#[inline]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        255 => f32::NAN,
        0 => f32::from_bits(1 << 22),
        b => f32::from_bits((b as u32) << 23),
    }
}

/// bf16 bits to f32 (exact: bf16 is the upper half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bf16 bits, round to nearest even (what torch's `.to(bfloat16)` does); NaN stays NaN.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The e4m3fn decoding from its definition (OCP FP8 spec): sign, 4-bit exponent with
    /// bias 7, 3-bit mantissa, subnormals at exponent 0, NaN at S.1111.111, no infinities.
    #[test]
    fn fp8_e4m3_table_follows_the_specification() {
        for b in 0..256u32 {
            let (s, e, m) = (b >> 7, (b >> 3) & 0xF, b & 7);
            let v = FP8_E4M3_TABLE[b as usize] as f64;
            if e == 0xF && m == 7 {
                assert!(v.is_nan(), "{b:#x}");
                continue;
            }
            let mag = if e == 0 {
                m as f64 / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7)
            };
            let want = if s == 1 { -mag } else { mag };
            assert_eq!(v, want, "{b:#x}");
        }
        assert_eq!(FP8_E4M3_TABLE[0x7E], 448.0);
    }

    #[test]
    fn e8m0_is_a_power_of_two_by_the_specification() {
        for b in 0..255u8 {
            assert_eq!(e8m0_to_f32(b) as f64, 2f64.powi(b as i32 - 127), "{b}");
        }
        assert!(e8m0_to_f32(255).is_nan());
        assert_eq!(DType::F8E8M0.to_f32_vec(&[127, 130]), vec![1.0, 8.0]);
    }

    #[test]
    fn bf16_round_trip_is_exact_on_representable_values() {
        for bits in (0u16..=0xffff).step_by(7) {
            let x = bf16_to_f32(bits);
            if x.is_nan() {
                continue;
            }
            assert_eq!(f32_to_bf16(x), bits);
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties to even -> 1.
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        // 1 + 3*2^-8 ties between 1+2^-7 (odd mantissa) and 1+2^-6: goes to 1+2^-6.
        assert_eq!(
            bf16_to_f32(f32_to_bf16(1.0 + 3.0 / 256.0)),
            1.0 + 1.0 / 64.0
        );
    }

    #[test]
    fn f16_conversion_matches_spec_values() {
        // 0x3c00 = 1.0, 0xc000 = -2.0, 0x7bff = 65504 (max finite), 0x0001 = 2^-24.
        let bytes: Vec<u8> = [0x3c00u16, 0xc000, 0x7bff, 0x0001]
            .iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        let v = DType::F16.to_f32_vec(&bytes);
        assert_eq!(v, vec![1.0, -2.0, 65504.0, 2f32.powi(-24)]);
    }
}
