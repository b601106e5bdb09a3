//! The grammar matcher: which text a grammar still allows, character by character.
//!
//! The grammar is compiled into plain rules whose alternatives are sequences of character
//! sets and rule references (repetitions become helper rules). A matcher state is the set
//! of possible parse stacks, each stack the positions still to match, innermost last; a
//! character advances every stack whose next element accepts it and expands rule
//! references until each stack's top is a character set (or the stack is empty: the text so
//! far is a complete sentence). Bytes are decoded as UTF-8 incrementally, so a token may end
//! in the middle of a character.
//!
//! The pieces: `classes` (character classes and their range arithmetic), `dfa` (the
//! shared lazy automaton's tables), `stepper` (transitions computed on first use and the
//! mask's shortcuts), `relative` (states kept relative to their anchors, so stacks that
//! differ only below what a character moves step once), `shortcuts` (the answers the
//! mask's shortcuts ask for), `cold` (a mask's walk past its budget, stepping stacks
//! without making states); this file holds the compiled rules and the [`Matcher`] API.

use crate::gbnf::{Expr, Grammar};
use crate::schema::{SchemaInfo, SchemaNote, Violation};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex};

mod classes;
mod cold;
mod dfa;
mod relative;
mod shortcuts;
mod stepper;

use classes::*;
pub(crate) use cold::ColdNode;
use dfa::*;
use relative::*;
pub(crate) use shortcuts::Except;
pub(crate) use stepper::Stepper;

/// A compiled grammar: rules as alternatives of element sequences, the start state, and
/// the automaton its matchers share.
#[derive(Debug)]
pub struct Compiled {
    rules: Vec<Vec<Vec<Elem>>>,
    root: usize,
    start: StateData,
    dfa: Mutex<Dfa>,
    schema: Option<Arc<SchemaInfo>>,
}

/// A position: rule, alternative, index of the next element.
pub type Pos = (u32, u32, u32);

/// Deepest stack accepted (guards against pathological grammars).
const MAX_STACK: usize = 4096;

/// Most stacks kept at once (ambiguous grammars can multiply them).
const MAX_STACKS: usize = 4096;

/// Most states the lazy automaton keeps before it starts afresh.
const MAX_DFA_STATES: usize = 1 << 14;

/// Transition not computed yet.
const UNKNOWN: u32 = u32::MAX;
/// No frame: the bottom of a stack, or (as a state's top) an empty stack.
const NIL: u32 = u32::MAX;
/// Transition to nothing: the byte is refused.
const DEAD: u32 = u32::MAX - 1;
/// The characters of a class do not all lead to the same state.
const NONUNIFORM: u32 = u32::MAX - 2;

/// Where every character of a slice class leads from a state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Uniform {
    /// Not all to the same place.
    No,
    /// All refused.
    Dead,
    /// All to this state.
    To(u32),
}

/// A matcher state: the parse stacks (sorted, deduplicated) and the bytes of an incomplete
/// UTF-8 character.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct StateData {
    /// Each stack's top is a position whose next element is a character set, or the stack
    /// is empty (complete).
    stacks: Vec<Vec<Pos>>,
    pending: Vec<u8>,
}

/// A cursor: a state id (parse stacks at a character boundary), or with this bit an id of
/// an unfinished-character node (a state and the bytes of a character begun).
const PARTIAL: u32 = 1 << 30;

/// In a state's ASCII transitions: a group of characters accepted by the same stacks,
/// advanced when first used (`groups[index]`).
const GROUP: u32 = 1 << 29;

/// In a state's byte transitions: a lead byte where every non-ASCII character leads to
/// one same state (the cursor after it is loose).
const LOOSE_LEAD: u32 = u32::MAX - 3;

/// A loose cursor: inside a character begun at a state where every non-ASCII character
/// leads to one same state, the target (low 32 bits), with the bytes so far (bits 32..56)
/// and their count (bits 56..58). It needs no node of the automaton: every valid
/// beginning of a character is alive and the whole character leads to the target.
const LOOSE: u64 = 1 << 63;

/// Where a matcher is in the automaton: a state id, an unfinished-character node's id
/// with the `PARTIAL` bit, or a loose cursor.
pub(crate) type Cursor = u64;

/// Whether a cursor is at a character boundary.
pub(crate) fn at_boundary(c: Cursor) -> bool {
    c & (LOOSE | PARTIAL as u64) == 0
}

