//! Token masks: which tokens of a vocabulary the grammar allows next. The tokens' byte
//! strings form a trie; one walk from the matcher's state visits each shared prefix once
//! (a token may span several grammar elements, or end inside a UTF-8 character).

use crate::matcher::Matcher;

/// A trie of the vocabulary's byte strings.
#[derive(Clone, Debug, Default)]
pub struct TokenTrie {
    /// Per node: children as (byte, node), sorted by byte.
    children: Vec<Vec<(u8, u32)>>,
    /// Per node: the token ids whose bytes end here.
    ends: Vec<Vec<u32>>,
    vocab_size: usize,
}

impl TokenTrie {
    /// Builds the trie of `tokens[id]` (empty byte strings never match).
    pub fn new(tokens: &[Vec<u8>]) -> TokenTrie {
        let mut t = TokenTrie {
            children: vec![Vec::new()],
            ends: vec![Vec::new()],
            vocab_size: tokens.len(),
        };
        for (id, bytes) in tokens.iter().enumerate() {
            if bytes.is_empty() {
                continue;
            }
            let mut node = 0usize;
            for &b in bytes {
                node = match t.children[node].binary_search_by_key(&b, |&(c, _)| c) {
                    Ok(i) => t.children[node][i].1 as usize,
                    Err(i) => {
                        let new = t.children.len();
                        t.children.push(Vec::new());
                        t.ends.push(Vec::new());
                        t.children[node].insert(i, (b, new as u32));
                        new
                    }
                };
            }
            t.ends[node].push(id as u32);
        }
        t
    }

    /// `allowed[id]` = the grammar accepts token `id`'s bytes from `m`'s state.
    pub fn mask(&self, m: &Matcher, allowed: &mut Vec<bool>) {
        allowed.clear();
        allowed.resize(self.vocab_size, false);
        self.walk(0, m, allowed);
    }

    fn walk(&self, node: usize, m: &Matcher, allowed: &mut [bool]) {
        for &(b, child) in &self.children[node] {
            let mut next = m.clone();
            if next.accept_bytes(&[b]) {
                for &id in &self.ends[child as usize] {
                    allowed[id as usize] = true;
                }
                self.walk(child as usize, &next, allowed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let mut allowed = Vec::new();
        for prefix in ["", "{", "{\"a\":", "{\"a\":1", "{\"a\":12}", "\u{e9}"] {
            let mut m = g.matcher();
            assert!(m.accept_bytes(prefix.as_bytes()), "{prefix}");
            trie.mask(&m, &mut allowed);
            for (id, bytes) in vocab.iter().enumerate() {
                let mut alone = m.clone();
                let want = !bytes.is_empty() && alone.accept_bytes(bytes);
                assert_eq!(
                    allowed[id],
                    want,
                    "prefix {prefix:?}, token {:?}",
                    String::from_utf8_lossy(bytes)
                );
            }
        }
        // Half of a character is allowed where the whole one is.
        let m = g.matcher();
        trie.mask(&m, &mut allowed);
        assert!(allowed[vocab.len() - 2]);
    }
}
