//! Prefill through quantized rows (GGUF blocks, scaled int8/int4 and fp8): a panel of rows
//! dequantized to f32 once, then every token through it in blocks of the inner dimension.
//!
//! The f32 block kernels run each output's whole chain over `k` in one call, so a row
//! block of four needs the tokens' activations from wherever they are: for DeepSeek-V3's
//! 7168 columns, 128 tokens are 3.6 MiB, more than L2, and the kernel waited on L3 (a
//! third of the FMA peak). Here the chain of each output stops every [`KC`] elements:
//! its 16 lane accumulators go to memory and come back for the next block, unchanged
//! (a store and a load are exact). Within a block the panel's rows and a group of tokens
//! are all in L1. Each lane still receives its elements in increasing order, one fused
//! multiply-add each, from 0.0, and the lanes are reduced by [`crate::dot::reduce_lanes`]:
//! the result is [`crate::dot::dot_scalar`]'s for the dequantized row, bit for bit.

use super::{MatRef, OutPtr};
use crate::cpu::Isa;
use crate::dot::{reduce_lanes, LANES};
use std::cell::RefCell;
use std::thread::LocalKey;

/// Inner-dimension block: 512 f32 (2 KiB) per row or token, so that a group's
/// [`TOKEN_GROUP`] token slices (24 KiB) and the row quad passing over them (8 KiB) are in
/// L1 together.
pub(super) const KC: usize = 512;

/// Tokens whose slices stay in L1 while every row quad of the panel passes over them.
const TOKEN_GROUP: usize = 12;

/// One cache line of f32s: the buffers below are vectors of these, so that every 16-float
/// chunk the kernels load starts a cache line (a 64-byte load across two lines costs two:
/// measured at 16-byte alignment, this loop ran at a third of its aligned speed).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; LANES]);

thread_local! {
    /// The panel's lane accumulators, `[row][token][lane]`; grows once per thread.
    static ACC: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    /// The panel's dequantized rows in k-block-major order, and one row being dequantized.
    static WPACK: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    /// The activations of up to [`TOKEN_CHUNK`] tokens in k-block-major order.
    static XPACK: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffer `cell`, at least `len` f32s (a multiple of 16), from a
/// cache-line boundary.
fn with_lines<T>(
    cell: &'static LocalKey<RefCell<Vec<Line>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> T,
) -> T {
    debug_assert!(len.is_multiple_of(LANES));
    cell.with(|buf| {
        let mut buf = buf.borrow_mut();
        let lines = len / LANES;
        if buf.len() < lines {
            buf.resize(lines, Line([0.0; LANES]));
        }
        let lines = &mut buf[..lines];
        // SAFETY: `Line` is 16 f32s with no padding (repr(C), size 64); the slice covers
        // exactly the borrowed lines, for the borrow's lifetime.
        let floats =
            unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<f32>(), len) };
        f(floats)
    })
}

/// Whether [`rows_panel`] takes this product: a SIMD ISA, enough tokens to share each
/// dequantized row (below that, the per-row path streams less), and whole 16-lane chunks.
pub(super) fn applies(isa: Isa, k: usize, n_tok: usize) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512) && n_tok >= 6 && k.is_multiple_of(LANES) && k > 0
}

/// Tokens packed at once: their activations in k-blocks (`n * k` floats per thread).
const TOKEN_CHUNK: usize = 128;

