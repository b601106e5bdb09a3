//! Token masks: which tokens of a vocabulary the grammar allows next. The tokens' byte
//! strings form a trie; one walk from the matcher's state visits each shared prefix once
//! (a token may span several grammar elements, or end inside a UTF-8 character).

use crate::matcher::{at_boundary, Cursor, Matcher, Stepper, Uniform};
use crate::slices::SLICE_CLASSES;

mod cold;

/// Which tokens are allowed: one bit per token id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u64>,
    len: usize,
}

impl TokenMask {
    fn reset(&mut self, len: usize) {
        self.len = len;
        self.words.clear();
        self.words.resize(len.div_ceil(64), 0);
    }

    #[inline]
    fn set(&mut self, id: u32) {
        self.words[id as usize / 64] |= 1 << (id % 64);
    }

    /// Whether token `id` is allowed (false past the vocabulary).
    #[inline]
    pub fn is_allowed(&self, id: u32) -> bool {
        (id as usize) < self.len && self.words[id as usize / 64] >> (id % 64) & 1 == 1
    }

    /// Number of allowed tokens.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Token ids covered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no token ids.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A slice of the vocabulary: tokens made only of characters of a class (whole UTF-8
/// characters), by length, and a trie of every other token. Where every character of the
/// class leads from a state to one same state, and again from there, a token of the slice
/// is allowed exactly when that chain is at least as long as the token; the slice is then
/// decided by one bitset copy and only the rest of the vocabulary is walked.
#[derive(Clone, Debug, Default)]
struct Slice {
    /// `upto[n]`: the members of at most `n` characters (`n` up to the longest member).
    upto: Vec<Vec<u64>>,
    rest: TokenTrie,
    /// For the first slice: `first[x]`, the members starting with ASCII character `x`.
    first: Vec<Vec<u64>>,
}

/// A trie of the vocabulary's byte strings, stored flat: nodes in depth-first order, each
/// with its edges (byte, child) and the tokens that end there.
#[derive(Clone, Debug, Default)]
pub struct TokenTrie {
    /// Per node: `edges[first_edge[n]..first_edge[n + 1]]`.
    first_edge: Vec<u32>,
    edges: Vec<(u8, u32)>,
    /// Per node: `end_ids[first_end[n]..first_end[n + 1]]`.
    first_end: Vec<u32>,
    end_ids: Vec<u32>,
    /// Per node: the node after its subtree (nodes `n..subtree_end[n]` are the subtree).
    subtree_end: Vec<u32>,
    /// Per node: whether every token of its subtree continues past the node's bytes with
    /// whole characters of plain string content only (`SLICE_CLASSES[0]`), so a state
    /// that takes any such character and stays put allows the whole subtree.
    plain_below: Vec<bool>,
    vocab_size: usize,
    /// One per slice class (empty for a trie built without slices).
    slices: Vec<Slice>,
}

impl TokenTrie {
    /// Builds the trie of `tokens[id]` (empty byte strings never match), with its slices.
    pub fn new(tokens: &[Vec<u8>]) -> TokenTrie {
        let mut t = TokenTrie::plain(tokens);
        let words = tokens.len().div_ceil(64);
        for class in SLICE_CLASSES {
            // Characters of each token when all are in the class.
            let count = |b: &[u8]| -> Option<usize> {
                let s = std::str::from_utf8(b).ok().filter(|s| !s.is_empty())?;
                s.chars()
                    .all(|c| class.iter().any(|&(x, y)| x <= c as u32 && c as u32 <= y))
                    .then(|| s.chars().count())
            };
            let mut upto: Vec<Vec<u64>> = vec![vec![0u64; words]];
            let rest: Vec<Vec<u8>> = tokens
                .iter()
                .enumerate()
                .map(|(id, b)| match count(b) {
                    Some(n) => {
                        while upto.len() <= n {
                            upto.push(vec![0u64; words]);
                        }
                        upto[n][id / 64] |= 1 << (id % 64);
                        Vec::new()
                    }
                    None => b.clone(),
                })
                .collect();
            for n in 1..upto.len() {
                let (lo, hi) = upto.split_at_mut(n);
                for (w, p) in hi[0].iter_mut().zip(&lo[n - 1]) {
                    *w |= p;
                }
            }
            let mut first = Vec::new();
            if t.slices.is_empty() {
                first = vec![vec![0u64; words]; 128];
                for (id, b) in tokens.iter().enumerate() {
                    if b.first().is_some_and(|&x| x < 128) && count(b).is_some() {
                        first[b[0] as usize][id / 64] |= 1 << (id % 64);
                    }
                }
            }
            t.slices.push(Slice {
                upto,
                rest: TokenTrie::plain(&rest),
                first,
            });
        }
        t
    }

