//! Turning logits into a token: greedy, temperature, top-k, top-p; seeded.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling settings. `temperature <= 0` is greedy.
#[derive(Clone, Debug)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 = off).
    pub top_p: f32,
    /// RNG seed; the same seed and logits give the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// Below `max - 110` a scaled logit's `exp(x - max)` is 0 in f32 (the smallest subnormal is
/// `exp(-103.3)`): such a token has no probability at all.
const NEGLIGIBLE: f32 = -110.0;

/// A seeded sampler with reusable buffers.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    candidates: Vec<(u32, f32)>,
}

/// Index of the largest value; ties go to the lowest index.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    /// A sampler for these settings.
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler {
            params,
            rng,
            candidates: Vec::new(),
        }
    }

    /// The settings.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        // Tokens whose probability is exactly zero in f32 (masked to -inf by a constraint,
        // or more than ~104 below the best) can never be drawn: they are left out before
        // the sort, which otherwise orders the whole vocabulary on every token. Same draws
        // as sorting them all (`sample_plain` in the tests).
        let max = logits
            .iter()
            .map(|&l| l / p.temperature)
            .fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return argmax(logits);
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l / p.temperature))
                .filter(|&(_, x)| x - max > NEGLIGIBLE),
        );
        // Descending by logit, ties to the lower id: a total order, so the result is deterministic.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, by_logit);
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(by_logit);
        let max = c[0].1;
        let mut sum = 0.0f64;
        for e in c.iter_mut() {
            e.1 = (e.1 - max).exp();
            sum += e.1 as f64;
        }
        if p.top_p < 1.0 {
            let mut cum = 0.0f64;
            let mut keep = c.len();
            for (i, e) in c.iter().enumerate() {
                cum += e.1 as f64 / sum;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
            sum = c.iter().map(|e| e.1 as f64).sum();
        }
        let mut u = self.rng.gen::<f64>() * sum;
        for e in c.iter() {
            u -= e.1 as f64;
            if u < 0.0 {
                return e.0;
            }
        }
        // Only when rounding leaves u at or above zero: the last token that can be drawn.
        c.iter().rev().find(|e| e.1 > 0.0).unwrap_or(&c[0]).0
    }
}

/// `log(sum(exp(x)))` in f64 (for negative log-likelihoods).
pub fn log_sum_exp(x: &[f32]) -> f64 {
    coli_kernels::softmax::log_sum_exp(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain algorithm: every token a candidate, the whole vocabulary sorted.
    fn sample_plain(p: &SamplingParams, rng: &mut ChaCha8Rng, logits: &[f32]) -> u32 {
        let mut c: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l / p.temperature))
            .collect();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < c.len() {
            c.sort_by(by_logit);
            c.truncate(p.top_k);
        }
        c.sort_by(by_logit);
        let max = c[0].1;
        let mut sum = 0.0f64;
        for e in c.iter_mut() {
            e.1 = (e.1 - max).exp();
            sum += e.1 as f64;
        }
        if p.top_p < 1.0 {
            let mut cum = 0.0f64;
            let mut keep = c.len();
            for (i, e) in c.iter().enumerate() {
                cum += e.1 as f64 / sum;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
            sum = c.iter().map(|e| e.1 as f64).sum();
        }
        let mut u = rng.gen::<f64>() * sum;
        for e in c.iter() {
            u -= e.1 as f64;
            if u < 0.0 {
                return e.0;
            }
        }
        // Never reached with a positive candidate first: u starts below sum.
        c.iter()
            .rev()
            .find(|e| e.1 > 0.0)
            .expect("a positive candidate")
            .0
    }

    #[test]
    fn leaving_out_impossible_tokens_draws_what_the_plain_sort_draws() {
        let mut gen = ChaCha8Rng::seed_from_u64(5);
        for case in 0..300u64 {
            let n = gen.gen_range(1..400);
            // Masked (-inf), far below the best (zero probability), ties, and ordinary values.
            let logits: Vec<f32> = (0..n)
                .map(|_| match gen.gen_range(0..10) {
                    0..=3 => f32::NEG_INFINITY,
                    4 => -200.0 + gen.gen_range(0..3) as f32,
                    5 => 1.5,
                    _ => gen.gen_range(-20.0..20.0),
                })
                .collect();
            if logits.iter().all(|&l| l == f32::NEG_INFINITY) {
                continue;
            }
            let params = SamplingParams {
                temperature: [0.3, 0.7, 1.0, 1.5][case as usize % 4],
                top_k: [0, 1, 3, 50][(case / 4) as usize % 4],
                top_p: [1.0, 0.9, 0.5][(case / 16) as usize % 3],
                seed: case,
            };
            if params.top_k == 1 {
                continue;
            }
            let mut fast = Sampler::new(params.clone());
            let mut rng = ChaCha8Rng::seed_from_u64(case);
            for draw in 0..20 {
                let want = sample_plain(&params, &mut rng, &logits);
                assert_eq!(fast.sample(&logits), want, "case {case} draw {draw}");
            }
        }
    }

    #[test]
    fn everything_masked_gives_a_token_not_a_panic() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            seed: 1,
        });
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 4]), 0);
    }

    #[test]
    fn greedy_and_ties() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 5,
            top_p: 1.0,
            seed: 42,
        };
        let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
        let mut top5: Vec<u32> = (0..100u32).collect();
        top5.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]));
        top5.truncate(5);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let t = a.sample(&logits);
            assert_eq!(t, b.sample(&logits));
            assert!(top5.contains(&t));
            seen.insert(t);
        }
        assert!(seen.len() > 1, "temperature 1 should not be greedy");
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // One token holds ~99.9% of the mass: top_p 0.5 must always pick it.
        let mut logits = vec![0.0f32; 10];
        logits[3] = 10.0;
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 1,
        });
        for _ in 0..100 {
            assert_eq!(s.sample(&logits), 3);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // logits ln(1), ln(3): probabilities 1/4 and 3/4.
        let logits = [0.0f32, 3f32.ln()];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 7,
        });
        let n = 20000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
    }
}