/// Rows `r0..r1` of `out[t * m.rows + r] = m.row(r) · xs[t]`, `m` dequantized a panel of
/// rows at a time (see the module). Callers check [`applies`].
pub(super) fn rows_panel(
    isa: Isa,
    m: &MatRef,
    xs: &[f32],
    n_tok: usize,
    r0: usize,
    r1: usize,
    out: OutPtr,
) {
    let k = m.cols;
    debug_assert!(applies(isa, k, n_tok));
    // Rows per panel: each pass over the packed activations (from L3 when they exceed L2)
    // serves this many rows, and the accumulators of the panel (rows x tokens x 64 B) stay
    // in about 512 KiB of L2: up to 64 rows, a multiple of four.
    let nt_max = n_tok.min(TOKEN_CHUNK);
    let panel = (512 * 1024 / (nt_max * LANES * 4)).clamp(4, 64) / 4 * 4;
    let mut c0 = 0;
    while c0 < n_tok {
        let nt = (n_tok - c0).min(TOKEN_CHUNK);
        with_lines(&XPACK, nt * k, |xp| {
            // k-block-major: block `kb`'s slices of the chunk's tokens one after another
            // (`len` apart), so that a group's slices are contiguous and do not contend for
            // the same L1 sets, as rows `k` floats apart do when `4k` is a multiple of 4 KiB.
            for_k_blocks(k, |kb, len| {
                for t in 0..nt {
                    let src = &xs[(c0 + t) * k + kb..][..len];
                    xp[kb * nt + t * len..][..len].copy_from_slice(src);
                }
            });
            panels(isa, m, xp, c0, nt, r0, r1, panel, out);
        });
        c0 += nt;
    }
}

/// Calls `f(kb, len)` for the k-blocks of `k`: `kb` its first element, `len` at most [`KC`].
fn for_k_blocks(k: usize, mut f: impl FnMut(usize, usize)) {
    let mut kb = 0;
    while kb < k {
        let len = KC.min(k - kb);
        f(kb, len);
        kb += len;
    }
}

/// Rows `r0..r1` through the packed activations `xp` of tokens `c0..c0 + nt`, `panel`
/// rows at a time.
#[allow(clippy::too_many_arguments)]
fn panels(
    isa: Isa,
    m: &MatRef,
    xp: &[f32],
    c0: usize,
    nt: usize,
    r0: usize,
    r1: usize,
    panel: usize,
    out: OutPtr,
) {
    let k = m.cols;
    with_lines(&WPACK, (panel + 1) * k, |buf| {
        let (wp, row) = buf.split_at_mut(panel * k);
        with_lines(&ACC, panel * nt * LANES, |acc| {
            let mut p0 = r0;
            while p0 < r1 {
                let np = (r1 - p0).min(panel);
                // The panel in k-block-major order too: block `kb`'s slices of its rows.
                for j in 0..np {
                    dequant_blocked(m, p0 + j, np, j, wp, row);
                }
                let acc = &mut acc[..np * nt * LANES];
                acc.fill(0.0);
                panel_chains(isa, &wp[..np * k], np, k, xp, nt, acc);
                for (j, lanes) in acc.chunks_exact(nt * LANES).enumerate() {
                    for (t, l) in lanes.chunks_exact(LANES).enumerate() {
                        let l: [f32; LANES] = l.try_into().expect("16 lanes");
                        // SAFETY: c0 + t < n_tok and p0 + j < r1 <= m.rows: inside `out`;
                        // the task owns rows r0..r1.
                        unsafe { *out.0.add((c0 + t) * m.rows + p0 + j) = reduce_lanes(l) };
                    }
                }
                p0 += np;
            }
        })
    })
}

/// Row `r` of `m` dequantized into slot `j` of a k-block-major panel of `np` rows: GGUF
/// blocks straight into each k-block's slice (a k-block is whole blocks: [`KC`] and `k`
/// are multiples of 256 and 32), scaled rows through `row` (the scales are per row).
fn dequant_blocked(m: &MatRef, r: usize, np: usize, j: usize, wp: &mut [f32], row: &mut [f32]) {
    let k = m.cols;
    if let (crate::dot::WFormat::Ggml(ty), None) = (m.fmt, m.scales) {
        let (elems, bytes) = ty.block();
        if KC.is_multiple_of(elems) {
            let src = m.row(r);
            for_k_blocks(k, |kb, len| {
                let b = &src[kb / elems * bytes..(kb + len) / elems * bytes];
                m.fmt.load_row(b, &mut wp[kb * np + j * len..][..len]);
            });
            return;
        }
    }
    m.dequant_row(r, row);
    for_k_blocks(k, |kb, len| {
        wp[kb * np + j * len..][..len].copy_from_slice(&row[kb..kb + len]);
    });
}

