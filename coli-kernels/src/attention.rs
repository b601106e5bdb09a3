//! Causal scaled dot-product attention of one query head over a KV cache.

use crate::cpu::{self, Isa};
use crate::dot::{bytemuck_f32, dot_f32, dot_rows, WFormat};
use crate::softmax::softmax_isa;

/// Keys and values of one KV head: `n_pos` rows of `head_dim`, `stride` apart, starting at `offset`.
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a> {
    /// The key cache (all heads interleaved by position).
    pub keys: &'a [f32],
    /// The value cache, same layout.
    pub values: &'a [f32],
    /// Elements between consecutive positions.
    pub stride: usize,
    /// Offset of this head within a position.
    pub offset: usize,
    /// Key length (= value length) per head.
    pub head_dim: usize,
}

/// `out = softmax(q·K^T * scale) V` over positions `0..n_pos`; `scores` is scratch of at least `n_pos`.
/// Values are accumulated in increasing position order.
pub fn attend(
    q: &[f32],
    kv: KvView,
    n_pos: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    attend_window(q, kv, 0..n_pos, scale, None, scores, out)
}

/// [`attend`] over the positions `span` only (a sliding window ending at the query), with
/// an optional attention sink: a learned logit that joins the softmax's denominator and
/// carries no value (gpt-oss). With `span = 0..n` and no sink it performs exactly the
/// operations of `attend(.., n, ..)`.
pub fn attend_window(
    q: &[f32],
    kv: KvView,
    span: std::ops::Range<usize>,
    scale: f32,
    sink: Option<f32>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    attend_ring(q, kv, usize::MAX, span, scale, sink, scores, out)
}

/// [`attend_window`] over a ring of `rows` positions: position `j`'s key and value are at
/// row `j % rows` of the view (a sliding window's cache that keeps only its last
/// positions). The span must fit in the ring. Positions are visited in increasing order,
/// as [`attend_window`] visits them, so a ring that holds the span gives its bits.
#[allow(clippy::too_many_arguments)]
pub fn attend_ring(
    q: &[f32],
    kv: KvView,
    rows: usize,
    span: std::ops::Range<usize>,
    scale: f32,
    sink: Option<f32>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    attend_ring_isa(cpu::best(), q, kv, rows, span, scale, sink, scores, out)
}

/// [`attend_ring`] on the given instruction set. Every set performs the same operations
/// in the same order, so all give the same bits: each logit is [`dot_rows`]'s f32 dot
/// product (keys four at a time) times `scale`; the probabilities are
/// [`softmax_isa`]'s (with its exponential, [`crate::softmax::exp_f32`]); each output
/// element starts at +0 and
/// adds `p · v` position by position, a product and then a sum (never fused), the vector
/// paths holding a group of elements in registers across the positions.
///
/// # Panics
/// If the span is longer than the ring, or `isa` does not run on this CPU.
#[allow(clippy::too_many_arguments)]
pub fn attend_ring_isa(
    isa: Isa,
    q: &[f32],
    kv: KvView,
    rows: usize,
    span: std::ops::Range<usize>,
    scale: f32,
    sink: Option<f32>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (hd, len) = (kv.head_dim, span.len());
    assert!(len <= rows, "a span of {len} positions in a ring of {rows}");
    // The span's rows: from the first position's row to the ring's end, then from row 0.
    let r0 = span.start % rows;
    let before_wrap = len.min(rows - r0);
    let segments = [r0..r0 + before_wrap, 0..len - before_wrap];
    let row_of = |j: usize| {
        if j < before_wrap {
            r0 + j
        } else {
            j - before_wrap
        }
    };
    let key = |j: usize| bytemuck_f32(&kv.keys[row_of(j) * kv.stride + kv.offset..][..hd]);
    let scores = &mut scores[..len];
    let mut j = 0;
    while j + 4 <= len {
        let v = dot_rows(
            isa,
            WFormat::F32,
            [key(j), key(j + 1), key(j + 2), key(j + 3)],
            q,
        );
        for (s, v) in scores[j..j + 4].iter_mut().zip(v) {
            *s = v * scale;
        }
        j += 4;
    }
    for (j, s) in scores.iter_mut().enumerate().skip(j) {
        *s = dot_rows(isa, WFormat::F32, [key(j)], q)[0] * scale;
    }
    softmax_isa(isa, scores, sink);
    let values = Values {
        data: kv.values,
        stride: kv.stride,
        offset: kv.offset,
        segments,
    };
    let vd = out.len();
    // Every row's value slice is in bounds (rows rise within a segment, so its last row
    // decides): checked once here, not per element.
    for seg in values.segments.iter().filter(|s| !s.is_empty()) {
        assert!(
            (seg.end - 1) * kv.stride + kv.offset + vd <= kv.values.len(),
            "attention: a value row past the cache"
        );
    }
    let done = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(cpu::supports(Isa::Avx512));
            // SAFETY: AVX-512F is available (checked); every value row was bounds-checked.
            unsafe { x86::weigh_avx512(&values, scores, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(cpu::supports(Isa::Avx2));
            // SAFETY: AVX2 is available (checked); every value row was bounds-checked.
            unsafe { x86::weigh_avx2(&values, scores, out) }
        }
        _ => 0,
    };
    weigh_scalar(&values, scores, out, done);
}

