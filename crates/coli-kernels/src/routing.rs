//! MoE routing: choose the top-k experts of a token.

use crate::softmax::softmax_inplace;

/// Indices of the `k` largest values, largest first; ties go to the lower index.
/// `order` is scratch of `values.len()`; the result is its first `k` entries.
pub fn top_k_indices<'a>(values: &[f32], k: usize, order: &'a mut Vec<usize>) -> &'a [usize] {
    assert!(
        k <= values.len(),
        "top-k: k = {k} > {} values",
        values.len()
    );
    order.clear();
    order.extend(0..values.len());
    // The comparator is a total order (index breaks ties), so an unstable sort is deterministic
    // and does not allocate.
    order.sort_unstable_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    &order[..k]
}

/// Softmax top-k routing (Mixtral/OLMoE/Qwen style): softmax over all router logits,
/// keep the `k` most probable experts, optionally renormalise their weights to sum to 1.
/// Writes expert ids and weights in rank order.
pub fn softmax_top_k(
    logits: &[f32],
    k: usize,
    renormalize: bool,
    probs: &mut Vec<f32>,
    order: &mut Vec<usize>,
    experts: &mut [usize],
    weights: &mut [f32],
) {
    assert_eq!(experts.len(), k);
    assert_eq!(weights.len(), k);
    probs.clear();
    probs.extend_from_slice(logits);
    softmax_inplace(probs);
    let top = top_k_indices(probs, k, order);
    for (r, &e) in top.iter().enumerate() {
        experts[r] = e;
        weights[r] = probs[e];
    }
    if renormalize {
        let sum: f32 = weights.iter().sum();
        for w in weights.iter_mut() {
            *w /= sum;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_index() {
        let mut order = Vec::new();
        assert_eq!(
            top_k_indices(&[1.0, 3.0, 3.0, 2.0, 3.0], 3, &mut order),
            &[1, 2, 4]
        );
    }

    #[test]
    fn routing_with_and_without_renormalisation() {
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let (mut probs, mut order) = (Vec::new(), Vec::new());
        let (mut ex, mut w) = ([0usize; 2], [0f32; 2]);
        softmax_top_k(&logits, 2, false, &mut probs, &mut order, &mut ex, &mut w);
        assert_eq!(ex, [1, 2]);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!((w[0] as f64 - 2f64.exp() / z).abs() < 1e-6);
        assert!((w[1] as f64 - 1f64.exp() / z).abs() < 1e-6);
        softmax_top_k(&logits, 2, true, &mut probs, &mut order, &mut ex, &mut w);
        let e = 2f64.exp() / (2f64.exp() + 1f64.exp());
        assert!((w[0] as f64 - e).abs() < 1e-6);
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6);
    }
}
