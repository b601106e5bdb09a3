//! Token masks: which tokens of a vocabulary the grammar allows next. The tokens' byte
//! strings form a trie; one walk from the matcher's state visits each shared prefix once
//! (a token may span several grammar elements, or end inside a UTF-8 character).

use crate::matcher::{Matcher, Stepper};

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

/// The characters of JSON string content written plainly (no quote, backslash or control
/// character): tokens made only of them form the trie's one slice.
pub(crate) const STRING_CONTENT: &[(u32, u32)] = &[(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)];

/// A slice of the vocabulary: tokens made only of characters of a class (whole UTF-8
/// characters), and a trie of every other token. Where a grammar state loops on every
/// character of the class, all of the slice's tokens are allowed at once and only the rest
/// is walked.
#[derive(Clone, Debug, Default)]
struct Slice {
    members: Vec<u64>,
    rest: Box<TokenTrie>,
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
    vocab_size: usize,
    /// Tokens of plain JSON string content, when built with slices.
    slice: Option<Slice>,
}

impl TokenTrie {
    /// Builds the trie of `tokens[id]` (empty byte strings never match), with the
    /// string-content slice.
    pub fn new(tokens: &[Vec<u8>]) -> TokenTrie {
        let mut t = TokenTrie::plain(tokens);
        let in_class = |b: &[u8]| {
            !b.is_empty()
                && std::str::from_utf8(b).is_ok_and(|s| {
                    s.chars().all(|c| {
                        STRING_CONTENT
                            .iter()
                            .any(|&(x, y)| x <= c as u32 && c as u32 <= y)
                    })
                })
        };
        let mut members = vec![0u64; tokens.len().div_ceil(64)];
        let rest: Vec<Vec<u8>> = tokens
            .iter()
            .enumerate()
            .map(|(id, b)| {
                if in_class(b) {
                    members[id / 64] |= 1 << (id % 64);
                    Vec::new()
                } else {
                    b.clone()
                }
            })
            .collect();
        t.slice = Some(Slice {
            members,
            rest: Box::new(TokenTrie::plain(&rest)),
        });
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
            let (a, e) = (
                self.first_edge[node] as usize,
                self.first_edge[node + 1] as usize,
            );
            let edges = &self.edges[a..e];
            let Ok(k) = edges.binary_search_by_key(&b, |&(c, _)| c) else {
                break;
            };
            node = edges[k].1 as usize;
            let (x, y) = (
                self.first_end[node] as usize,
                self.first_end[node + 1] as usize,
            );
            if let Some(&id) = self.end_ids[x..y].iter().min() {
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
    pub fn mask(&self, m: &Matcher, allowed: &mut TokenMask) {
        allowed.reset(self.vocab_size);
        m.grammar().with_stepper(m, |st, s| match &self.slice {
            Some(slice) if st.loops_on(s, STRING_CONTENT) => {
                #[cfg(test)]
                SLICED.with(|c| c.set(c.get() + 1));
                allowed.words.copy_from_slice(&slice.members);
                slice.rest.walk(st, 0, s, allowed);
            }
            _ => self.walk(st, 0, s, allowed),
        });
    }

    /// [`TokenTrie::mask`] without the slice shortcut: every token walked (the reference
    /// the shortcut is tested against).
    pub fn mask_walking_all(&self, m: &Matcher, allowed: &mut TokenMask) {
        allowed.reset(self.vocab_size);
        m.grammar()
            .with_stepper(m, |st, s| self.walk(st, 0, s, allowed));
    }

    fn walk(&self, st: &mut Stepper, node: usize, s: u32, allowed: &mut TokenMask) {
        let (a, b) = (
            self.first_edge[node] as usize,
            self.first_edge[node + 1] as usize,
        );
        for &(byte, child) in &self.edges[a..b] {
            if let Some(t) = st.step(s, byte) {
                let child = child as usize;
                let (x, y) = (
                    self.first_end[child] as usize,
                    self.first_end[child + 1] as usize,
                );
                for &id in &self.end_ids[x..y] {
                    allowed.set(id);
                }
                self.walk(st, child, t, allowed);
            }
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Masks that took the slice shortcut (tests check it is taken).
    static SLICED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_shortcut_is_taken_inside_strings_and_agrees() {
        let g = Compiled::new(&parse(r#"root ::= "{\"k\": \"" [^"\\]* "\"}""#).unwrap());
        let vocab: Vec<Vec<u8>> = [
            "a", "bc", "é", "\"", "\"}", "x\"", "\\", "{", "{\"k", "\": \"", "\n",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .chain([vec![0xC3], vec![0xA9], vec![0x0A]])
        .collect();
        let trie = TokenTrie::new(&vocab);
        let (mut a, mut b) = (TokenMask::default(), TokenMask::default());
        let mut m = g.matcher();
        SLICED.with(|c| c.set(0));
        for prefix in ["{\"k\": \"", "ab", "\u{e9}", "x"] {
            assert!(m.accept_bytes(prefix.as_bytes()));
            trie.mask(&m, &mut a);
            trie.mask_walking_all(&m, &mut b);
            assert_eq!(a, b, "{prefix}");
            assert!(a.is_allowed(0) && a.is_allowed(4) && !a.is_allowed(6) && a.is_allowed(7));
            assert!(
                !a.is_allowed(8) && a.is_allowed(11) && !a.is_allowed(12),
                "{prefix}"
            );
        }
        assert_eq!(SLICED.with(|c| c.get()), 4);
    }
    use crate::{parse, Compiled};

    #[test]
    fn masks_equal_feeding_each_token_alone() {
        let g = Compiled::new(&parse(r#"root ::= "{\"a\":" [0-9]+ "}" | "é!""#).unwrap());
        let vocab: Vec<Vec<u8>> = [
            "{", "{\"", "\"a", "\":", "1", "12", "9}", "}", "x", "é", "\u{e9}!", "!", "",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .chain([vec![0xC3], vec![0xA9, b'!']]) // é split across two tokens
        .collect();
        let trie = TokenTrie::new(&vocab);
        let mut allowed = TokenMask::default();
        for prefix in ["", "{", "{\"a\":", "{\"a\":1", "{\"a\":12}", "\u{e9}"] {
            let mut m = g.matcher();
            assert!(m.accept_bytes(prefix.as_bytes()), "{prefix}");
            trie.mask(&m, &mut allowed);
            for (id, bytes) in vocab.iter().enumerate() {
                let mut alone = m.clone();
                let want = !bytes.is_empty() && alone.accept_bytes(bytes);
                assert_eq!(
                    allowed.is_allowed(id as u32),
                    want,
                    "prefix {prefix:?}, token {:?}",
                    String::from_utf8_lossy(bytes)
                );
            }
        }
        // Half of a character is allowed where the whole one is.
        let m = g.matcher();
        trie.mask(&m, &mut allowed);
        assert!(allowed.is_allowed(vocab.len() as u32 - 2));
    }
}
