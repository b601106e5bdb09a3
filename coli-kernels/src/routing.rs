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

/// Settings of sigmoid routing with a selection bias and group-limited top-k
/// (DeepSeek-V3, Kimi-K2, GLM-4.5).
#[derive(Clone, Debug)]
pub struct GroupedSigmoid<'a> {
    /// `e_score_correction_bias`: added to the scores for choosing experts only.
    pub bias: &'a [f32],
    /// Expert groups (`n_group`).
    pub n_group: usize,
    /// Groups a token may use (`topk_group`).
    pub topk_group: usize,
    /// Renormalise the chosen weights to sum to 1 (plus 1e-20).
    pub renormalize: bool,
    /// Multiplies the final weights (`routed_scaling_factor`).
    pub scaling: f32,
}

/// Reusable buffers of [`sigmoid_group_top_k`].
#[derive(Debug, Default)]
pub struct RouteScratch {
    scores: Vec<f32>,
    choice: Vec<f32>,
    groups: Vec<f32>,
    order: Vec<usize>,
}

/// `1 / (1 + e^-x)` in f32.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Top-k of the raw logits, then a softmax over the chosen ones only (gpt-oss'
/// `GptOssTopKRouter`): weights sum to 1 over the k experts. Ties go to the lower index.
/// Writes expert ids and weights in rank order (best first).
pub fn top_k_softmax(
    logits: &[f32],
    k: usize,
    order: &mut Vec<usize>,
    experts: &mut [usize],
    weights: &mut [f32],
) {
    assert_eq!(experts.len(), k);
    assert_eq!(weights.len(), k);
    let top = top_k_indices(logits, k, order);
    experts.copy_from_slice(top);
    for (w, &e) in weights.iter_mut().zip(top) {
        *w = logits[e];
    }
    crate::softmax::softmax_inplace(weights);
}

/// Sigmoid top-k routing with a selection bias and group limits, as `transformers`'
/// `DeepseekV3TopkRouter`: scores = sigmoid(logits); choice = scores + bias; each group is
/// rated by the sum of its two best choices; the `topk_group` best groups stay, the others'
/// choices become -inf (DeepSeek's reference code and `transformers` >= 5; 4.x filled 0, which
/// differs only when fewer than `k` kept choices are positive); the `k` best choices win; their weights are the *unbiased* scores,
/// optionally renormalised, times `scaling`. Ties go to the lower index. Writes expert ids and
/// weights in rank order (best choice first).
pub fn sigmoid_group_top_k(
    logits: &[f32],
    k: usize,
    p: &GroupedSigmoid,
    s: &mut RouteScratch,
    experts: &mut [usize],
    weights: &mut [f32],
) {
    let e = logits.len();
    assert_eq!(p.bias.len(), e);
    assert!(p.n_group > 0 && e.is_multiple_of(p.n_group) && p.topk_group <= p.n_group);
    let per_group = e / p.n_group;
    s.scores.clear();
    s.scores.extend(logits.iter().map(|&x| sigmoid(x)));
    s.choice.clear();
    s.choice
        .extend(s.scores.iter().zip(p.bias).map(|(&v, &b)| v + b));
    s.groups.clear();
    for g in s.choice.chunks_exact(per_group) {
        // Sum of the two largest (one when a group has a single expert).
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &v in g {
            if v > a {
                b = a;
                a = v;
            } else if v > b {
                b = v;
            }
        }
        s.groups.push(if per_group == 1 { a } else { a + b });
    }
    if p.topk_group < p.n_group {
        let kept = top_k_indices(&s.groups, p.topk_group, &mut s.order);
        for (g, chunk) in s.choice.chunks_exact_mut(per_group).enumerate() {
            if !kept.contains(&g) {
                chunk.fill(f32::NEG_INFINITY);
            }
        }
    }
    let top = top_k_indices(&s.choice, k, &mut s.order);
    for (r, &ex) in top.iter().enumerate() {
        experts[r] = ex;
        weights[r] = s.scores[ex];
    }
    if p.renormalize {
        let sum: f32 = weights.iter().sum::<f32>() + 1e-20;
        for w in weights.iter_mut() {
            *w /= sum;
        }
    }
    for w in weights.iter_mut() {
        *w *= p.scaling;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_softmax_normalises_over_the_chosen_logits_only() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let (mut order, mut ex, mut w) = (Vec::new(), [0usize; 3], [0f32; 3]);
        top_k_softmax(&logits, 3, &mut order, &mut ex, &mut w);
        // The tie at 2.0 goes to the lower index first.
        assert_eq!(ex, [1, 3, 4]);
        let z = 2.0f64.exp() * 2.0 + 1.0f64.exp();
        for (got, want) in w
            .iter()
            .zip([2.0f64.exp() / z, 2.0f64.exp() / z, 1.0f64.exp() / z])
        {
            assert!((*got as f64 - want).abs() < 1e-7, "{got} vs {want}");
        }
    }

    #[test]
    fn grouped_sigmoid_selects_with_bias_and_weighs_without() {
        // 8 experts in 4 groups of 2; keep 2 groups, pick 2 experts.
        let logits = [0.0f32, 1.0, 2.0, -1.0, 0.5, 0.4, -2.0, 3.0];
        let bias = [0.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -5.0];
        let p = GroupedSigmoid {
            bias: &bias,
            n_group: 4,
            topk_group: 2,
            renormalize: false,
            scaling: 2.0,
        };
        let mut s = RouteScratch::default();
        let (mut ex, mut w) = ([0usize; 2], [0f32; 2]);
        sigmoid_group_top_k(&logits, 2, &p, &mut s, &mut ex, &mut w);
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        // Group sums: g0 = s(0)+s(1), g1 = s(2)+s(-1), g2 = s(.5)+s(.4), g3 = s(-2)+s(3)-5.
        // g0 ~ 1.231, g1 ~ 1.150, g2 ~ 1.221, g3 < 0: groups 0 and 2 stay.
        // Best choices in them: expert 1 (0.731), expert 4 (0.622).
        assert_eq!(ex, [1, 4]);
        assert!((w[0] as f64 - 2.0 * sig(1.0)).abs() < 1e-6);
        assert!((w[1] as f64 - 2.0 * sig(0.5)).abs() < 1e-6);
        // Renormalised: weights sum to the scaling factor.
        let p = GroupedSigmoid {
            renormalize: true,
            ..p
        };
        sigmoid_group_top_k(&logits, 2, &p, &mut s, &mut ex, &mut w);
        assert!((w[0] + w[1] - 2.0).abs() < 1e-6);
        // The bias steers selection: without it expert 7 (logit 3) would win outright.
        let p = GroupedSigmoid {
            bias: &[0.0; 8],
            n_group: 1,
            topk_group: 1,
            renormalize: false,
            scaling: 1.0,
        };
        sigmoid_group_top_k(&logits, 2, &p, &mut s, &mut ex, &mut w);
        assert_eq!(ex, [7, 2]);
    }

    #[test]
    fn masked_groups_lose_even_to_negative_choices() {
        // Every choice negative: a 0-filled mask would pick the dropped group's experts.
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let bias = [-5.0f32; 4];
        let p = GroupedSigmoid {
            bias: &bias,
            n_group: 2,
            topk_group: 1,
            renormalize: true,
            scaling: 1.0,
        };
        let mut s = RouteScratch::default();
        let (mut ex, mut w) = ([0usize; 2], [0f32; 2]);
        sigmoid_group_top_k(&logits, 2, &p, &mut s, &mut ex, &mut w);
        assert_eq!(ex, [3, 2]);
    }

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