impl Compiled {
    /// Compiles a parsed grammar.
    pub fn new(g: &Grammar) -> Compiled {
        let mut c = Compiled {
            rules: vec![Vec::new(); g.rules.len()],
            root: g.root,
            start: StateData::default(),
            dfa: Mutex::new(Dfa::default()),
            schema: g.schema.clone(),
        };
        for (i, r) in g.rules.iter().enumerate() {
            let alts = c.alternatives(&r.expr);
            c.rules[i] = alts;
        }
        // The start state: the root's alternatives expanded (state 0 of the automaton).
        let mut dfa = Dfa::new();
        let mut st = Stepper {
            g: &c,
            dfa: &mut dfa,
        };
        let mut tops = Vec::new();
        st.dfa.seen.clear();
        for alt in 0..c.rules[c.root].len() {
            let f = st.dfa.frame((c.root as u32, alt as u32, 0), NIL);
            st.expand(f, &mut tops);
        }
        tops.sort_unstable();
        tops.dedup();
        let id = dfa.intern(&tops);
        c.start = StateData {
            stacks: dfa.materialize(id),
            pending: Vec::new(),
        };
        c.dfa = Mutex::new(dfa);
        c
    }

    fn fresh(&mut self, alts: Vec<Vec<Elem>>) -> usize {
        self.rules.push(alts);
        self.rules.len() - 1
    }

    fn alternatives(&mut self, e: &Expr) -> Vec<Vec<Elem>> {
        match e {
            Expr::Alt(v) => v.iter().flat_map(|x| self.alternatives(x)).collect(),
            _ => vec![self.sequence(e)],
        }
    }

    fn sequence(&mut self, e: &Expr) -> Vec<Elem> {
        match e {
            Expr::Seq(v) => v.iter().flat_map(|x| self.sequence(x)).collect(),
            Expr::Literal(l) => l
                .iter()
                .map(|&ch| Elem::Chars {
                    negated: false,
                    ranges: vec![(ch as u32, ch as u32)],
                })
                .collect(),
            Expr::Class { negated, ranges } => vec![Elem::Chars {
                negated: *negated,
                ranges: crate::regex::norm(
                    ranges.iter().map(|&(a, b)| (a as u32, b as u32)).collect(),
                ),
            }],
            Expr::Any => vec![Elem::Chars {
                negated: true,
                ranges: Vec::new(),
            }],
            Expr::Ref(i) => vec![Elem::Rule(*i)],
            Expr::Alt(_) => {
                let alts = self.alternatives(e);
                vec![Elem::Rule(self.fresh(alts))]
            }
            Expr::Repeat { expr, min, max } => {
                let body = self.sequence(expr);
                let mut out = Vec::new();
                for _ in 0..*min {
                    out.extend(body.iter().cloned());
                }
                match max {
                    None => {
                        // star ::= body star | ""
                        let star = self.fresh(Vec::new());
                        let mut rec = body.clone();
                        rec.push(Elem::Rule(star));
                        self.rules[star] = vec![rec, Vec::new()];
                        out.push(Elem::Rule(star));
                    }
                    Some(max) => {
                        // Nested optionals: (body (body (...)?)?)?
                        let mut tail: Option<usize> = None;
                        for _ in *min..*max {
                            let mut seq = body.clone();
                            if let Some(t) = tail {
                                seq.push(Elem::Rule(t));
                            }
                            tail = Some(self.fresh(vec![seq, Vec::new()]));
                        }
                        if let Some(t) = tail {
                            out.push(Elem::Rule(t));
                        }
                    }
                }
                out
            }
        }
    }

    /// States, computed transitions (byte-table entries filled, a state's whole ASCII row
    /// at once, plus non-ASCII characters in the map) and checked unfinished characters of
    /// the shared automaton so far (a diagnostic).
    pub fn automaton_size(&self) -> (usize, usize, usize) {
        let dfa = self.dfa.lock().unwrap_or_else(|p| p.into_inner());
        let computed = dfa.trans.iter().filter(|&&t| t != UNKNOWN).count() + dfa.chars.len();
        (dfa.states.len(), computed, dfa.pnodes.len())
    }

    /// The JSON Schema this grammar was converted from, with its notes.
    pub fn schema(&self) -> Option<&SchemaInfo> {
        self.schema.as_deref()
    }

    /// Keywords of the schema that were ignored (unknown or vendor annotations), each
    /// with keyword and path.
    pub fn warnings(&self) -> &[SchemaNote] {
        self.schema.as_deref().map_or(&[], SchemaInfo::warnings)
    }

    /// Where the grammar accepts more than the schema, each with keyword and path;
    /// finished text is then validated ([`Compiled::check_complete`]).
    pub fn relaxations(&self) -> &[SchemaNote] {
        self.schema.as_deref().map_or(&[], SchemaInfo::relaxations)
    }

    /// Whether text the grammar accepts must still be validated against the schema.
    pub fn needs_validation(&self) -> bool {
        self.schema
            .as_deref()
            .is_some_and(SchemaInfo::needs_validation)
    }

