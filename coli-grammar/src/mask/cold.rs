//! The mask's cold walk: below a state none of whose transitions is known, once the
//! mask has spent its budget of fresh steps, the stacks are stepped along the token trie
//! without becoming states (see `matcher/cold.rs`).

use super::{TokenMask, TokenTrie};
use crate::matcher::{ColdNode, Cursor, Stepper};

impl TokenTrie {
    /// [`TokenTrie::walk`] from state `s` when its walk is cold: its concrete stacks
    /// stepped along the trie.
    pub(super) fn walk_cold_from(
        &self,
        st: &mut Stepper,
        node: usize,
        s: u32,
        allowed: &mut TokenMask,
    ) {
        let mut tops = st.take_tops();
        st.concrete(s, &mut tops);
        self.walk_cold(st, node, &tops, Some(s), allowed);
        st.give_tops(tops);
    }

    /// Allows the tokens below `node` that the stacks topped by `tops` (sorted, concrete;
    /// their state `s` when it is one already) take. ASCII bytes step the stacks, the
    /// bytes that the same tops take sharing one step; a byte past ASCII steps the state
    /// the stacks are made into.
    fn walk_cold(
        &self,
        st: &mut Stepper,
        node: usize,
        tops: &[u32],
        mut s: Option<u32>,
        allowed: &mut TokenMask,
    ) {
        let mut n: ColdNode = st.cold_node(tops);
        for &(byte, child) in self.edges_of(node) {
            #[cfg(test)]
            super::WALKED.with(|c| c.set(c.get() + 1));
            let child = child as usize;
            if byte >= 0x80 {
                let s = *s.get_or_insert_with(|| st.intern_tops(tops));
                if let Some(t) = st.step(s as Cursor, byte) {
                    self.ends(child).iter().for_each(|&id| allowed.set(id));
                    self.walk(st, child, t, allowed);
                }
                continue;
            }
            let Some(i) = st.cold_step(&mut n, tops, byte) else {
                continue;
            };
            if self.plain_below[child] && st.cold_loops_on_plain(&mut n, i) {
                self.allow_subtree(child, allowed);
                continue;
            }
            self.ends(child).iter().for_each(|&id| allowed.set(id));
            self.walk_cold(st, child, n.out(i), None, allowed);
        }
        st.give_node(n);
    }
}