    /// The trie alone, without slices.
    fn plain(tokens: &[Vec<u8>]) -> TokenTrie {
        // Build with sorted tokens: a node's children are contiguous in sorted order.
        let mut order: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&i| !tokens[i as usize].is_empty())
            .collect();
        order.sort_by(|&a, &b| tokens[a as usize].cmp(&tokens[b as usize]));
        // Pointer trie first, then flattened depth-first.
        let mut kids: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut ends: Vec<Vec<u32>> = vec![Vec::new()];
        for &id in &order {
            let mut node = 0usize;
            for &b in &tokens[id as usize] {
                node = match kids[node].last() {
                    Some(&(c, n)) if c == b => n as usize,
                    _ => {
                        let new = kids.len();
                        kids.push(Vec::new());
                        ends.push(Vec::new());
                        kids[node].push((b, new as u32));
                        new
                    }
                };
            }
            ends[node].push(id);
        }
        let mut t = TokenTrie {
            vocab_size: tokens.len(),
            ..TokenTrie::default()
        };
        // Renumber depth-first so a subtree is a contiguous range (iteratively).
        let mut new_id = vec![0u32; kids.len()];
        let mut order_dfs = Vec::with_capacity(kids.len());
        let mut stack = vec![0usize];
        while let Some(n) = stack.pop() {
            new_id[n] = order_dfs.len() as u32;
            order_dfs.push(n);
            for &(_, c) in kids[n].iter().rev() {
                stack.push(c as usize);
            }
        }
        for &n in &order_dfs {
            t.first_edge.push(t.edges.len() as u32);
            t.edges
                .extend(kids[n].iter().map(|&(b, c)| (b, new_id[c as usize])));
            t.first_end.push(t.end_ids.len() as u32);
            t.end_ids.extend_from_slice(&ends[n]);
        }
        t.first_edge.push(t.edges.len() as u32);
        t.first_end.push(t.end_ids.len() as u32);
        // Depths, then (children after parents in depth-first order) subtree ends and the
        // latest byte from which some token below is plain string content to its end.
        let n = order_dfs.len();
        let mut depth = vec![0usize; n];
        for node in 0..n {
            for &(_, c) in t.edges_of(node) {
                depth[c as usize] = depth[node] + 1;
            }
        }
        let mut plain_from: Vec<usize> = (0..n)
            .map(|node| {
                t.ends(node)
                    .iter()
                    .map(|&id| plain_suffix_start(&tokens[id as usize]))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        t.subtree_end = (1..=n as u32).collect();
        for node in (0..n).rev() {
            for i in t.first_edge[node] as usize..t.first_edge[node + 1] as usize {
                let c = t.edges[i].1 as usize;
                t.subtree_end[node] = t.subtree_end[node].max(t.subtree_end[c]);
                plain_from[node] = plain_from[node].max(plain_from[c]);
            }
        }
        t.plain_below = (0..n).map(|node| plain_from[node] <= depth[node]).collect();
        t
    }

    /// Number of token ids the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The longest token whose bytes are a prefix of `bytes`: (id, length). Among tokens
    /// with the same bytes, the lowest id.
    pub fn longest_prefix(&self, bytes: &[u8]) -> Option<(u32, usize)> {
        let mut node = 0usize;
        let mut best = None;
        for (i, &b) in bytes.iter().enumerate() {
            let Some(child) = self.child(node, b) else {
                break;
            };
            node = child;
            if let Some(&id) = self.ends(node).iter().min() {
                best = Some((id, i + 1));
            }
        }
        best
    }

    /// Greedy longest-match tokenization of `bytes`, stopping where no token fits.
    pub fn greedy_tokens(&self, mut bytes: &[u8]) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some((id, n)) = self.longest_prefix(bytes) {
            out.push(id);
            bytes = &bytes[n..];
        }
        out
    }

