//! Cold walks: once a mask has stepped its budget of stacks afresh (steps not cached in
//! the automaton), the rest of its walk steps the parse stacks themselves along the token
//! trie, below states none of whose transitions is known, instead of making a state of
//! every token prefix.
//!
//! A state costs far more than a step of its stacks: its relative form and anchors, the
//! index, a row of byte transitions and the ASCII groups. The first key of a large object
//! (80 declared names) reaches hundreds of prefixes that no later mask may visit again,
//! and making each a state was the slowest mask of the real-world corpus. A cold step
//! advances the same concrete stacks the automaton would ([`Stepper::advance`], as the
//! automaton's own concrete path does), so the mask is the same; only the automaton is
//! left smaller. Characters past ASCII go back through the automaton (the stacks are
//! then made a state). The budget counts fresh steps rather than new states: where the
//! steps are cached (the next key of an object whose tracked members changed, which
//! makes new states of known shapes), states are cheap and the walk stays in the
//! automaton, so the states are there for the masks after it.

use super::*;

/// Stacks stepped afresh ([`Stepper::compute`] not answered by a cached step) that one
/// mask may spend before the rest of its walk is cold. Measured on the real-world corpus
/// (BENCHMARKS.md, issue 17): 128 left the first keys of GitHub's repository objects the
/// slowest masks; 64 made the keys after them, which find fewer states made, slower
/// still; 96 lowers the maximum between the two without changing the sum of the masks.
pub(super) const COLD_BUDGET: usize = 96;

/// Scratch of one trie node of a cold walk: the tops after each distinct set of stack
/// tops that take a byte (a node's bytes that the same tops take lead to the same
/// stacks), and whether those loop on plain string content (0 unknown, 1 no, 2 yes).
#[derive(Debug, Default)]
pub(crate) struct ColdNode {
    keys: Vec<u64>,
    outs: Vec<Vec<u32>>,
    loops: Vec<u8>,
    used: usize,
    /// Per top of the node: the ASCII characters its element takes.
    sets: Vec<u128>,
}

/// Tops past this many are not told apart by a signature (each byte is stepped alone).
const SIGNED: usize = 63;

impl ColdNode {
    /// The result slot for `key`, and whether it was already filled.
    fn slot(&mut self, key: u64) -> (usize, bool) {
        if let Some(i) = self.keys[..self.used].iter().position(|&k| k == key) {
            return (i, true);
        }
        if self.used == self.keys.len() {
            self.keys.push(key);
            self.outs.push(Vec::new());
            self.loops.push(0);
        }
        let i = self.used;
        self.keys[i] = key;
        self.outs[i].clear();
        self.loops[i] = 0;
        self.used += 1;
        (i, false)
    }

    /// The tops after slot `i`'s byte.
    pub(crate) fn out(&self, i: usize) -> &[u32] {
        &self.outs[i]
    }
}

impl Stepper<'_> {
    /// Starts a mask's walk: its budget of steps counts from here.
    pub(crate) fn begin_walk(&mut self) {
        self.dfa.walk_from = self.dfa.steps_made;
    }

    /// Whether the walk below cursor `c` should be cold: the mask's budget of fresh
    /// steps is spent and `c` is a state none of whose ASCII transitions is known yet (the
    /// reference stepping never walks cold).
    pub(crate) fn is_cold(&self, c: Cursor) -> bool {
        at_boundary(c)
            && !self.dfa.reference
            && self.dfa.steps_made - self.dfa.walk_from
                >= self.dfa.cold_budget.unwrap_or(COLD_BUDGET)
            && self.dfa.trans[slot(c as u32, 0)] == UNKNOWN
    }

    /// A node's scratch, from the pool, with the ASCII sets of `tops`.
    pub(crate) fn cold_node(&mut self, tops: &[u32]) -> ColdNode {
        let mut n = self.dfa.cold_nodes.pop().unwrap_or_default();
        n.used = 0;
        n.sets.clear();
        if tops.len() <= SIGNED {
            for &t in tops {
                let set = self
                    .g
                    .top_elem(&self.dfa.frames, t)
                    .map_or(0, Elem::ascii_set);
                n.sets.push(set);
            }
        }
        n
    }

    /// Gives a node's scratch back to the pool.
    pub(crate) fn give_node(&mut self, n: ColdNode) {
        self.dfa.cold_nodes.push(n);
    }

    /// A pooled list of tops.
    pub(crate) fn take_tops(&mut self) -> Vec<u32> {
        let mut v = self.dfa.cold_tops.pop().unwrap_or_default();
        v.clear();
        v
    }

    /// Gives a list of tops back to the pool.
    pub(crate) fn give_tops(&mut self, v: Vec<u32>) {
        self.dfa.cold_tops.push(v);
    }

    /// The concrete tops of state `s` into `out` (sorted).
    pub(crate) fn concrete(&mut self, s: u32, out: &mut Vec<u32>) {
        self.dfa.concrete_tops(s, out);
    }

    /// Steps `tops` (a node's, whose scratch is `n`) on ASCII byte `b`: the slot of `n`
    /// holding the tops after it, or `None` if no stack takes it.
    pub(crate) fn cold_step(&mut self, n: &mut ColdNode, tops: &[u32], b: u8) -> Option<usize> {
        let key = if tops.len() <= SIGNED {
            let mut sig = 0u64;
            for (i, set) in n.sets.iter().enumerate() {
                sig |= ((set >> b & 1) as u64) << i;
            }
            if sig == 0 {
                return None;
            }
            sig
        } else {
            1 << 63 | b as u64
        };
        let (i, known) = n.slot(key);
        if !known {
            let mut out = std::mem::take(&mut n.outs[i]);
            if !self.advance(tops, b as u32, &mut out) {
                out.clear();
            }
            n.outs[i] = out;
        }
        (!n.outs[i].is_empty()).then_some(i)
    }

    /// Whether the tops of slot `i` of `n` take every character of plain string content
    /// and lead back to themselves ([`Stepper::loops_on_plain`] without making a state).
    pub(crate) fn cold_loops_on_plain(&mut self, n: &mut ColdNode, i: usize) -> bool {
        if n.loops[i] == 0 {
            let class = crate::slices::SLICE_CLASSES[0];
            // Every character of the class then leads to the same stacks, so one of them
            // decides whether those are the stacks themselves.
            let loops = self.takes_all_or_none(&n.outs[i], class) && {
                let mut after = self.take_tops();
                let back = self.advance(&n.outs[i], class[0].0, &mut after) && after == n.outs[i];
                self.give_tops(after);
                back
            };
            n.loops[i] = if loops { 2 } else { 1 };
        }
        n.loops[i] == 2
    }

    /// The state of (sorted) concrete tops.
    pub(crate) fn intern_tops(&mut self, tops: &[u32]) -> u32 {
        self.dfa.intern(tops)
    }
}