/// Runs every (row, token) chain of the panel over all of `k`, a k-block at a time:
/// `w` holds the `np` rows and `xp` the `n_tok` tokens in k-block-major order (block
/// `kb`'s slices of `len` elements at `kb * np` and `kb * n_tok`); the accumulators are
/// `acc[(row * n_tok + token) * 16..]`.
fn panel_chains(
    isa: Isa,
    w: &[f32],
    np: usize,
    k: usize,
    xp: &[f32],
    n_tok: usize,
    acc: &mut [f32],
) {
    assert_eq!(w.len(), np * k);
    assert_eq!(xp.len(), n_tok * k);
    assert_eq!(acc.len(), np * n_tok * LANES);
    assert!(k.is_multiple_of(LANES));
    let (rb, tb) = match isa {
        Isa::Avx512 => (4, 6),
        _ => (2, 3),
    };
    let rs = n_tok * LANES;
    for_k_blocks(k, |kb, len| {
        let (wk, xk) = (&w[kb * np..][..np * len], &xp[kb * n_tok..][..n_tok * len]);
        let mut g0 = 0;
        while g0 < n_tok {
            let g1 = (g0 + TOKEN_GROUP).min(n_tok);
            let mut r = 0;
            while r < np {
                let nr = if r + rb <= np { rb } else { 1 };
                let mut t = g0;
                while t < g1 {
                    let nt = tb.min(g1 - t);
                    let wp = wk[r * len..].as_ptr();
                    let xq = xk[t * len..].as_ptr();
                    let ap = acc[r * rs + t * LANES..].as_mut_ptr();
                    // SAFETY: rows r..r + nr <= np and tokens t..t + nt <= n_tok, so every
                    // pointer plus its offsets (`len` per row or token, `len` elements
                    // each; `rs` per accumulator row, 16 per token) lies inside `wk`, `xk`
                    // and `acc` (lengths asserted above); `len` is a multiple of 16 (`k`
                    // and KC are); the ISA is available (`applies`' callers take it from
                    // `cpu::best`/`supports`).
                    unsafe { block(isa, nr, nt, wp, xq, ap, len, rs, len) };
                    t += nt;
                }
                r += nr;
            }
            g0 = g1;
        }
    });
}

