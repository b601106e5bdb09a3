//! Grammar-constrained sampling: a compiled grammar (GBNF or JSON Schema) as a
//! [`Constraint`] on a session's sampling, with forced-span drafts.

use crate::session::Constraint;
use coli_grammar::{Compiled, Matcher, MatcherState, TokenMask, TokenTrie};
use std::sync::Arc;

/// Most forced bytes drafted at once.
const MAX_DRAFT_BYTES: usize = 128;

/// A grammar as a sampling constraint: tokens whose bytes the grammar does not allow get
/// -inf; end-of-sequence only where the text is complete; generation ends when nothing
/// more may follow; bytes the grammar forces are offered as a draft.
///
/// It owns its grammar (shared, from the compile cache) and its matcher's position, so a
/// request can carry it between scheduler steps.
pub struct GrammarConstraint {
    grammar: Arc<Compiled>,
    state: Option<MatcherState>,
    trie: Arc<TokenTrie>,
    bytes: Arc<Vec<Vec<u8>>>,
    eos: Vec<u32>,
    allowed: TokenMask,
    drafts: bool,
}

impl GrammarConstraint {
    /// Constrains to `grammar`; `token_bytes[id]` are each token's bytes (empty for
    /// special tokens), `eos` the end-of-sequence ids.
    pub fn new(grammar: Arc<Compiled>, token_bytes: Vec<Vec<u8>>, eos: Vec<u32>) -> Self {
        let trie = Arc::new(TokenTrie::new(&token_bytes));
        Self::with_trie(grammar, trie, Arc::new(token_bytes), eos)
    }

    /// Like [`GrammarConstraint::new`] with the vocabulary's trie already built (it is the
    /// same for every grammar of a model).
    pub fn with_trie(
        grammar: Arc<Compiled>,
        trie: Arc<TokenTrie>,
        token_bytes: Arc<Vec<Vec<u8>>>,
        eos: Vec<u32>,
    ) -> Self {
        let state = Some(grammar.matcher().detach());
        GrammarConstraint {
            grammar,
            state,
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

    /// The grammar.
    pub fn grammar(&self) -> &Arc<Compiled> {
        &self.grammar
    }

    /// Runs `f` on the matcher at the current position (it may advance it).
    pub fn with_matcher<R>(&mut self, f: impl FnOnce(&mut Matcher<'_>) -> R) -> R {
        let state = self
            .state
            .take()
            .expect("the matcher state is always put back");
        let mut m = self.grammar.resume(state);
        let r = f(&mut m);
        self.state = Some(m.detach());
        r
    }

    /// Whether the text accepted so far is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.with_matcher(|m| m.is_complete())
    }
}

impl Constraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) {
        let (trie, mut allowed) = (self.trie.clone(), std::mem::take(&mut self.allowed));
        let complete = self.with_matcher(|m| {
            trie.mask(m, &mut allowed);
            m.is_complete()
        });
        self.allowed = allowed;
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
        let state = self
            .state
            .take()
            .expect("the matcher state is always put back");
        let mut m = self.grammar.resume(state);
        let bytes = self.bytes.get(token as usize).map_or(&[][..], |b| &b[..]);
        let ok = m.accept_bytes(bytes) && !m.is_dead_end();
        self.state = Some(m.detach());
        ok
    }

    fn draft(&mut self) -> Vec<u32> {
        if !self.drafts {
            return Vec::new();
        }
        let forced = self.with_matcher(|m| m.forced_bytes(MAX_DRAFT_BYTES));
        self.trie.greedy_tokens(&forced)
    }
}