    /// The tokens whose bytes the grammar accepts from `m`'s state.
    ///
    /// Slices are tried widest first, each by its three shortcuts in turn: a slice with
    /// a wide class leaves only a few hundred tokens to walk, a narrow one tens of
    /// thousands, so a wide slice's costlier shortcut beats a narrow slice's cheap one.
    pub fn mask(&self, m: &Matcher, allowed: &mut TokenMask) {
        allowed.reset(self.vocab_size);
        m.grammar().with_stepper(m, |st, s| {
            st.begin_walk();
            if at_boundary(s) {
                let state = s as u32;
                for k in 0..self.slices.len() {
                    if self.by_chain(st, state, k, allowed)
                        || self.by_closed_alive(st, state, k, allowed)
                        || (k == 0 && self.by_except(st, state, allowed))
                    {
                        #[cfg(test)]
                        SLICED.with(|c| c.set(c.get() + 1));
                        return;
                    }
                }
            }
            self.walk(st, 0, s, allowed)
        });
    }

    /// Slice `k` when every character of its class leads from `s` to one same state,
    /// and again from there, for a known number of steps.
    fn by_chain(&self, st: &mut Stepper, s: u32, k: usize, allowed: &mut TokenMask) -> bool {
        let slice = &self.slices[k];
        let Some(n) = Self::chain(st, s, k, slice.upto.len() - 1) else {
            return false;
        };
        allowed.words.copy_from_slice(&slice.upto[n]);
        slice.rest.walk(st, 0, s as Cursor, allowed);
        true
    }

    /// Slice `k` when every token of it stays alive: from `s`, every character of the
    /// class leads to states that take every character of the class again (`.*id` before
    /// and after the `i`).
    fn by_closed_alive(&self, st: &mut Stepper, s: u32, k: usize, allowed: &mut TokenMask) -> bool {
        if !st.closed_alive(s, k) {
            return false;
        }
        let slice = &self.slices[k];
        allowed
            .words
            .copy_from_slice(&slice.upto[slice.upto.len() - 1]);
        slice.rest.walk(st, 0, s as Cursor, allowed);
        true
    }

    /// The first slice again, but for a few ASCII characters the state treats apart (a
    /// key that must not spell a declared name, `.*id` before the `i`): tokens starting
    /// with one of those are walked, the others decided by the chain.
    fn by_except(&self, st: &mut Stepper, s: u32, allowed: &mut TokenMask) -> bool {
        let (Some(slice), Some((xs, t))) = (self.slices.first(), st.except(s, 0)) else {
            return false;
        };
        let max = slice.upto.len() - 1;
        let n = match t {
            None => Some(0),
            Some(t) => Self::chain(st, t, 0, max).map(|m| (m + 1).min(max)),
        };
        let Some(n) = n else {
            return false;
        };
        allowed.words.copy_from_slice(&slice.upto[n]);
        for &x in &xs {
            for (w, f) in allowed.words.iter_mut().zip(&slice.first[x as usize]) {
                *w &= !f;
            }
        }
        slice.rest.walk(st, 0, s as Cursor, allowed);
        for &x in &xs {
            let Some(child) = self.child(0, x) else {
                continue;
            };
            if let Some(t) = st.step(s as Cursor, x) {
                self.ends(child).iter().for_each(|&id| allowed.set(id));
                self.walk(st, child, t, allowed);
            }
        }
        true
    }

    /// How many characters of slice class `k` can follow from `s` (at most `max`), when
    /// that is known exactly: each step's characters all lead to one same state.
    fn chain(st: &mut Stepper, s: u32, k: usize, max: usize) -> Option<usize> {
        let mut seen = [0u32; 64];
        let (mut cur, mut n) = (s, 0);
        while n < max {
            match st.uniform(cur, k) {
                Uniform::No => return None,
                Uniform::Dead => return Some(n),
                Uniform::To(t) => {
                    n += 1;
                    // Back to a state of the chain: it goes on for ever.
                    if t == s || seen[..(n - 1).min(64)].contains(&t) {
                        return Some(max);
                    }
                    if n - 1 < 64 {
                        seen[n - 1] = t;
                    }
                    cur = t;
                }
            }
        }
        Some(max)
    }

