//! Fused dot products of GGUF block rows: each block decoded in registers, 16 elements at
//! a time, and multiplied into the accumulators at once (no f32 row staged in memory).
//!
//! The reduction order is [`crate::dot`]'s, unchanged: element `i` of the row goes into
//! lane `i % 16` with one fused multiply-add, in increasing `i`, then the fixed halving
//! tree. Element `i`'s value is computed with the operations of
//! [`coli_core::gguf::quants`] (gguf-py's definition) in their order (Q4_K's
//! `dl * q - ml` a multiplication then a subtraction, never fused), so the result equals
//! [`crate::dot::dot_scalar`] bit for bit: the reference is the f32 chain over the row as
//! [`coli_core::gguf::dequantize`] decodes it. A block is 32 or 256 elements, a multiple
//! of 16, so a 16-element chunk always fills lanes 0..16 in order.
//!
//! Every block type is fused: the legacy types (Q4_0..Q8_0), the K-quants (Q2_K..Q6_K),
//! the non-linear IQ4_NL/IQ4_XS and MXFP4 (a byte shuffle as the table lookup), and the
//! grid types IQ1_S..IQ3_S (each 4- or 8-value grid entry loaded from its table and
//! widened in a register, the signs a ±1.0 vector from their bits). On AVX-512 machines
//! Q8_0, Q4_0, Q4_K and Q6_K (the bulk of Q4_K_M and Q8_0 files) decode 16 elements into
//! one register (`ggml_dot/x86_512.rs`), the other types take the AVX2 kernel; the scalar
//! ISA takes the dequantizing path, which is the reference. For one token, [`dot_rows`]
//! takes four rows at once (four independent chains, each row's order unchanged).

use coli_core::gguf::GgmlType;

use crate::cpu::Isa;

/// Whether rows of `ty` have a fused kernel: every block type (not F32, F16, BF16).
pub fn fused(ty: GgmlType) -> bool {
    ty.is_quantized()
}

/// `row · xs[t]` for each of `T` tokens, on `isa`; `None` when `ty` or `isa` has no fused
/// kernel (the caller then dequantizes).
///
/// # Panics
/// If the row is not whole blocks of `ty` for the activations' length.
pub fn dot_tokens<const T: usize>(
    isa: Isa,
    ty: GgmlType,
    row: &[u8],
    xs: [&[f32]; T],
) -> Option<[f32; T]> {
    let k = xs.first().map_or(0, |x| x.len());
    for x in xs {
        assert_eq!(x.len(), k, "ggml dot: activations of different lengths");
    }
    assert_eq!(
        row.len(),
        ty.row_bytes(k),
        "ggml dot: row bytes do not match"
    );
    assert!(k.is_multiple_of(ty.block().0), "ggml dot: not whole blocks");
    match kernel(isa, ty)? {
        // SAFETY: the kernel's ISA is present (`kernel` checked); the row holds k / bs
        // whole blocks and every x has k elements (checked above).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => Some(unsafe { x86_512::dot_avx512(ty, row, xs) }),
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => Some(unsafe { x86::dot_avx2(ty, row, xs) }),
    }
}