    /// Checks text the grammar accepted as complete: always fine for an exact grammar;
    /// for a relaxed one, the schema's validator decides (and repeated member names are
    /// refused). A violation is reported, never ignored.
    pub fn check_complete(&self, text: &str) -> Result<(), Violation> {
        match self.schema.as_deref() {
            Some(s) => s.check(text),
            None => Ok(()),
        }
    }

    /// Steps every state's concrete stacks (no state relative to its anchors) and every
    /// non-ASCII character on its own, without the shortcut for states where they all
    /// lead to one place (the reference the tests compare with).
    #[cfg(test)]
    pub(crate) fn reference_stepping(&self) {
        let mut dfa = self.dfa.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = dfa.epoch + 1;
        *dfa = Dfa::fresh(epoch, true, None);
    }

    /// Sets how many fresh steps a mask may spend before the rest of its walk is cold
    /// (tests walk cold from the start with 0, or never with `usize::MAX`).
    #[cfg(test)]
    pub(crate) fn cold_budget(&self, budget: usize) {
        let mut dfa = self.dfa.lock().unwrap_or_else(|p| p.into_inner());
        dfa.cold_budget = Some(budget);
    }

    /// A matcher at the start of the grammar.
    pub fn matcher(&self) -> Matcher<'_> {
        Matcher {
            g: self,
            data: self.start.clone(),
            hint: (u64::MAX, 0),
        }
    }

    /// A matcher continuing from `state`, which [`Matcher::detach`] took from a matcher of
    /// this same grammar (a state of another grammar gives meaningless answers).
    pub fn resume(&self, state: MatcherState) -> Matcher<'_> {
        Matcher {
            g: self,
            data: state.data,
            hint: state.hint,
        }
    }

    /// The element a stack top waits for (`None` for an empty stack).
    fn top_elem<'a>(&'a self, frames: &[(Pos, u32, u32)], top: u32) -> Option<&'a Elem> {
        (top != NIL).then(|| {
            let ((r, a, i), _, _) = frames[top as usize];
            &self.rules[r as usize][a as usize][i as usize]
        })
    }

    /// Whether some stack's next element accepts a code point in `lo..=hi`.
    fn could_accept<'e>(
        &self,
        mut elems: impl Iterator<Item = &'e Elem>,
        lo: u32,
        hi: u32,
    ) -> bool {
        elems.any(|e| {
            match e {
                Elem::Chars {
                    negated: false,
                    ranges,
                } => ranges.iter().any(|&(x, y)| x <= hi && lo <= y),
                Elem::Chars {
                    negated: true,
                    ranges,
                } => {
                    // Some code point of lo..=hi outside every range.
                    let mut next = lo;
                    for &(x, y) in ranges {
                        if x > next {
                            break;
                        }
                        next = next.max(y.saturating_add(1));
                    }
                    next <= hi
                }
                Elem::Rule(_) => false,
            }
        })
    }

    /// The one character every continuation of `d` must start with, if there is one
    /// (and the text is not complete: then ending is another choice).
    fn forced_char(&self, frames: &[(Pos, u32, u32)], tops: &[u32]) -> Option<u32> {
        if tops.contains(&NIL) {
            return None;
        }
        let mut only = None;
        for &top in tops {
            match self.top_elem(frames, top).expect("non-empty") {
                Elem::Chars {
                    negated: false,
                    ranges,
                } => {
                    for &(x, y) in ranges {
                        if x != y || only.is_some_and(|o| o != x) {
                            return None;
                        }
                        only = Some(x);
                    }
                }
                _ => return None,
            }
        }
        only
    }

    /// Runs `f` with exclusive use of the shared automaton, positioned at `m`'s state.
    pub(crate) fn with_stepper<R>(
        &self,
        m: &Matcher,
        f: impl FnOnce(&mut Stepper, Cursor) -> R,
    ) -> R {
        self.with_stepper_at(m, |st, _, cur| f(st, cur))
    }

    /// [`Compiled::with_stepper`], also giving the state of `m`'s last character boundary.
    fn with_stepper_at<R>(&self, m: &Matcher, f: impl FnOnce(&mut Stepper, u32, Cursor) -> R) -> R {
        let mut dfa = self.dfa.lock().unwrap_or_else(|p| p.into_inner());
        if dfa.states.len() > MAX_DFA_STATES || dfa.pnodes.len() > 4 * MAX_DFA_STATES {
            let (epoch, reference, budget) = (dfa.epoch + 1, dfa.reference, dfa.cold_budget);
            *dfa = Dfa::fresh(epoch, reference, budget);
        }
        let id = if m.hint.0 == dfa.epoch {
            m.hint.1
        } else {
            dfa.intern_stacks(&m.data.stacks)
        };
        let mut st = Stepper {
            g: self,
            dfa: &mut dfa,
        };
        let cur = st
            .cursor(id, &m.data.pending)
            .expect("a matcher's pending bytes were accepted");
        f(&mut st, id, cur)
    }
}