    /// [`TokenTrie::mask`] without the slice and subtree shortcuts: every byte of every
    /// token stepped (the reference the shortcuts are tested against).
    pub fn mask_walking_all(&self, m: &Matcher, allowed: &mut TokenMask) {
        allowed.reset(self.vocab_size);
        m.grammar()
            .with_stepper(m, |st, s| self.walk_all(st, 0, s, allowed));
    }

    /// Node `node`'s edges (byte, child), sorted by byte.
    fn edges_of(&self, node: usize) -> &[(u8, u32)] {
        &self.edges[self.first_edge[node] as usize..self.first_edge[node + 1] as usize]
    }

    /// The child of `node` along byte `b`.
    fn child(&self, node: usize, b: u8) -> Option<usize> {
        let edges = self.edges_of(node);
        let k = edges.binary_search_by_key(&b, |&(c, _)| c).ok()?;
        Some(edges[k].1 as usize)
    }

    /// The tokens whose bytes end at `node`.
    fn ends(&self, node: usize) -> &[u32] {
        &self.end_ids[self.first_end[node] as usize..self.first_end[node + 1] as usize]
    }

    /// Allows the tokens below `node` that `s` takes. A subtree of plain string content
    /// below a state that takes any such character and stays put is allowed whole.
    fn walk(&self, st: &mut Stepper, node: usize, s: Cursor, allowed: &mut TokenMask) {
        if st.is_cold(s) {
            return self.walk_cold_from(st, node, s as u32, allowed);
        }
        for &(byte, child) in self.edges_of(node) {
            #[cfg(test)]
            WALKED.with(|c| c.set(c.get() + 1));
            if let Some(t) = st.step(s, byte) {
                let child = child as usize;
                if self.plain_below[child] && st.loops_on_plain(t) {
                    self.allow_subtree(child, allowed);
                    continue;
                }
                self.ends(child).iter().for_each(|&id| allowed.set(id));
                self.walk(st, child, t, allowed);
            }
        }
    }

    /// Allows every token of `node`'s subtree.
    fn allow_subtree(&self, node: usize, allowed: &mut TokenMask) {
        let ids =
            self.first_end[node] as usize..self.first_end[self.subtree_end[node] as usize] as usize;
        self.end_ids[ids].iter().for_each(|&id| allowed.set(id));
    }

    /// [`TokenTrie::walk`] stepping every byte of every token (no shortcut).
    fn walk_all(&self, st: &mut Stepper, node: usize, s: Cursor, allowed: &mut TokenMask) {
        for &(byte, child) in self.edges_of(node) {
            #[cfg(test)]
            WALKED_ALL.with(|c| c.set(c.get() + 1));
            if let Some(t) = st.step(s, byte) {
                let child = child as usize;
                self.ends(child).iter().for_each(|&id| allowed.set(id));
                self.walk_all(st, child, t, allowed);
            }
        }
    }
}

/// Where the plain string content at the end of `token` begins: the smallest offset
/// from which the rest is whole characters of `SLICE_CLASSES[0]` (the length when the
/// last byte ends no such character).
fn plain_suffix_start(token: &[u8]) -> usize {
    let class = SLICE_CLASSES[0];
    let mut p = token.len();
    while p > 0 {
        // The character ending at p: back over up to three continuation bytes.
        let mut q = p - 1;
        while q > 0 && p - q < 4 && (0x80..0xC0).contains(&token[q]) {
            q -= 1;
        }
        let Ok(ch) = std::str::from_utf8(&token[q..p]) else {
            break;
        };
        let mut cs = ch.chars();
        match (cs.next(), cs.next()) {
            (Some(c), None) if class.iter().any(|&(a, b)| a <= c as u32 && c as u32 <= b) => p = q,
            _ => break,
        }
    }
    p
}

#[cfg(test)]
thread_local! {
    /// Masks that took the slice shortcut (tests check it is taken).
    static SLICED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Bytes the shortcut-taking walk stepped, and the reference walk (tests compare).
    static WALKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static WALKED_ALL: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
mod tests;