/// The value rows of a span: row `r` of `segments` (in order) at `data[r * stride + offset..]`.
struct Values<'a> {
    data: &'a [f32],
    stride: usize,
    offset: usize,
    segments: [std::ops::Range<usize>; 2],
}

/// Output elements `from..`: `out[e] = Σ p_j · v_j[e]` in position order, from +0, a
/// product then a sum at each step (the reference the vector paths follow).
fn weigh_scalar(values: &Values, ps: &[f32], out: &mut [f32], from: usize) {
    let out = &mut out[from..];
    out.fill(0.0);
    let rows = values.segments[0].clone().chain(values.segments[1].clone());
    for (r, &p) in rows.zip(ps) {
        let v = &values.data[r * values.stride + values.offset + from..][..out.len()];
        for (o, &vi) in out.iter_mut().zip(v) {
            *o += p * vi;
        }
    }
}

/// [`attend`] restricted to the listed positions (ascending; sparse attention). With every
/// position `0..n` listed it performs exactly the operations of `attend(.., n, ..)`, so it
/// returns the same bits.
pub fn attend_selected(
    q: &[f32],
    kv: KvView,
    positions: &[u32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let scores = &mut scores[..positions.len()];
    for (&j, s) in positions.iter().zip(scores.iter_mut()) {
        let k = &kv.keys[j as usize * kv.stride + kv.offset..][..hd];
        *s = dot_f32(q, k) * scale;
    }
    softmax_isa(cpu::best(), scores, None);
    out.fill(0.0);
    for (&j, &p) in positions.iter().zip(scores.iter()) {
        let v = &kv.values[j as usize * kv.stride + kv.offset..][..out.len()];
        for (o, &vi) in out.iter_mut().zip(v) {
            *o += p * vi;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Values;
    use std::arch::x86_64::*;

    /// One instruction set's value sum: [`super::weigh_scalar`] over whole groups of
    /// `$lanes` elements (four groups at a time in registers while the positions pass), the
    /// same operations per element. Returns how many elements it wrote; the caller does the
    /// rest.
    macro_rules! weigh {
        ($(#[$doc:meta])* $name:ident, $feature:literal, $lanes:literal,
         $zero:ident, $splat:ident, $load:ident, $store:ident, $add:ident, $mul:ident) => {
            $(#[$doc])*
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn $name(values: &Values, ps: &[f32], out: &mut [f32]) -> usize {
                let base = values.data.as_ptr().add(values.offset);
                let mut c = 0;
                while c + $lanes <= out.len() {
                    let groups = ((out.len() - c) / $lanes).min(4);
                    let mut acc = [$zero(); 4];
                    let mut j = 0;
                    for seg in &values.segments {
                        for r in seg.clone() {
                            let p = $splat(*ps.get_unchecked(j));
                            let v = base.add(r * values.stride + c);
                            for (g, a) in acc.iter_mut().enumerate().take(groups) {
                                *a = $add(*a, $mul(p, $load(v.add($lanes * g))));
                            }
                            j += 1;
                        }
                    }
                    for (g, a) in acc.iter().enumerate().take(groups) {
                        $store(out.as_mut_ptr().add(c + $lanes * g), *a);
                    }
                    c += $lanes * groups;
                }
                c
            }
        };
    }

    weigh!(
        /// The value sum in groups of 16 (AVX-512).
        ///
        /// # Safety
        /// AVX-512F must be available and every row's `out.len()` values in bounds.
        weigh_avx512, "avx512f", 16,
        _mm512_setzero_ps, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, _mm512_mul_ps
    );
    weigh!(
        /// The value sum in groups of 8 (AVX2).
        ///
        /// # Safety
        /// AVX2 must be available and every row's `out.len()` values in bounds.
        weigh_avx2, "avx2", 8,
        _mm256_setzero_ps, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps, _mm256_mul_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition in f64: softmax over the window's logits and the sink, then the
    /// values weighted by all but the sink's probability.
    fn window_reference(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        hd: usize,
        span: std::ops::Range<usize>,
        scale: f32,
        sink: Option<f32>,
    ) -> Vec<f64> {
        let logits: Vec<f64> = span
            .clone()
            .map(|j| {
                let k = &keys[j * hd..(j + 1) * hd];
                q.iter()
                    .zip(k)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let max = logits
            .iter()
            .copied()
            .chain(sink.map(f64::from))
            .fold(f64::NEG_INFINITY, f64::max);
        let denom: f64 = logits.iter().map(|l| (l - max).exp()).sum::<f64>()
            + sink.map_or(0.0, |s| (s as f64 - max).exp());
        let mut out = vec![0.0; hd];
        for (l, j) in logits.iter().zip(span) {
            for (o, v) in out.iter_mut().zip(&values[j * hd..(j + 1) * hd]) {
                *o += (l - max).exp() / denom * *v as f64;
            }
        }
        out
    }

    #[test]
    fn windows_and_sinks_follow_the_definition() {
        let (n, hd) = (29, 8);
        let keys: Vec<f32> = (0..n * hd)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let values: Vec<f32> = (0..n * hd)
            .map(|i| ((i * 104729) % 97) as f32 / 40.0 - 1.2)
            .collect();
        let q: Vec<f32> = (0..hd).map(|i| i as f32 / 4.0 - 0.9).collect();
        let kv = KvView {
            keys: &keys,
            values: &values,
            stride: hd,
            offset: 0,
            head_dim: hd,
        };
        let mut scores = vec![0.0; n];
        // A sink far above the logits takes almost all the mass; far below, none.
        for (span, sink) in [
            (0..n, None),
            (21..n, None),
            (0..n, Some(0.7)),
            (25..n, Some(-1.3)),
            (28..n, Some(40.0)),
            (10..n, Some(-60.0)),
        ] {
            let mut out = vec![0.0; hd];
            attend_window(&q, kv, span.clone(), 0.35, sink, &mut scores, &mut out);
            let want = window_reference(&q, &keys, &values, hd, span.clone(), 0.35, sink);
            for (g, w) in out.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() < 1e-5,
                    "{span:?} {sink:?}: {g} vs {w}"
                );
            }
        }
        // The full span without a sink is `attend`, bit for bit.
        let (mut a, mut b) = (vec![0.0; hd], vec![0.0; hd]);
        attend(&q, kv, n, 0.35, &mut scores, &mut a);
        attend_window(&q, kv, 0..n, 0.35, None, &mut scores, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn selecting_every_position_is_dense_attention_bit_for_bit() {
        let n = 37;
        let keys: Vec<f32> = (0..n * 8)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let values: Vec<f32> = (0..n * 8)
            .map(|i| ((i * 104729) % 97) as f32 / 40.0 - 1.2)
            .collect();
        let kv = KvView {
            keys: &keys,
            values: &values,
            stride: 8,
            offset: 0,
            head_dim: 8,
        };
        let q: Vec<f32> = (0..8).map(|i| i as f32 * 0.3 - 1.0).collect();
        let (mut s1, mut s2) = (vec![0.0; n], vec![0.0; n]);
        let (mut dense, mut sparse) = (vec![0.0; 8], vec![0.0; 8]);
        attend(&q, kv, n, 0.35, &mut s1, &mut dense);
        let all: Vec<u32> = (0..n as u32).collect();
        attend_selected(&q, kv, &all, 0.35, &mut s2, &mut sparse);
        assert_eq!(
            dense.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            sparse.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // A strict subset attends to those positions only: equal to dense attention over a
        // cache holding just them.
        let pick = [3u32, 10, 11, 30];
        attend_selected(&q, kv, &pick, 0.35, &mut s2, &mut sparse);
        let (k2, v2): (Vec<f32>, Vec<f32>) = (
            pick.iter()
                .flat_map(|&j| keys[j as usize * 8..][..8].to_vec())
                .collect(),
            pick.iter()
                .flat_map(|&j| values[j as usize * 8..][..8].to_vec())
                .collect(),
        );
        let kv2 = KvView {
            keys: &k2,
            values: &v2,
            ..kv
        };
        attend(&q, kv2, 4, 0.35, &mut s1, &mut dense);
        assert_eq!(dense, sparse);
    }

    #[test]
    fn a_ring_holding_the_window_gives_the_flat_caches_bits() {
        // Keys and values interleaved in one row (key, then value), two heads of 8, the
        // ring's rows written as a sliding-window cache writes them: position j at j % rows,
        // later positions over earlier ones.
        let (n, hd, heads) = (53, 8, 2);
        let w = 2 * heads * hd;
        let flat: Vec<f32> = (0..n * w)
            .map(|i| ((i * 7919) % 211) as f32 / 90.0 - 1.1)
            .collect();
        fn view(rows: &[f32], head: usize, hd: usize, heads: usize) -> KvView<'_> {
            KvView {
                keys: rows,
                values: &rows[heads * hd..],
                stride: 2 * heads * hd,
                offset: head * hd,
                head_dim: hd,
            }
        }
        let q: Vec<f32> = (0..hd).map(|i| i as f32 * 0.21 - 0.7).collect();
        let mut scores = vec![0.0; n];
        for rows in [5, 9, 16, 53] {
            let mut ring = vec![f32::NAN; rows * w];
            for end in 1..=n {
                let p = end - 1;
                ring[(p % rows) * w..][..w].copy_from_slice(&flat[p * w..][..w]);
                for (len, sink) in [
                    (1, None),
                    (rows.min(end), Some(0.4)),
                    (rows.min(end) / 2, None),
                ] {
                    let span = end - len..end;
                    for head in 0..heads {
                        let (mut a, mut b) = (vec![0.0; hd], vec![0.0; hd]);
                        let fl = view(&flat, head, hd, heads);
                        attend_window(&q, fl, span.clone(), 0.3, sink, &mut scores, &mut a);
                        let rv = view(&ring, head, hd, heads);
                        attend_ring(&q, rv, rows, span.clone(), 0.3, sink, &mut scores, &mut b);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&a), bits(&b), "ring of {rows}, {span:?}, head {head}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_instruction_set_gives_the_scalar_bits() {
        // Key and value widths around the vector groups (16 and 8 lanes, four groups at a
        // time), values wider or narrower than keys (MLA), rings that wrap, spans not a
        // multiple of four keys, with and without a sink.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        };
        for (hd, vd) in [
            (1, 1),
            (7, 9),
            (16, 16),
            (24, 40),
            (64, 64),
            (80, 72),
            (64, 136),
        ] {
            let stride = hd + vd + 3;
            for (rows, n) in [(7, 5), (13, 13), (40, 33), (97, 97)] {
                let cache: Vec<f32> = (0..rows * stride).map(|_| rnd()).collect();
                let kv = KvView {
                    keys: &cache,
                    values: &cache[hd..],
                    stride,
                    offset: 1,
                    head_dim: hd,
                };
                let q: Vec<f32> = (0..hd).map(|_| rnd()).collect();
                let mut scores = vec![0.0; rows];
                for (start, sink) in [(0, None), (rows / 2 + 1, Some(0.3)), (3 * rows + 2, None)] {
                    let span = start..start + n;
                    let mut want = vec![0.0; vd];
                    attend_ring_isa(
                        Isa::Scalar,
                        &q,
                        kv,
                        rows,
                        span.clone(),
                        0.2,
                        sink,
                        &mut scores,
                        &mut want,
                    );
                    assert!(want.iter().all(|v| v.is_finite() && *v != 0.0));
                    for isa in cpu::available() {
                        let mut got = vec![f32::NAN; vd];
                        attend_ring_isa(
                            isa,
                            &q,
                            kv,
                            rows,
                            span.clone(),
                            0.2,
                            sink,
                            &mut scores,
                            &mut got,
                        );
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{isa:?} hd {hd} vd {vd} ring {rows} {span:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "in a ring of 4")]
    fn a_span_longer_than_the_ring_is_refused() {
        let rows = vec![0.0f32; 4 * 8];
        let kv = KvView {
            keys: &rows,
            values: &rows,
            stride: 8,
            offset: 0,
            head_dim: 8,
        };
        let (mut scores, mut out) = (vec![0.0; 8], vec![0.0; 8]);
        attend_ring(&[0.0; 8], kv, 4, 3..8, 1.0, None, &mut scores, &mut out);
    }

    #[test]
    fn attends_like_the_formula() {
        // 3 positions, 2 heads of dim 2 interleaved; attend with head 1.
        let keys = [0., 0., 1., 0., 0., 0., 0., 1., 0., 0., 1., 1.];
        let values = [0., 0., 1., 2., 0., 0., 3., 4., 0., 0., 5., 6.];
        let q = [1.0f32, 2.0];
        let kv = KvView {
            keys: &keys,
            values: &values,
            stride: 4,
            offset: 2,
            head_dim: 2,
        };
        let mut scores = [0.0; 3];
        let mut out = [0.0; 2];
        attend(&q, kv, 3, 0.5, &mut scores, &mut out);
        let s = [0.5f64, 1.0, 1.5];
        let z: f64 = s.iter().map(|v| v.exp()).sum();
        let p: Vec<f64> = s.iter().map(|v| v.exp() / z).collect();
        let want = [
            p[0] * 1.0 + p[1] * 3.0 + p[2] * 5.0,
            p[0] * 2.0 + p[1] * 4.0 + p[2] * 6.0,
        ];
        for i in 0..2 {
            assert!((out[i] as f64 - want[i]).abs() < 1e-5);
        }
        // Selected positions 0 and 2 of head 1: its keys and values, not head 0's.
        attend_selected(&q, kv, &[0, 2], 0.5, &mut scores, &mut out);
        let s = [0.5f64, 1.5];
        let z: f64 = s.iter().map(|v| v.exp()).sum();
        let p: Vec<f64> = s.iter().map(|v| v.exp() / z).collect();
        let want = [p[0] * 1.0 + p[1] * 5.0, p[0] * 2.0 + p[1] * 6.0];
        for i in 0..2 {
            assert!(
                (out[i] as f64 - want[i]).abs() < 1e-5,
                "{out:?} vs {want:?}"
            );
        }
    }
}
