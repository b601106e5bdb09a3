//! The optional fast mode, never the default: int8 activations against int8 and int4
//! weights, multiplied in integers with AVX-512 VNNI (`vpdpbusd`), or on AVX2 with
//! `vpmaddubsw` and `vpmaddwd` (`fast/avx2.rs`), as llama.cpp's Q8_0 path does.
//!
//! **Not token-exact.** The activations are rounded to int8 (one scale per block of
//! [`act_block`] elements, `d = max|x| / 127`, `q = round(x / d)`, ties to even), so the
//! results differ from the exact engine and from `transformers`; `cargo xtask fast-int8` measures the
//! teacher-forced agreement on every oracle fixture. The mode is process-wide, switched
//! on once before a model runs ([`set_int8_activations`], `coli --fast-int8`), and only
//! [`crate::matmul::matmul`] / [`crate::matmul::matmul_many`] consult it.
//!
//! The arithmetic is still fixed, so the fast mode keeps every other invariant: the
//! vector kernel equals [`dot_rows_scalar`] bit for bit, and no thread count, batch size
//! or placement changes a result. Element `i` of a row sits in a *layout position*
//! (int8: `i`; int4: within each 64-element chunk the 32 even elements, then the 32 odd
//! ones, which is where the packed nibbles fall). Positions come in *groups* of
//! [`chunks_per_group`] 64-element chunks (int4: one chunk, whose two halves have
//! activation scales of their own; int8: the whole activation block of two or four chunks
//! where the row has a multiple of them, else one chunk as for int4).
//! Lane `l` of a group covers positions `4l..4l + 4` of each of its chunks and computes,
//! exactly in integers, `Σ stored·q` over them (int8 weights are read as `w + 128` and
//! int4 nibbles as `v + 8`, both unsigned, and the offset's product with the activations
//! is subtracted through a per-lane correction precomputed per token). The lane's sum
//! becomes an f32 once per group and is accumulated as `fma(sum, d_lane · scale,
//! acc[l])`, and the 16 accumulators are summed by the fixed halving tree
//! ([`crate::dot::reduce_lanes`]). Longer int8 groups are what makes the mode cheaper
//! than the exact kernels: one integer instruction per 64 weights, the float work once
//! per group.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::dot::{reduce_lanes, WFormat, LANES};
use crate::matmul::MatRef;

/// Activation elements sharing one int8 scale in front of int4 weights (as Q8_0's blocks).
pub const ACT_BLOCK: usize = 32;

/// Elements of one kernel step: one 64-byte vector of int8 weights.
const CHUNK: usize = 64;

static INT8_ACTIVATIONS: AtomicBool = AtomicBool::new(false);

/// Switches the fast mode on or off for the whole process. Set it before a model runs:
/// results computed under one setting are not comparable with the other's.
pub fn set_int8_activations(on: bool) {
    INT8_ACTIVATIONS.store(on, Ordering::Relaxed);
}

/// Whether the fast mode is on.
pub fn int8_activations() -> bool {
    INT8_ACTIVATIONS.load(Ordering::Relaxed)
}

/// Whether this CPU has a vector kernel for the fast mode: [`vnni_available`] or
/// [`avx2_available`]. Without one the fast mode still computes the same results, in
/// scalar code, slowly.
pub fn kernels_available() -> bool {
    vnni_available() || avx2_available()
}

/// Whether this CPU has the instructions of the AVX2 fast kernel (AVX2 and FMA).
pub fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has the instructions of the VNNI fast kernel (AVX-512 F, BW and VNNI).
pub fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Chunks of 64 positions per group for rows of `cols` elements of `fmt`: int4 one; int8
/// four, two or one, the most that divides the row.
pub fn chunks_per_group(fmt: WFormat, cols: usize) -> usize {
    match fmt {
        WFormat::I8 => [4, 2, 1]
            .into_iter()
            .find(|g| cols.is_multiple_of(g * CHUNK))
            .unwrap_or(1),
        _ => 1,
    }
}

/// Activation elements sharing one int8 scale in front of rows of `cols` elements of
/// `fmt`: a whole group for int8 rows of a multiple of 128 or 256 elements (llama.cpp's
/// Q8_K takes 256), else [`ACT_BLOCK`]. A group of one chunk keeps the two 32-element
/// blocks: on the oracle fixtures (rows of 64) one 64-element block moved the logits up
/// to 30 times further from the exact engine's (`cargo xtask fast-int8`).
pub fn act_block(fmt: WFormat, cols: usize) -> usize {
    match fmt {
        WFormat::I8 if chunks_per_group(fmt, cols) > 1 => chunks_per_group(fmt, cols) * CHUNK,
        _ => ACT_BLOCK,
    }
}

