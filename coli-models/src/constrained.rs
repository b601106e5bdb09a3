//! Grammar-constrained sampling: a compiled grammar (GBNF or JSON Schema) as a
//! [`Constraint`] on a session's sampling, with forced-span drafts.

use crate::session::Constraint;
use coli_grammar::{Compiled, Matcher, TokenMask, TokenTrie};
use std::sync::Arc;

/// Most forced bytes drafted at once.
const MAX_DRAFT_BYTES: usize = 128;

/// A grammar as a sampling constraint: tokens whose bytes the grammar does not allow get
/// -inf; end-of-sequence only where the text is complete; generation ends when nothing
/// more may follow; bytes the grammar forces are offered as a draft.
pub struct GrammarConstraint<'g> {
    matcher: Matcher<'g>,
    trie: Arc<TokenTrie>,
    bytes: Arc<Vec<Vec<u8>>>,
    eos: Vec<u32>,
    allowed: TokenMask,
    drafts: bool,
}

impl<'g> GrammarConstraint<'g> {
    /// Constrains to `grammar`; `token_bytes[id]` are each token's bytes (empty for
    /// special tokens), `eos` the end-of-sequence ids.
    pub fn new(grammar: &'g Compiled, token_bytes: Vec<Vec<u8>>, eos: Vec<u32>) -> Self {
        let trie = Arc::new(TokenTrie::new(&token_bytes));
        Self::with_trie(grammar, trie, Arc::new(token_bytes), eos)
    }

    /// Like [`GrammarConstraint::new`] with the vocabulary's trie already built (it is the
    /// same for every grammar of a model).
    pub fn with_trie(
        grammar: &'g Compiled,
        trie: Arc<TokenTrie>,
        token_bytes: Arc<Vec<Vec<u8>>>,
        eos: Vec<u32>,
    ) -> Self {
        GrammarConstraint {
            matcher: grammar.matcher(),
            trie,
            bytes: token_bytes,
            eos,
            allowed: TokenMask::default(),
            drafts: true,
        }
    }

    /// Turns forced-span drafts on or off (on by default; off samples every token alone).
    pub fn with_drafts(mut self, on: bool) -> Self {
        self.drafts = on;
        self
    }

    /// The matcher's current state.
    pub fn matcher(&self) -> &Matcher<'g> {
        &self.matcher
    }
}

impl Constraint for GrammarConstraint<'_> {
    fn mask(&mut self, logits: &mut [f32]) {
        self.trie.mask(&self.matcher, &mut self.allowed);
        let complete = self.matcher.is_complete();
        for (id, l) in logits.iter_mut().enumerate() {
            let ok =
                self.allowed.is_allowed(id as u32) || (complete && self.eos.contains(&(id as u32)));
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    fn accept(&mut self, token: u32) -> bool {
        if self.eos.contains(&token) {
            return false;
        }
        let bytes = self.bytes.get(token as usize).map_or(&[][..], |b| &b[..]);
        self.matcher.accept_bytes(bytes) && !self.matcher.is_dead_end()
    }

    fn draft(&mut self) -> Vec<u32> {
        if !self.drafts {
            return Vec::new();
        }
        let forced = self.matcher.forced_bytes(MAX_DRAFT_BYTES);
        self.trie.greedy_tokens(&forced)
    }
}
