//! Prompt-lookup drafting: proposals follow the latest earlier match of the context's last
//! n-gram, and the verified output is the output of decoding without drafts, token for
//! token, greedy and sampled, on every fixture.

use coli_models::sampling::{Sampler, SamplingParams};
use coli_models::session::Constraint;
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

/// Drafts the plain answer's next three tokens with the third one wrong: every
/// verification keeps two drafts and refuses one.
struct HalfRightDrafts {
    answer: Vec<u32>,
    vocab: u32,
    seen: usize,
}

impl Constraint for HalfRightDrafts {
    fn mask(&mut self, _: &mut [f32]) {}
    fn accept(&mut self, _: u32) -> bool {
        self.seen += 1;
        true
    }
    fn draft(&mut self) -> Vec<u32> {
        let next = &self.answer[self.seen.min(self.answer.len())..];
        let mut d: Vec<u32> = next.iter().take(3).copied().collect();
        if let Some(last) = d.get_mut(2) {
            *last = (*last + 1) % self.vocab;
        }
        d
    }
}

/// A linear-attention model cannot cut its recurrent state back to the accepted drafts:
/// the state before the verification batch is put back and the kept tokens replayed. A
/// refused draft must leave the same answer as decoding without drafts.
#[test]
fn refused_drafts_restore_the_recurrent_state() {
    for name in ["qwen3_next_hybrid", "qwen3_next_layer_types_shard"] {
        let r = Reference::load(name);
        let prompt = &r.ids()[..8];
        let (plain, _) = generate(&r, prompt, 24, 0.0, false);
        let m = coli_models::load(&r.dir).unwrap();
        let mut s = Session::new(&m, prompt.len() + 24);
        let mut drafts = HalfRightDrafts {
            answer: plain.clone(),
            vocab: r.vocab() as u32,
            seen: 0,
        };
        let mut sampler = Sampler::new(SamplingParams::default());
        let g = s
            .generate_constrained(prompt, 24, &mut sampler, &[], &mut drafts, |_| {})
            .unwrap();
        assert_eq!(g.generated_ids, plain, "{name}");
        let st = &g.stats;
        assert!(
            st.drafted_tokens > 0 && st.drafted_tokens < st.draft_proposed,
            "{name}: drafts must be both kept and refused ({} of {})",
            st.drafted_tokens,
            st.draft_proposed
        );
    }
}