/// The state of matching a text against a grammar. Cheap to clone; transitions are
/// computed once per grammar and shared.
#[derive(Clone, Debug)]
pub struct Matcher<'g> {
    g: &'g Compiled,
    data: StateData,
    /// (automaton epoch, state id) of `data`, when known.
    hint: (u64, u32),
}

/// A matcher's position without the borrow of its grammar, for owners that keep the
/// grammar beside it (an `Arc<Compiled>` and its state in one struct): moving in and out
/// is free, nothing is recomputed.
#[derive(Clone, Debug)]
pub struct MatcherState {
    data: StateData,
    hint: (u64, u32),
}

impl<'g> Matcher<'g> {
    /// Lets go of the grammar, keeping the position ([`Compiled::resume`] takes it back).
    pub fn detach(self) -> MatcherState {
        MatcherState {
            data: self.data,
            hint: self.hint,
        }
    }

    /// Advances by one character; false (and unchanged) if the grammar does not allow it.
    pub fn accept_char(&mut self, c: char) -> bool {
        let mut buf = [0u8; 4];
        self.accept_bytes(c.encode_utf8(&mut buf).as_bytes())
    }

    /// Advances by bytes (UTF-8, characters may be split across calls); false (and
    /// unchanged) if the grammar does not allow them or they are not valid UTF-8.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> bool {
        let g = self.g;
        let r = g.with_stepper_at(self, |st, mut s, mut cur| {
            // `s`: the state at the last character boundary (an unfinished character's
            // node may be shared by several states).
            for &b in bytes {
                cur = st.step(cur, b)?;
                if at_boundary(cur) {
                    s = cur as u32;
                }
            }
            let stacks = if s == self.hint.1 && self.hint.0 == st.dfa.epoch {
                None
            } else {
                Some(st.dfa.materialize(s))
            };
            let pending = st.pending_of(cur);
            Some((st.dfa.epoch, s, pending, stacks))
        });
        match r {
            Some((epoch, s, pending, stacks)) => {
                if let Some(stacks) = stacks {
                    self.data.stacks = stacks;
                }
                self.data.pending.clear();
                self.data.pending.extend_from_slice(pending.as_slice());
                self.hint = (epoch, s);
                true
            }
            None => false,
        }
    }

    /// The bytes every continuation must start with (at most `max`): the grammar allows
    /// exactly one next character at each of them and the text is not complete before
    /// them. An engine can draft the tokens of these bytes without sampling.
    pub fn forced_bytes(&self, max: usize) -> Vec<u8> {
        let g = self.g;
        g.with_stepper(self, |st, cur| {
            let mut out = Vec::new();
            if !at_boundary(cur) {
                return out;
            }
            let mut s = cur as u32;
            while out.len() < max {
                let mut f = st.dfa.forced[s as usize];
                if f == UNKNOWN {
                    f = g
                        .forced_char(&st.dfa.frames, &st.dfa.states[s as usize])
                        .unwrap_or(DEAD);
                    st.dfa.forced[s as usize] = f;
                }
                let Some(c) = char::from_u32(f).filter(|_| f != DEAD) else {
                    break;
                };
                let mut buf = [0u8; 4];
                let enc = c.encode_utf8(&mut buf).as_bytes();
                if out.len() + enc.len() > max {
                    break;
                }
                s = st
                    .step_char(s, c as u32)
                    .expect("a forced character is accepted");
                out.extend_from_slice(enc);
            }
            out
        })
    }

    /// The state (parse stacks and pending bytes), for comparing matchers.
    pub fn state(&self) -> (&[Vec<Pos>], &[u8]) {
        (&self.data.stacks, &self.data.pending)
    }

    /// Whether the text so far is a complete sentence (end of sequence allowed here).
    pub fn is_complete(&self) -> bool {
        self.data.pending.is_empty() && self.data.stacks.iter().any(Vec::is_empty)
    }

    /// Whether no continuation is possible (nothing more may be added).
    pub fn is_dead_end(&self) -> bool {
        self.data.stacks.iter().all(Vec::is_empty)
    }

    /// The compiled grammar this matcher runs.
    pub fn grammar(&self) -> &'g Compiled {
        self.g
    }

    /// Whether `text` is a whole sentence of the grammar (a fresh matcher, every byte, end)
    /// and, when the grammar is a relaxed JSON Schema, valid against the schema.
    pub fn matches(g: &'g Compiled, text: &str) -> bool {
        let mut m = g.matcher();
        m.accept_bytes(text.as_bytes()) && m.is_complete() && g.check_complete(text).is_ok()
    }
}

#[cfg(test)]
mod tests;