/// Whether the fast kernels take this matrix: int8 or int4 with block scales, whole
/// 64-element chunks per row, and each group inside one scale block.
pub fn takes(m: &MatRef) -> bool {
    let Some(s) = m.scales else {
        return false;
    };
    let group = chunks_per_group(m.fmt, m.cols) * CHUNK;
    matches!(m.fmt, WFormat::I8 | WFormat::I4)
        && m.cols > 0
        && m.cols.is_multiple_of(CHUNK)
        && (s.block_cols.is_multiple_of(group) || s.block_cols >= m.cols)
}

/// The element at layout position `p` (see the module documentation).
#[inline]
fn element_at(fmt: WFormat, p: usize) -> usize {
    match fmt {
        WFormat::I4 => {
            let (c, o) = (p / CHUNK * CHUNK, p % CHUNK);
            if o < CHUNK / 2 {
                c + 2 * o
            } else {
                c + 2 * (o - CHUNK / 2) + 1
            }
        }
        _ => p,
    }
}

/// The layout position of element `i` (the inverse of [`element_at`]).
#[inline]
fn position_of(fmt: WFormat, i: usize) -> usize {
    match fmt {
        WFormat::I4 => {
            let (c, o) = (i / CHUNK * CHUNK, i % CHUNK);
            c + o / 2 + (o % 2) * (CHUNK / 2)
        }
        _ => i,
    }
}

/// `v` rounded to the nearest integer, ties to even, for `|v| < 2^22`: adding and taking
/// away 1.5 · 2^23 leaves no fraction bits, and the addition rounds to nearest even. The
/// same value as `f32::round_ties_even` (a zero's sign aside), without the library call
/// that a target lacking SSE4.1's `roundps` makes of it (tested).
#[inline(always)]
fn round_ties_even_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// `v` cleared and refilled with `len` zeros, in the memory it has.
fn zeroed<T: Clone + Default>(v: &mut Vec<T>, len: usize) {
    v.clear();
    v.resize(len, T::default());
}

/// The unsigned offset the kernels read a stored weight with.
fn weight_offset(fmt: WFormat) -> i32 {
    if fmt == WFormat::I4 {
        8
    } else {
        128
    }
}

/// One token's activations, quantized for one weight format's layout.
#[derive(Clone, Debug)]
pub struct Int8Acts {
    fmt: WFormat,
    /// Chunks per group.
    group: usize,
    /// int8 values in layout order.
    q: Vec<i8>,
    /// Per group and lane: minus the weight offset times the sum of the lane's values.
    neg: Vec<i32>,
    /// Per group and lane: the scale of the activation block the lane's elements are in.
    d: Vec<f32>,
    /// Per activation block, its scale (scratch of `quantize_into`).
    block_d: Vec<f32>,
}

impl Default for Int8Acts {
    /// Empty buffers (for [`Int8Acts::quantize_into`]).
    fn default() -> Int8Acts {
        Int8Acts {
            fmt: WFormat::I8,
            group: 1,
            q: Vec::new(),
            neg: Vec::new(),
            d: Vec::new(),
            block_d: Vec::new(),
        }
    }
}

impl Int8Acts {
    /// Quantizes `x` for rows of `fmt` (int8 or int4): per [`act_block`] elements
    /// `d = max|x| / 127` and `q = round(x / d)` (ties to even, as the vector rounding
    /// instructions do), an all-zero block giving `d = 0`. `None` when `x` holds a
    /// non-finite value or its length is not a whole number of 64-element chunks: the
    /// exact kernels then run instead.
    pub fn quantize(fmt: WFormat, x: &[f32]) -> Option<Int8Acts> {
        let mut a = Int8Acts::default();
        a.quantize_into(fmt, x).then_some(a)
    }

