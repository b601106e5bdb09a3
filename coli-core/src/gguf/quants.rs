//! The ggml block types, dequantized as `gguf-py` (`gguf.quants`) defines them: the scalar
//! reference every kernel of a GGUF weight format reproduces.
//!
//! Each function below decodes one block, and computes every value with the same f32
//! operations, in the same order, as gguf-py's numpy code: a sub-block scale is formed
//! first (`d * sc`, rounded to f32), then applied to the quant (`dl * q - m`, two
//! roundings; never a fused multiply-add), and signs are applied by multiplying by ±1.
//! Values are therefore bit-equal to `gguf.quants.dequantize` (tested against it on
//! random blocks and on llama.cpp's quantizer output, `tests/fixtures/gguf_quants/`).

// Indices mirror the block layouts (element j of sub-block k), so loops run over them.
#![allow(clippy::needless_range_loop)]

use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::GgmlType;

/// IQ4_NL's and IQ4_XS' sixteen values.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's `e2m1` values, doubled (the scale is halved to match: see [`e8m0_half`]).
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// IQ1_S/IQ1_M's offset of every grid value (`IQ1S_DELTA`).
pub const IQ1_DELTA: f32 = 0.125;

/// Bit `j` of `KSIGNS[i]` is the sign of element `j` of an 8-value group: the seven bits
/// of `i`, and an eighth that makes the number of minus signs even.
const fn ksigns() -> [u8; 128] {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | (((i as u8).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
}

/// The sign patterns of IQ2_XXS, IQ2_XS and IQ3_XXS.
pub const KSIGNS: [u8; 128] = ksigns();

#[inline(always)]
fn f16(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

#[inline(always)]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// `1.0` or `-1.0` for sign bit `bit` (multiplied, as gguf-py does, not negated: the two
/// differ on a NaN).
#[inline(always)]
fn sign(bits: u8, bit: usize) -> f32 {
    if (bits >> bit) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// `ggml_e8m0_to_fp32_half`: half of `2^(e - 127)`, exactly (255 gives 2^126, not NaN).
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

/// Q4_K/Q5_K's eight 6-bit scales and minimums, unpacked from their 12 bytes.
#[inline(always)]
pub fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for k in 0..4 {
        sc[k] = s[k] & 0x3f;
        mn[k] = s[4 + k] & 0x3f;
        sc[4 + k] = (s[8 + k] & 0x0f) | ((s[k] >> 2) & 0x30);
        mn[4 + k] = (s[8 + k] >> 4) | ((s[4 + k] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Decodes one block of `ty` (`b`, exactly one block's bytes) into `o` (its elements).
pub fn dequantize_block(ty: GgmlType, b: &[u8], o: &mut [f32]) {
    match ty {
        GgmlType::F32 => o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => o[0] = f16(b, 0),
        GgmlType::BF16 => o[0] = f32::from_bits((u16_at(b, 0) as u32) << 16),
        GgmlType::Q4_0 => {
            let d = f16(b, 0);
            for j in 0..16 {
                o[j] = d * ((b[2 + j] & 0x0f) as i32 - 8) as f32;
                o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
            }
        }
        GgmlType::Q4_1 => {
            let (d, m) = (f16(b, 0), f16(b, 2));
            for j in 0..16 {
                o[j] = d * (b[4 + j] & 0x0f) as f32 + m;
                o[j + 16] = d * (b[4 + j] >> 4) as f32 + m;
            }
        }
        GgmlType::Q5_0 => {
            let (d, qh) = (f16(b, 0), u32_at(b, 2));
            for j in 0..32 {
                let q = q5(&b[6..], qh, j);
                o[j] = d * (q as i32 - 16) as f32;
            }
        }
        GgmlType::Q5_1 => {
            let (d, m, qh) = (f16(b, 0), f16(b, 2), u32_at(b, 4));
            for j in 0..32 {
                o[j] = d * q5(&b[8..], qh, j) as f32 + m;
            }
        }
        GgmlType::Q8_0 => {
            let d = f16(b, 0);
            for j in 0..32 {
                o[j] = (b[2 + j] as i8) as f32 * d;
            }
        }
        GgmlType::Q2_K => q2_k(b, o),
        GgmlType::Q3_K => q3_k(b, o),
        GgmlType::Q4_K => q45_k(b, None, o),
        GgmlType::Q5_K => q45_k(&b[..16], Some((&b[16..48], &b[48..176])), o),
        GgmlType::Q6_K => q6_k(b, o),
        GgmlType::IQ2_XXS => iq2_xxs(b, o),
        GgmlType::IQ2_XS => iq2_xs(b, o),
        GgmlType::IQ2_S => iq2_s(b, o),
        GgmlType::IQ3_XXS => iq3_xxs(b, o),
        GgmlType::IQ3_S => iq3_s(b, o),
        GgmlType::IQ1_S => iq1_s(b, o),
        GgmlType::IQ1_M => iq1_m(b, o),
        GgmlType::IQ4_NL => {
            let d = f16(b, 0);
            for j in 0..16 {
                o[j] = d * IQ4_VALUES[(b[2 + j] & 0x0f) as usize] as f32;
                o[j + 16] = d * IQ4_VALUES[(b[2 + j] >> 4) as usize] as f32;
            }
        }
        GgmlType::IQ4_XS => iq4_xs(b, o),
        GgmlType::MXFP4 => {
            let d = e8m0_half(b[0]);
            for j in 0..16 {
                o[j] = d * MXFP4_VALUES[(b[1 + j] & 0x0f) as usize] as f32;
                o[j + 16] = d * MXFP4_VALUES[(b[1 + j] >> 4) as usize] as f32;
            }
        }
    }
}

/// Q5_0/Q5_1 element `j`: its nibble of `qs` (low nibbles first) and bit `j` of `qh`.
#[inline(always)]
fn q5(qs: &[u8], qh: u32, j: usize) -> u8 {
    let lo = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    lo | ((((qh >> j) & 1) as u8) << 4)
}

/// Q2_K: 16 sub-blocks of 16, a 4-bit scale and a 4-bit minimum each; 2-bit quants.
fn q2_k(b: &[u8], o: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16(b, 80), f16(b, 82));
    for (e, out) in o.iter_mut().enumerate().take(256) {
        let (h, s, j) = (e / 128, (e % 128) / 32, e % 32);
        let q = ((qs[h * 32 + j] >> (2 * s)) & 3) as f32;
        let sc = scales[e / 16];
        let dl = d * (sc & 0x0f) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *out = dl * q - ml;
    }
}

/// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales; 2 low bits and a high bit (set
/// means no offset of -4).
fn q3_k(b: &[u8], o: &mut [f32]) {
    let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16(b, 108);
    let mut dl = [0.0f32; 16];
    for (k, v) in dl.iter_mut().enumerate() {
        let lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0f;
        let hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        *v = d * (((lo | (hi << 4)) as i8 - 32) as f32);
    }
    for (e, out) in o.iter_mut().enumerate().take(256) {
        let (h, s, j) = (e / 128, (e % 128) / 32, e % 32);
        let ql = ((qs[h * 32 + j] >> (2 * s)) & 3) as i8;
        let qh = ((hmask[j] >> (e / 32)) & 1) ^ 1;
        *out = dl[e / 16] * (ql - ((qh << 2) as i8)) as f32;
    }
}

/// Q4_K (`high` = None) and Q5_K (`high` = its `qh` and `qs`): 8 sub-blocks of 32 with
/// 6-bit scales and minimums; `head` holds `d`, `dmin` and the 12 scale bytes.
fn q45_k(head: &[u8], high: Option<(&[u8], &[u8])>, o: &mut [f32]) {
    let (d, dmin) = (f16(head, 0), f16(head, 2));
    let (sc, mn) = k_scale_min(&head[4..16]);
    let (qh, qs) = match high {
        Some((qh, qs)) => (Some(qh), qs),
        None => (None, &head[16..144]),
    };
    for k in 0..8 {
        let dl = d * sc[k] as f32;
        let ml = dmin * mn[k] as f32;
        let (c, nib) = (k / 2, k % 2);
        for j in 0..32 {
            let mut q = (qs[c * 32 + j] >> (4 * nib)) & 0x0f;
            if let Some(qh) = qh {
                q |= ((qh[j] >> k) & 1) << 4;
            }
            o[k * 32 + j] = dl * q as f32 - ml;
        }
    }
}

/// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; 4 low bits and 2 high bits.
fn q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16(b, 208);
    for (e, out) in o.iter_mut().enumerate().take(256) {
        let (h, r) = (e / 128, e % 128);
        let lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
        let hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
        let q = (lo | (hi << 4)) as i8 - 32;
        let dl = d * (scales[e / 16] as i8) as f32;
        *out = dl * q as f32;
    }
}

/// `d * (0.5 + s) * 0.25` (IQ2 types) or `* 0.5` (IQ3_XXS), rounded as gguf-py rounds.
#[inline(always)]
fn half_step_scale(d: f32, s: u32, step: f32) -> f32 {
    d * (0.5 + s as f32) * step
}

/// IQ2_XXS: 8 groups of 32, each a u32 of four grid indices and a u32 of four 7-bit sign
/// patterns and a 4-bit scale.
fn iq2_xxs(b: &[u8], o: &mut [f32]) {
    let d = f16(b, 0);
    for g in 0..8 {
        let aux1 = u32_at(b, 2 + 8 * g + 4);
        let db = half_step_scale(d, aux1 >> 28, 0.25);
        for k in 0..4 {
            let grid = &IQ2XXS_GRID[b[2 + 8 * g + k] as usize];
            let signs = KSIGNS[((aux1 >> (7 * k)) & 127) as usize];
            for j in 0..8 {
                o[g * 32 + k * 8 + j] = db * grid[j] as f32 * sign(signs, j);
            }
        }
    }
}

/// IQ2_XS: 32 u16s of a 9-bit grid index and a 7-bit sign pattern; 16 4-bit scales.
fn iq2_xs(b: &[u8], o: &mut [f32]) {
    let d = f16(b, 0);
    let scales = &b[66..74];
    for l in 0..32 {
        let q = u16_at(b, 2 + 2 * l);
        let s = (scales[l / 4] >> (4 * ((l / 2) % 2))) & 0x0f;
        let db = half_step_scale(d, s as u32, 0.25);
        let grid = &IQ2XS_GRID[(q & 511) as usize];
        let signs = KSIGNS[(q >> 9) as usize];
        for j in 0..8 {
            o[l * 8 + j] = db * grid[j] as f32 * sign(signs, j);
        }
    }
}

/// IQ2_S: 32 10-bit grid indices (low bytes, then 2 high bits each in `qh`), explicit sign
/// bytes, 16 4-bit scales.
fn iq2_s(b: &[u8], o: &mut [f32]) {
    let d = f16(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for l in 0..32 {
        let s = (scales[l / 4] >> (4 * ((l / 2) % 2))) & 0x0f;
        let db = half_step_scale(d, s as u32, 0.25);
        let hi = ((qh[l / 4] >> (2 * (l % 4))) & 3) as usize;
        let grid = &IQ2S_GRID[qs[l] as usize | (hi << 8)];
        for j in 0..8 {
            o[l * 8 + j] = db * grid[j] as f32 * sign(signs[l], j);
        }
    }
}

/// IQ3_XXS: 64 grid indices of 4 values; 8 u32s of four 7-bit sign patterns and a scale.
fn iq3_xxs(b: &[u8], o: &mut [f32]) {
    let d = f16(b, 0);
    let qs = &b[2..66];
    for g in 0..8 {
        let aux = u32_at(b, 66 + 4 * g);
        let db = half_step_scale(d, aux >> 28, 0.5);
        for k in 0..4 {
            let signs = KSIGNS[((aux >> (7 * k)) & 127) as usize];
            for j in 0..8 {
                let e = g * 32 + k * 8 + j;
                let v = IQ3XXS_GRID[qs[e / 4] as usize][e % 4];
                o[e] = db * v as f32 * sign(signs, j);
            }
        }
    }
}

/// IQ3_S: 64 9-bit grid indices of 4 values, explicit sign bits, 8 4-bit odd scales.
fn iq3_s(b: &[u8], o: &mut [f32]) {
    let d = f16(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for (e, out) in o.iter_mut().enumerate().take(256) {
        let k = e / 32;
        let s = (scales[k / 2] >> (4 * (k % 2))) & 0x0f;
        let db = d * (1 + 2 * s) as f32;
        let l = e / 4;
        let hi = ((qh[l / 8] >> (l % 8)) & 1) as usize;
        let v = IQ3S_GRID[qs[l] as usize | (hi << 8)][e % 4];
        *out = db * v as f32 * sign(signs[e / 8], e % 8);
    }
}

/// IQ1_S: 8 groups of 32, each a u16 of four 3-bit index extensions, a 3-bit scale and the
/// sign of the ±1/8 offset.
fn iq1_s(b: &[u8], o: &mut [f32]) {
    let d = f16(b, 0);
    let qs = &b[2..34];
    for g in 0..8 {
        let h = u16_at(b, 34 + 2 * g);
        let dl = d * (2 * ((h >> 12) & 7) + 1) as f32;
        let delta = if h & 0x8000 == 0 {
            IQ1_DELTA
        } else {
            -IQ1_DELTA
        };
        for k in 0..4 {
            let idx = qs[4 * g + k] as usize | ((((h >> (3 * k)) & 7) as usize) << 8);
            for j in 0..8 {
                o[g * 32 + k * 8 + j] = dl * (IQ1S_GRID[idx][j] as f32 + delta);
            }
        }
    }
}

/// IQ1_M: 32 grid indices with a 3-bit extension and an offset sign per nibble of `qh`;
/// 16 3-bit scales and the f16 block scale spread over the top nibbles of four u16s.
fn iq1_m(b: &[u8], o: &mut [f32]) {
    let (qs, qh) = (&b[..32], &b[32..48]);
    let s = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let bits =
        ((s[0] & 0xf000) >> 12) | ((s[1] & 0xf000) >> 8) | ((s[2] & 0xf000) >> 4) | (s[3] & 0xf000);
    let d = half::f16::from_bits(bits).to_f32();
    for l in 0..32 {
        let sc = (s[l / 8] >> (3 * ((l / 2) % 4))) & 7;
        let dl = d * (2 * sc + 1) as f32;
        let v = qh[l / 2] >> (4 * (l % 2));
        let idx = qs[l] as usize | (((v & 7) as usize) << 8);
        let delta = if v & 8 == 0 { IQ1_DELTA } else { -IQ1_DELTA };
        for j in 0..8 {
            o[l * 8 + j] = dl * (IQ1S_GRID[idx][j] as f32 + delta);
        }
    }
}

/// IQ4_XS: 8 sub-blocks of 32 with 6-bit signed scales (4 low bits, 2 high bits in a u16);
/// IQ4_NL's values.
fn iq4_xs(b: &[u8], o: &mut [f32]) {
    let d = f16(b, 0);
    let sh = u16_at(b, 2);
    let (sl, qs) = (&b[4..8], &b[8..136]);
    for k in 0..8 {
        let lo = (sl[k / 2] >> (4 * (k % 2))) & 0x0f;
        let hi = ((sh >> (2 * k)) as u8) & 3;
        let dl = d * (((lo | (hi << 4)) as i8 - 32) as f32);
        for s in 0..2 {
            for i in 0..16 {
                let q = (qs[k * 16 + i] >> (4 * s)) & 0x0f;
                o[k * 32 + s * 16 + i] = dl * IQ4_VALUES[q as usize] as f32;
            }
        }
    }
}
