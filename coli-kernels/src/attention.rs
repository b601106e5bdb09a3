//! Causal scaled dot-product attention of one query head over a KV cache.

use crate::dot::dot_f32;
use crate::softmax::{softmax_inplace, softmax_with_sink};

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
    let (hd, len) = (kv.head_dim, span.len());
    assert!(len <= rows, "a span of {len} positions in a ring of {rows}");
    // The span's rows: from the first position's row to the ring's end, then from row 0.
    let r0 = span.start % rows;
    let before_wrap = len.min(rows - r0);
    let order = (r0..r0 + before_wrap).chain(0..len - before_wrap);
    let scores = &mut scores[..len];
    for (r, s) in order.clone().zip(scores.iter_mut()) {
        let k = &kv.keys[r * kv.stride + kv.offset..][..hd];
        *s = dot_f32(q, k) * scale;
    }
    match sink {
        None => softmax_inplace(scores),
        Some(sink) => softmax_with_sink(scores, sink),
    }
    out.fill(0.0);
    for (r, &p) in order.zip(scores.iter()) {
        let v = &kv.values[r * kv.stride + kv.offset..][..out.len()];
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
    softmax_inplace(scores);
    out.fill(0.0);
    for (&j, &p) in positions.iter().zip(scores.iter()) {
        let v = &kv.values[j as usize * kv.stride + kv.offset..][..out.len()];
        for (o, &vi) in out.iter_mut().zip(v) {
            *o += p * vi;
        }
    }
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
