//! Draft sources of speculative decoding behind one trait, [`Drafter`]: the tokens a
//! grammar forces, prompt lookup and the checkpoint's MTP layer. A session
//! ([`crate::Session`]) and a server slot ([`crate::Engine::step`]) ask the same sources in
//! the same order (the first that proposes anything wins) and verify the draft in one
//! batched forward: each drafted token is kept while sampling its row picks it, so the
//! output is the one decoding without drafts gives, and drafts decide speed only.

use crate::arch::Transformer;
use crate::mtp_drafts::MtpDrafts;
use crate::session::{Constraint, PromptLookup};

/// Where a draft starts: the token just picked and what came before it.
pub struct DraftAt<'a> {
    /// The model.
    pub model: &'a Transformer,
    /// Position of `next` (the positions fed so far).
    pub pos: usize,
    /// The token just picked; its forward has not run yet.
    pub next: u32,
    /// The whole sequence: prompt and generated tokens, ending with `next`.
    pub history: &'a [u32],
    /// Most tokens the draft may hold (room left in the context and in `max_tokens`).
    pub max: usize,
}

/// Which source a draft came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftKind {
    /// Bytes the grammar forces ([`crate::constrained::GrammarConstraint`]).
    Forced,
    /// Prompt lookup ([`PromptLookup`]).
    Lookup,
    /// The checkpoint's MTP layer ([`MtpDrafts`]).
    Mtp,
}

/// A source of draft tokens.
pub trait Drafter {
    /// Which source this is.
    fn kind(&self) -> DraftKind;
    /// Up to `at.max` tokens guessed to follow `at.next`; empty when it has no guess.
    fn propose(&mut self, at: &DraftAt<'_>) -> Vec<u32>;
    /// The main model kept `kept` of the `proposed` tokens of this source's last draft.
    fn verified(&mut self, _proposed: usize, _kept: usize) {}
}

/// The first non-empty draft of `sources` (asked in order; `None` entries are sources
/// that are off), cut to `at.max`, with the index of the source that gave it.
pub fn first_draft(
    sources: &mut [Option<&mut dyn Drafter>],
    at: &DraftAt<'_>,
) -> Option<(usize, Vec<u32>)> {
    if at.max == 0 {
        return None;
    }
    for (i, d) in sources.iter_mut().enumerate() {
        let Some(d) = d else { continue };
        let mut v = d.propose(at);
        v.truncate(at.max);
        if !v.is_empty() {
            return Some((i, v));
        }
    }
    None
}

/// Most steps a source sits out after drafts refused in a row (see [`Backoff`]).
pub const MAX_REST: usize = 31;

/// A draft source's back-off: after the `k`-th draft in a row refused whole (`k` ≥ 2;
/// none of its tokens kept) the source sits out the next `min(2^(k-1) - 1, MAX_REST)`
/// steps at which it would be asked (1, 3, 7, 15, then 31); a kept token resets `k`. A
/// source that guesses well rarely rests; one that guesses badly costs a draft every 32
/// steps instead of every step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    /// Drafts refused whole in a row.
    pub refused: u32,
    /// Steps still to sit out.
    pub rest: usize,
}

impl Backoff {
    /// Whether this step is one the source sits out (counting it).
    pub fn resting(&mut self) -> bool {
        if self.rest == 0 {
            return false;
        }
        self.rest -= 1;
        true
    }

    /// The main model kept `kept` tokens of the source's last draft.
    pub fn kept(&mut self, kept: usize) {
        if kept > 0 {
            self.refused = 0;
            return;
        }
        self.refused = self.refused.saturating_add(1);
        if self.refused >= 2 {
            let k = (self.refused - 1).min(6);
            self.rest = ((1usize << k) - 1).min(MAX_REST);
        }
    }
}

/// A constraint's forced tokens ([`Constraint::draft`]) as a draft source.
pub struct Forced<'c>(pub &'c mut dyn Constraint);

impl Drafter for Forced<'_> {
    fn kind(&self) -> DraftKind {
        DraftKind::Forced
    }
    fn propose(&mut self, _: &DraftAt<'_>) -> Vec<u32> {
        self.0.draft()
    }
}

/// Prompt lookup with an adaptive length: doubled after a fully accepted draft (up to
/// [`PromptLookup::max_draft`]), cut to what was accepted plus one after a rejection; and
/// the [`Backoff`] after drafts refused whole in a row.
#[derive(Clone, Debug)]
pub struct Lookup {
    /// The n-gram settings.
    pub lookup: PromptLookup,
    /// Tokens the next draft may propose.
    pub len: usize,
    /// Rests after refused drafts.
    pub backoff: Backoff,
}

impl Lookup {
    /// Starts at four tokens (or the maximum, when lower).
    pub fn new(lookup: PromptLookup) -> Lookup {
        Lookup {
            lookup,
            len: lookup.max_draft.min(4),
            backoff: Backoff::default(),
        }
    }
}

impl Drafter for Lookup {
    fn kind(&self) -> DraftKind {
        DraftKind::Lookup
    }
    fn propose(&mut self, at: &DraftAt<'_>) -> Vec<u32> {
        if self.backoff.resting() {
            return Vec::new();
        }
        self.lookup.propose(at.history, self.len.max(1))
    }
    fn verified(&mut self, proposed: usize, kept: usize) {
        self.backoff.kept(kept);
        let max = self.lookup.max_draft.max(1);
        self.len = if kept == proposed {
            (2 * self.len).min(max)
        } else {
            (kept + 1).min(max)
        };
    }
}

impl Drafter for MtpDrafts {
    fn kind(&self) -> DraftKind {
        DraftKind::Mtp
    }
    fn propose(&mut self, at: &DraftAt<'_>) -> Vec<u32> {
        if self.backoff.resting() {
            return Vec::new();
        }
        // A draft only changes speed: a failed one is no draft (and none after).
        match self.draft(at.model, at.pos, at.next, at.max) {
            Ok(v) => v,
            Err(_) => {
                self.lose_track();
                Vec::new()
            }
        }
    }
    fn verified(&mut self, _proposed: usize, kept: usize) {
        self.backoff.kept(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_rests_1_3_7_15_then_31_steps_after_refusals_in_a_row() {
        let mut b = Backoff::default();
        // Counts the steps sat out after each refusal in a row.
        let mut rests = Vec::new();
        for _ in 0..7 {
            b.kept(0);
            let mut n = 0;
            while b.resting() {
                n += 1;
            }
            rests.push(n);
        }
        assert_eq!(rests, [0, 1, 3, 7, 15, 31, 31]);
        b.kept(2);
        b.kept(0);
        assert!(!b.resting(), "a kept token starts the count over");
    }

    #[test]
    fn lookup_length_doubles_on_full_acceptance_and_shrinks_on_rejection() {
        let mut l = Lookup::new(PromptLookup::default());
        assert_eq!(l.len, 4);
        l.verified(4, 4);
        assert_eq!(l.len, 8);
        l.verified(8, 8);
        assert_eq!(l.len, 8, "capped at max_draft");
        l.verified(8, 2);
        assert_eq!(l.len, 3);
        l.verified(3, 0);
        assert_eq!(l.len, 1);
    }
}
