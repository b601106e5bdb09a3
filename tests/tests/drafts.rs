//! Prompt-lookup drafting: proposals follow the latest earlier match of the context's last
//! n-gram, and the verified output is the output of decoding without drafts, token for
//! token, greedy and sampled, on every fixture.

use coli_models::sampling::{Sampler, SamplingParams};
use coli_models::{PromptLookup, Session};
use coli_tests::{Reference, TINY_FIXTURES};

#[test]
fn lookup_proposes_what_followed_the_latest_match_of_the_longest_ngram() {
    let l = PromptLookup {
        max_ngram: 3,
        min_ngram: 2,
        max_draft: 8,
    };
    // The 3-gram [1, 2, 3] occurred at the start: propose what followed it.
    assert_eq!(l.propose(&[1, 2, 3, 4, 9, 1, 2, 3], 2), vec![4, 9]);
    assert_eq!(l.propose(&[1, 2, 3, 4, 9, 1, 2, 3], 8), vec![4, 9, 1, 2, 3]);
    // No 3-gram match; the 2-gram [5, 6] matched latest at index 3.
    assert_eq!(l.propose(&[5, 6, 7, 5, 6, 8, 5, 6], 3), vec![8, 5, 6]);
    // A longer match wins over a later shorter one.
    assert_eq!(l.propose(&[7, 5, 6, 1, 9, 5, 6, 2, 7, 5, 6], 1), vec![1]);
    // Nothing repeats, or too short: no proposal (1-grams are below min_ngram).
    assert!(l.propose(&[1, 2, 3, 4, 1], 4).is_empty());
    assert!(l.propose(&[3, 3], 4).is_empty());
    assert!(l.propose(&[], 4).is_empty());
}

/// Generates `n` tokens after `prompt` with or without lookup drafts.
fn generate(
    r: &Reference,
    prompt: &[u32],
    n: usize,
    temperature: f32,
    lookup: bool,
) -> (Vec<u32>, coli_models::session::GenStats) {
    let m = coli_models::load(&r.dir).unwrap();
    let mut s = Session::new(&m, prompt.len() + n);
    s.lookup = lookup.then(PromptLookup::default);
    let mut sampler = Sampler::new(SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        seed: 11,
    });
    let g = s.generate(prompt, n, &mut sampler, &[], |_| {}).unwrap();
    (g.generated_ids, g.stats)
}

#[test]
fn drafted_generation_equals_plain_generation_on_every_fixture() {
    let (mut proposed, mut accepted) = (0, 0);
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        // A prompt that repeats itself, so lookup finds matches from the start.
        let ids = r.ids();
        let mut prompt: Vec<u32> = ids[..10].to_vec();
        prompt.extend_from_slice(&ids[..10]);
        prompt.extend_from_slice(&ids[..4]);
        for temperature in [0.0, 0.8] {
            let (plain, ps) = generate(&r, &prompt, 20, temperature, false);
            let (drafted, ds) = generate(&r, &prompt, 20, temperature, true);
            assert_eq!(drafted, plain, "{name} at temperature {temperature}");
            assert_eq!(ps.draft_proposed, 0);
            assert!(ds.drafted_tokens <= ds.draft_proposed);
            proposed += ds.draft_proposed;
            accepted += ds.drafted_tokens;
        }
    }
    // Drafts were proposed, some kept and some rolled back.
    assert!(
        accepted > 0 && accepted < proposed,
        "{accepted} of {proposed}"
    );
}
