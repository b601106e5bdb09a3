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
    /// Bytes the grammar forces ([`crate::GrammarConstraint`]).
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
/// [`PromptLookup::max_draft`]), cut to what was accepted plus one after a rejection.
#[derive(Clone, Debug)]
pub struct Lookup {
    /// The n-gram settings.
    pub lookup: PromptLookup,
    /// Tokens the next draft may propose.
    pub len: usize,
}

impl Lookup {
    /// Starts at four tokens (or the maximum, when lower).
    pub fn new(lookup: PromptLookup) -> Lookup {
        Lookup {
            lookup,
            len: lookup.max_draft.min(4),
        }
    }
}

impl Drafter for Lookup {
    fn kind(&self) -> DraftKind {
        DraftKind::Lookup
    }
    fn propose(&mut self, at: &DraftAt<'_>) -> Vec<u32> {
        self.lookup.propose(at.history, self.len.max(1))
    }
    fn verified(&mut self, proposed: usize, kept: usize) {
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
        if self.resting() {
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
        self.kept(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