/// One microkernel call: `nr` rows x `nt` tokens, `len` elements.
///
/// # Safety
/// As [`x86::block_avx512`]; `isa` available on this CPU.
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn block(
    isa: Isa,
    nr: usize,
    nt: usize,
    w: *const f32,
    x: *const f32,
    acc: *mut f32,
    k: usize,
    rs: usize,
    len: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use x86::{block_avx2 as b2, block_avx512 as b5};
        match (isa, nr, nt) {
            (Isa::Avx512, 4, 6) => b5::<4, 6>(w, x, acc, k, rs, len),
            (Isa::Avx512, 4, 5) => b5::<4, 5>(w, x, acc, k, rs, len),
            (Isa::Avx512, 4, 4) => b5::<4, 4>(w, x, acc, k, rs, len),
            (Isa::Avx512, 4, 3) => b5::<4, 3>(w, x, acc, k, rs, len),
            (Isa::Avx512, 4, 2) => b5::<4, 2>(w, x, acc, k, rs, len),
            (Isa::Avx512, 4, _) => b5::<4, 1>(w, x, acc, k, rs, len),
            (Isa::Avx512, _, 6) => b5::<1, 6>(w, x, acc, k, rs, len),
            (Isa::Avx512, _, 5) => b5::<1, 5>(w, x, acc, k, rs, len),
            (Isa::Avx512, _, 4) => b5::<1, 4>(w, x, acc, k, rs, len),
            (Isa::Avx512, _, 3) => b5::<1, 3>(w, x, acc, k, rs, len),
            (Isa::Avx512, _, 2) => b5::<1, 2>(w, x, acc, k, rs, len),
            (Isa::Avx512, _, _) => b5::<1, 1>(w, x, acc, k, rs, len),
            (_, 2, 3) => b2::<2, 3>(w, x, acc, k, rs, len),
            (_, 2, 2) => b2::<2, 2>(w, x, acc, k, rs, len),
            (_, 2, _) => b2::<2, 1>(w, x, acc, k, rs, len),
            (_, _, 3) => b2::<1, 3>(w, x, acc, k, rs, len),
            (_, _, 2) => b2::<1, 2>(w, x, acc, k, rs, len),
            (_, _, _) => b2::<1, 1>(w, x, acc, k, rs, len),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, nr, nt, w, x, acc, k, rs, len);
        unreachable!("the panel path needs x86_64 SIMD");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `R` rows (`w + r * k`) x `T` tokens (`x + t * k`; `k` is the stride) over `len` elements (a multiple of
    /// 16): lane `l` of output (r, t), at `acc + r * rs + t * 16 + l`, gets
    /// `fma(w[r][i], x[t][i], lane)` for each `i ≡ l (mod 16)` in increasing order.
    ///
    /// # Safety
    /// AVX-512F available; the `R` rows and `T` tokens hold `len` elements from their
    /// pointers, the `R x T` accumulators 16 each.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn block_avx512<const R: usize, const T: usize>(
        w: *const f32,
        x: *const f32,
        acc: *mut f32,
        k: usize,
        rs: usize,
        len: usize,
    ) {
        let mut a = [[_mm512_setzero_ps(); R]; T];
        for t in 0..T {
            for r in 0..R {
                a[t][r] = _mm512_loadu_ps(acc.add(r * rs + t * 16));
            }
        }
        let mut i = 0;
        while i < len {
            let mut wv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                wv[r] = _mm512_loadu_ps(w.add(r * k + i));
            }
            for t in 0..T {
                let xv = _mm512_loadu_ps(x.add(t * k + i));
                for r in 0..R {
                    a[t][r] = _mm512_fmadd_ps(wv[r], xv, a[t][r]);
                }
            }
            i += 16;
        }
        for t in 0..T {
            for r in 0..R {
                _mm512_storeu_ps(acc.add(r * rs + t * 16), a[t][r]);
            }
        }
    }

    /// [`block_avx512`] in two 8-lane halves (lanes 0..8, then 8..16 of each chunk), one
    /// half's weights live at a time: 2·R·T accumulators, R weights and one activation.
    ///
    /// # Safety
    /// AVX2 and FMA available; as [`block_avx512`].
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block_avx2<const R: usize, const T: usize>(
        w: *const f32,
        x: *const f32,
        acc: *mut f32,
        k: usize,
        rs: usize,
        len: usize,
    ) {
        let mut a = [[[_mm256_setzero_ps(); 2]; R]; T];
        for t in 0..T {
            for r in 0..R {
                for h in 0..2 {
                    a[t][r][h] = _mm256_loadu_ps(acc.add(r * rs + t * 16 + 8 * h));
                }
            }
        }
        let mut i = 0;
        while i < len {
            for h in 0..2 {
                let j = i + 8 * h;
                let mut wv = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    wv[r] = _mm256_loadu_ps(w.add(r * k + j));
                }
                for t in 0..T {
                    let xv = _mm256_loadu_ps(x.add(t * k + j));
                    for r in 0..R {
                        a[t][r][h] = _mm256_fmadd_ps(wv[r], xv, a[t][r][h]);
                    }
                }
            }
            i += 16;
        }
        for t in 0..T {
            for r in 0..R {
                for h in 0..2 {
                    _mm256_storeu_ps(acc.add(r * rs + t * 16 + 8 * h), a[t][r][h]);
                }
            }
        }
    }
}
