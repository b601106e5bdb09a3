//! Causal scaled dot-product attention of one query head over a KV cache.

use crate::dot::dot_f32;
use crate::softmax::softmax_inplace;

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
    let hd = kv.head_dim;
    let scores = &mut scores[..n_pos];
    for (j, s) in scores.iter_mut().enumerate() {
        let k = &kv.keys[j * kv.stride + kv.offset..][..hd];
        *s = dot_f32(q, k) * scale;
    }
    softmax_inplace(scores);
    out.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        let v = &kv.values[j * kv.stride + kv.offset..][..out.len()];
        for (o, &vi) in out.iter_mut().zip(v) {
            *o += p * vi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