/// Which decoder runs `ty` on `isa`: AVX-512 where it has one and the CPU has AVX-512,
/// else AVX2 where the CPU has it; `None` for unfused types and the scalar ISA.
fn kernel(isa: Isa, ty: GgmlType) -> Option<Kernel> {
    if !fused(ty) {
        return None;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if crate::cpu::supports(Isa::Avx512) && x86_512::has(ty) => {
            Some(Kernel::Avx512)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if crate::cpu::supports(Isa::Avx2) => Some(Kernel::Avx2),
        _ => None,
    }
}

/// A decoder [`kernel`] picked (its ISA present).
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// `rows[r] · x` for `R` rows of `ty` and one token, on `isa`: each result equals
/// [`dot_tokens`]'s for that row bit for bit (the rows' blocks are decoded in turn, `R`
/// independent accumulator chains, each in the single row's order; one row's chain is
/// bound by the multiply-add latency). `next`, the bytes the caller reads after these
/// rows, is prefetched into cache meanwhile (a hint: rows are short streams the hardware
/// prefetcher picks up late; it never changes a result). `None` when `ty` or `isa` has
/// no fused kernel.
///
/// # Panics
/// If a row is not whole blocks of `ty` for `x`'s length.
pub fn dot_rows<const R: usize>(
    isa: Isa,
    ty: GgmlType,
    rows: [&[u8]; R],
    x: &[f32],
    next: &[u8],
) -> Option<[f32; R]> {
    let k = x.len();
    for row in rows {
        assert_eq!(
            row.len(),
            ty.row_bytes(k),
            "ggml dot: row bytes do not match"
        );
    }
    assert!(k.is_multiple_of(ty.block().0), "ggml dot: not whole blocks");
    match kernel(isa, ty)? {
        // SAFETY: the kernel's ISA is present (`kernel` checked); every row holds k / bs
        // whole blocks for x's k elements (checked above).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => Some(unsafe { x86_512::dot_rows_avx512(ty, rows, x, next) }),
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => Some(unsafe { x86::dot_rows_avx2(ty, rows, x, next) }),
    }
}

/// `row`'s values (whole blocks of `ty`) into `out`, decoded as [`dot_tokens`] decodes
/// them: the values [`coli_core::gguf::dequantize`] gives, bit for bit. `false` (nothing
/// written) when `ty` or `isa` has no such kernel.
///
/// # Panics
/// If `out` does not hold the row's elements.
pub fn dequant_row(isa: Isa, ty: GgmlType, row: &[u8], out: &mut [f32]) -> bool {
    let (bs, bb) = ty.block();
    assert_eq!(
        row.len() / bb * bs,
        out.len(),
        "ggml dequant: row and output differ"
    );
    assert!(
        row.len().is_multiple_of(bb),
        "ggml dequant: not whole blocks"
    );
    let Some(kernel) = kernel(isa, ty) else {
        return false;
    };
    match kernel {
        // SAFETY: the kernel's ISA is present (`kernel` checked); `out` holds the row's
        // elements.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { x86_512::dequant_avx512(ty, row, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::dequant_avx2(ty, row, out) },
    }
    true
}

/// Prefetches the cache lines of `next[start..start + len]` (clipped to `next`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch(next: &[u8], start: usize, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let end = (start + len).min(next.len());
    let mut off = start;
    while off < end {
        // SAFETY: off < next.len(); a prefetch never faults and changes no value.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(next.as_ptr().add(off).cast()) };
        off += 64;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_512;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu;
    use proptest::prelude::*;

    fn rows_of(ty: GgmlType, blocks: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        (0..blocks)
            .flat_map(|_| coli_core::fuzzing::random_block(ty, &mut next))
            .collect()
    }

    /// The 20 block types.
    fn quantized() -> Vec<GgmlType> {
        let all: Vec<GgmlType> = GgmlType::ALL
            .into_iter()
            .filter(|t| t.is_quantized())
            .collect();
        assert_eq!(all.len(), 20);
        all
    }

    /// Blocks from `oracle/gguf_quants.py` (random blocks and, where gguf-py quantizes the
    /// type, its quantizer's output) with gguf-py's values: the fused kernels decode them
    /// to those bits, and their dot equals the reference chain over those values.
    #[test]
    fn fused_kernels_decode_gguf_pys_blocks() {
        for ty in quantized() {
            assert!(fused(ty), "{ty:?}");
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/gguf_quants")
                .join(format!("{}.bin", ty.name()));
            let data = std::fs::read(&path).unwrap();
            let n = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
            let (bs, bb) = ty.block();
            let row = &data[4..4 + n * bb];
            let want: Vec<u32> = data[4 + n * bb..]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(want.len(), n * bs);
            let x: Vec<f32> = (0..n * bs)
                .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                .collect();
            let chain = crate::dot::dot_scalar(crate::dot::WFormat::F32, &data[4 + n * bb..], &x);
            let mut kernels = 0;
            for isa in cpu::available() {
                let mut got = vec![f32::NAN; n * bs];
                if dequant_row(isa, ty, row, &mut got) {
                    let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    assert!(
                        got == want,
                        "{ty:?} {isa:?}: decoded values differ from gguf-py's"
                    );
                    kernels += 1;
                }
                if let Some([d]) = dot_tokens(isa, ty, row, [&x]) {
                    assert_eq!(d.to_bits(), chain.to_bits(), "{ty:?} {isa:?}");
                }
            }
            #[cfg(target_arch = "x86_64")]
            assert!(!cpu::supports(Isa::Avx2) || kernels > 0, "{ty:?}");
            let _ = kernels;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]
        /// Every fused type, ISA and token count: the bits of the reference chain over the
        /// row as gguf-py's definition decodes it; and the decoded row, gguf-py's values.
        #[test]
        fn fused_equals_the_dequantized_chain(ty_i in 0usize..20, blocks in 1usize..5, seed in any::<u64>()) {
            let ty = quantized()[ty_i];
            let k = blocks * ty.block().0;
            let row = rows_of(ty, blocks, seed);
            let x: Vec<f32> = (0..3 * k).map(|i| (((i as u64 * 2654435761) ^ seed) % 2000) as f32 / 997.0 - 1.0).collect();
            let (x0, x1, x2) = (&x[..k], &x[k..2 * k], &x[2 * k..]);
            let want = [x0, x1, x2].map(|x| crate::dot::dot_scalar(crate::dot::WFormat::Ggml(ty), &row, x).to_bits());
            for isa in cpu::available() {
                if let Some(got) = dot_tokens(isa, ty, &row, [x0]) {
                    prop_assert_eq!(got[0].to_bits(), want[0], "{:?} {:?}", ty, isa);
                }
                if let Some(got) = dot_tokens(isa, ty, &row, [x0, x1, x2]) {
                    prop_assert_eq!(got.map(f32::to_bits), want, "{:?} {:?}", ty, isa);
                }
            }
            // Four rows at once: each row's chain, the same bits.
            let rows: Vec<Vec<u8>> = (0..4).map(|r| if r == 0 { row.clone() } else { rows_of(ty, blocks, seed ^ r) }).collect();
            let want4: Vec<u32> = rows.iter().map(|r| crate::dot::dot_scalar(crate::dot::WFormat::Ggml(ty), r, x1).to_bits()).collect();
            for isa in cpu::available() {
                let four = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
                if let Some(got) = dot_rows(isa, ty, four, x1, &rows[1]) {
                    prop_assert_eq!(got.map(f32::to_bits).to_vec(), want4.clone(), "{:?} {:?}", ty, isa);
                }
            }
            let mut want_values = vec![0.0f32; k];
            coli_core::gguf::dequantize(ty, &row, &mut want_values).unwrap();
            for isa in cpu::available() {
                let mut got = vec![f32::NAN; k];
                if dequant_row(isa, ty, &row, &mut got) {
                    prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want_values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{:?} {:?}", ty, isa);
                }
            }
            // Some ISA of an x86 machine has the kernel.
            #[cfg(target_arch = "x86_64")]
            prop_assert!(!cpu::supports(Isa::Avx2) || dot_tokens(Isa::Avx2, ty, &row, [x0]).is_some());
        }
    }
}