    /// [`Int8Acts::quantize`] into these buffers, reusing their memory (the decode path
    /// allocates nothing once they have grown); `false`, leaving them unusable, where
    /// `quantize` gives `None`.
    pub fn quantize_into(&mut self, fmt: WFormat, x: &[f32]) -> bool {
        if !matches!(fmt, WFormat::I8 | WFormat::I4)
            || !x.len().is_multiple_of(CHUNK)
            || !x.iter().all(|v| v.is_finite())
        {
            return false;
        }
        let n = x.len();
        let block = act_block(fmt, n);
        let group = chunks_per_group(fmt, n);
        let lanes = n / CHUNK / group * LANES;
        self.fmt = fmt;
        self.group = group;
        zeroed(&mut self.q, n);
        zeroed(&mut self.block_d, n / block);
        for (b, (xs, d)) in x.chunks_exact(block).zip(&mut self.block_d).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 {
                continue;
            }
            *d = amax / 127.0;
            for (j, &v) in xs.iter().enumerate() {
                let q = round_ties_even_small(v / *d).clamp(-127.0, 127.0) as i8;
                self.q[position_of(fmt, b * block + j)] = q;
            }
        }
        let off = weight_offset(fmt);
        zeroed(&mut self.neg, lanes);
        // A group's lane l sums positions 4l..4l + 4 of each of the group's chunks.
        for (qg, ng) in self
            .q
            .chunks_exact(group * CHUNK)
            .zip(self.neg.chunks_exact_mut(LANES))
        {
            for chunk in qg.chunks_exact(CHUNK) {
                for (n, l) in ng.iter_mut().zip(chunk.chunks_exact(4)) {
                    *n -= off * (l[0] as i32 + l[1] as i32 + l[2] as i32 + l[3] as i32);
                }
            }
        }
        zeroed(&mut self.d, lanes);
        for (i, dl) in self.d.iter_mut().enumerate() {
            let (g, l) = (i / LANES, i % LANES);
            *dl = self.block_d[element_at(fmt, g * group * CHUNK + 4 * l) / block];
        }
        true
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

/// The stored weight at layout position `p`, as the unsigned value the kernels multiply.
#[inline]
fn stored_unsigned(fmt: WFormat, row: &[u8], p: usize) -> i32 {
    match fmt {
        WFormat::I4 => {
            let (c, o) = (p / CHUNK, p % CHUNK);
            let b = row[c * CHUNK / 2 + o % (CHUNK / 2)];
            (if o < CHUNK / 2 { b & 0x0F } else { b >> 4 }) as i32
        }
        _ => (row[p] ^ 0x80) as i32,
    }
}

/// The reference: the definition of the fast mode's dot product of `rows` (their
/// `scales`, one per `block_cols` columns) with quantized activations `a`.
pub fn dot_rows_scalar<const R: usize>(
    rows: [&[u8]; R],
    scales: [&[f32]; R],
    block_cols: usize,
    a: &Int8Acts,
) -> [f32; R] {
    std::array::from_fn(|r| {
        let mut acc = [0.0f32; LANES];
        let span = a.group * CHUNK;
        for g in 0..a.len() / span {
            let ws = scales[r][g * span / block_cols];
            for (l, acc) in acc.iter_mut().enumerate() {
                let mut sum = a.neg[g * LANES + l];
                for c in g * a.group..(g + 1) * a.group {
                    for p in c * CHUNK + 4 * l..c * CHUNK + 4 * l + 4 {
                        sum += stored_unsigned(a.fmt, rows[r], p) * a.q[p] as i32;
                    }
                }
                *acc = (sum as f32).mul_add(a.d[g * LANES + l] * ws, *acc);
            }
        }
        reduce_lanes(acc)
    })
}

/// [`dot_rows_scalar`] on the best code this CPU runs; `next` (the rows that follow) is
/// prefetched meanwhile.
pub fn dot_rows<const R: usize>(
    rows: [&[u8]; R],
    scales: [&[f32]; R],
    block_cols: usize,
    a: &Int8Acts,
    next: &[u8],
) -> [f32; R] {
    dot_block(rows, scales, block_cols, [a], next)[0]
}

/// [`dot_rows_scalar`] of `R` rows with each of `T` tokens' activations (all quantized for
/// the rows' format), on the best code this CPU runs; `next` is prefetched meanwhile.
pub fn dot_block<const R: usize, const T: usize>(
    rows: [&[u8]; R],
    scales: [&[f32]; R],
    block_cols: usize,
    acts: [&Int8Acts; T],
    next: &[u8],
) -> [[f32; R]; T] {
    for a in acts {
        check(&rows, &scales, block_cols, a);
        assert_eq!(
            (a.fmt, a.len(), a.group),
            (acts[0].fmt, acts[0].len(), acts[0].group),
            "one format, length and grouping"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if T > 0 && vnni_available() {
        // SAFETY: the CPU has AVX-512 F/BW/VNNI (checked); `check` validated the lengths
        // the loads rely on.
        return unsafe { x86::dot_block_vnni(rows, scales, block_cols, acts, next) };
    }
    #[cfg(target_arch = "x86_64")]
    if T > 0 && avx2_available() {
        // One token at a time (`avx2::dot_rows_avx2`); the rows that follow are prefetched
        // during the first token's pass.
        return std::array::from_fn(|t| {
            let nx = if t == 0 { next } else { &[] };
            // SAFETY: the CPU has AVX2 and FMA (checked); `check` validated the lengths.
            unsafe { avx2::dot_rows_avx2(rows, scales, block_cols, acts[t], nx) }
        });
    }
    let _ = next;
    acts.map(|a| dot_rows_scalar(rows, scales, block_cols, a))
}

fn check<const R: usize>(rows: &[&[u8]; R], scales: &[&[f32]; R], block_cols: usize, a: &Int8Acts) {
    let k = a.len();
    assert!(
        block_cols > 0 && (block_cols.is_multiple_of(a.group * CHUNK) || block_cols >= k),
        "each group of {} columns must lie in one scale block of {block_cols}",
        a.group * CHUNK
    );
    for r in 0..R {
        assert_eq!(rows[r].len(), a.fmt.row_bytes(k), "row bytes");
        assert!(
            scales[r].len() >= k.div_ceil(block_cols),
            "one scale per block"
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Int8Acts, CHUNK};
    use crate::dot::x86::{prefetch_next, reduce16_avx512};
    use crate::dot::{WFormat, LANES};
    use std::arch::x86_64::*;

    /// The vector form of [`super::dot_rows_scalar`] for `R` rows and `T` tokens: each
    /// chunk of weights is loaded once for all tokens, each token's activations once for
    /// all rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    pub(super) unsafe fn dot_block_vnni<const R: usize, const T: usize>(
        rows: [&[u8]; R],
        scales: [&[f32]; R],
        block_cols: usize,
        acts: [&Int8Acts; T],
        next: &[u8],
    ) -> [[f32; R]; T] {
        let k = acts[0].len();
        let fmt = acts[0].fmt;
        let chunk_bytes = fmt.row_bytes(CHUNK);
        // Cache lines of `next` per chunk step, counted as `prefetch_next` does per LANES.
        let lines = (R * chunk_bytes).div_ceil(64);
        let mut acc = [[_mm512_setzero_ps(); R]; T];
        let flip = _mm512_set1_epi8(0x80u8 as i8);
        let low = _mm512_set1_epi8(0x0F);
        // The low 32 bytes keep each byte's low nibble, the high 32 its high nibble.
        let shifts = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
        // The activations' pointers, out of the structs (kept in registers or one load).
        let (mut qp, mut np, mut dp) = (
            [std::ptr::null(); T],
            [std::ptr::null(); T],
            [std::ptr::null(); T],
        );
        for t in 0..T {
            (qp[t], np[t], dp[t]) = (acts[t].q.as_ptr(), acts[t].neg.as_ptr(), acts[t].d.as_ptr());
        }
        let (group, groups) = (acts[0].group, k / CHUNK / acts[0].group);
        // One group of every row and token; `$load` gives a row's 64 unsigned weights. Each
        // group lies in one scale block (`super::takes`).
        macro_rules! steps {
            ($load:expr) => {
                for g in 0..groups {
                    let mut ws = [_mm512_setzero_ps(); R];
                    for r in 0..R {
                        ws[r] = _mm512_set1_ps(scales[r][g * group * CHUNK / block_cols]);
                    }
                    let mut sum = [[_mm512_setzero_si512(); R]; T];
                    for t in 0..T {
                        let neg = _mm512_loadu_si512(np[t].add(g * LANES).cast());
                        for r in 0..R {
                            sum[t][r] = neg;
                        }
                    }
                    for c in g * group..(g + 1) * group {
                        prefetch_next(next, c * LANES, lines);
                        // Plain loops, not `array::from_fn`: its closure would not be
                        // inlined into this function's instruction set.
                        let mut w = [_mm512_setzero_si512(); R];
                        for r in 0..R {
                            w[r] = $load(rows[r].as_ptr().add(c * chunk_bytes));
                        }
                        for t in 0..T {
                            let q = _mm512_loadu_si512(qp[t].add(c * CHUNK).cast());
                            for r in 0..R {
                                sum[t][r] = _mm512_dpbusd_epi32(sum[t][r], w[r], q);
                            }
                        }
                    }
                    for t in 0..T {
                        let d = _mm512_loadu_ps(dp[t].add(g * LANES));
                        for r in 0..R {
                            let s = _mm512_mul_ps(d, ws[r]);
                            acc[t][r] =
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t][r]), s, acc[t][r]);
                        }
                    }
                }
            };
        }
        match fmt {
            WFormat::I4 => steps!(|p: *const u8| {
                let b = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast()));
                _mm512_and_si512(_mm512_srlv_epi16(b, shifts), low)
            }),
            _ => steps!(|p: *const u8| _mm512_xor_si512(_mm512_loadu_si512(p.cast()), flip)),
        }
        let mut out = [[0.0f32; R]; T];
        for t in 0..T {
            for r in 0..R {
                out[t][r] = reduce16_avx512(acc[t][r]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
