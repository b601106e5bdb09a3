//! Token masks against walking every token, the shortcuts' savings and cold walks.

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

/// A vocabulary like a real one in the parts that matter here: words with and without
/// a leading space, capitalised, with underscores and digits, some with a quote, a
/// backslash, a newline or a split multi-byte character.
fn wordy_vocab(n: usize) -> Vec<Vec<u8>> {
    let mut x = 0x2545_f491_u64;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let mut v: Vec<Vec<u8>> = (0..128u8).map(|b| vec![b]).collect();
    while v.len() < n {
        let len = 1 + next(9) as usize;
        let mut w: Vec<u8> = (0..len).map(|_| b'a' + next(26) as u8).collect();
        match next(400) {
            0 => w.insert(0, b' '),
            1 => w[0] = w[0].to_ascii_uppercase(),
            2 => w.push(b'_'),
            3 => w.push(b'"'),
            4 => w.extend_from_slice(b"\\n"),
            5 => w.push(b'\n'),
            6 => w.extend_from_slice("é".as_bytes()),
            7 => w.push(0xC3),
            8 => w.extend_from_slice(b"\":"),
            _ => {}
        }
        v.push(w);
    }
    v
}

/// Bytes stepped by [`TokenTrie::mask`] and by walking every token from `prefix`,
/// after checking the two masks are equal.
fn walked(trie: &TokenTrie, g: &Compiled, prefix: &str) -> (usize, usize) {
    let mut m = g.matcher();
    assert!(m.accept_bytes(prefix.as_bytes()), "{prefix}");
    let (mut fast, mut all) = (TokenMask::default(), TokenMask::default());
    WALKED.with(|c| c.set(0));
    WALKED_ALL.with(|c| c.set(0));
    trie.mask(&m, &mut fast);
    trie.mask_walking_all(&m, &mut all);
    assert_eq!(fast, all, "{prefix}");
    (WALKED.with(|c| c.get()), WALKED_ALL.with(|c| c.get()))
}

#[test]
fn a_key_of_a_large_open_object_is_masked_without_walking_the_vocabulary() {
    // 40 declared names with many first letters, any other key allowed: the first
    // letters of the names are stepped, every other token decided in bulk, and the
    // subtrees below the names' letters are cut where they leave the names.
    let vocab = wordy_vocab(20_000);
    let trie = TokenTrie::new(&vocab);
    let words = [
        "id",
        "node",
        "url",
        "html",
        "name",
        "full",
        "owner",
        "private",
        "description",
        "fork",
        "created",
        "updated",
        "pushed",
        "git",
        "ssh",
        "clone",
        "svn",
        "homepage",
        "size",
        "stars",
        "watchers",
        "language",
        "has",
        "issues",
        "projects",
        "wiki",
        "pages",
        "forks",
        "mirror",
        "archived",
        "disabled",
        "open",
        "license",
        "topics",
        "visibility",
        "default",
        "branch",
        "permissions",
        "allow",
        "merge",
    ];
    let props: serde_json::Map<String, serde_json::Value> = words
        .iter()
        .map(|w| (w.to_string(), serde_json::json!({"type": "integer"})))
        .collect();
    let schema = serde_json::json!({"type": "object", "properties": props});
    let g = Compiled::new(&crate::compile_schema(&schema.to_string()).unwrap());
    // Inside a name (`fo`), only the names' next letters are told apart: the rest of
    // the vocabulary is decided by the chain from the state after any other letter.
    for (prefix, factor) in [("{\"", 8), ("{\"id\":1,\"", 8), ("{\"fo", 20)] {
        let (n, all) = walked(&trie, &g, prefix);
        assert!(
            n * factor < all,
            "{prefix}: {n} bytes stepped, {all} walking all"
        );
    }
    // Past its budget (96 fresh steps), the first key's walk makes no more states:
    // the automaton keeps under 3/5 of the states a walk that is never cold makes
    // (99 of 188 when written).
    let states = |budget: Option<usize>| {
        let c = Compiled::new(&crate::compile_schema(&schema.to_string()).unwrap());
        if let Some(b) = budget {
            c.cold_budget(b);
        }
        let mut m = c.matcher();
        assert!(m.accept_bytes(b"{\""));
        trie.mask(&m, &mut TokenMask::default());
        c.automaton_size().0
    };
    let (cold, warm) = (states(None), states(Some(usize::MAX)));
    assert!(
        cold * 5 < warm * 3,
        "{cold} states with a budget, {warm} without"
    );
    // Inside a string whose pattern is unanchored, every word stays alive.
    let g =
        Compiled::new(&crate::compile_schema(r#"{"type": "string", "pattern": "id"}"#).unwrap());
    for prefix in ["\"", "\"xy", "\"xid"] {
        let (n, all) = walked(&trie, &g, prefix);
        assert!(
            n * 8 < all,
            "{prefix}: {n} bytes stepped, {all} walking all"
        );
    }
}

#[test]
fn cold_walks_give_the_masks_of_walking_all() {
    // Strings of a fixed length (plain characters that lead on, not back), a string
    // that takes any plain character for ever, names beside other keys, non-ASCII
    // bytes inside a cold walk, and a repetition (several stacks per node).
    let grammars = [
        r#"root ::= "\"" [^"\\] [^"\\] [^"\\]? "\"""#,
        r#"root ::= "\"" [^"\\]* "\"" | "\"ab" [a-z] "\"""#,
        r#"root ::= "{\"" ( "fork" | "forkee" | "full_name" | "é" [a-z]+ | [^"\\f]+ ) "\":1}""#,
        r#"root ::= "[" ( "ab" | "a" | "b" | "\u00e9" )* "]""#,
        r#"root ::= "{\"" ( "ab" [^"\\] [^"\\] | "cd" [^"\\]* ) "\"}""#,
        r#"root ::= "{\"" ( "a" [é-ë] [a-z]? | "ab" ) "\"}""#,
    ];
    let mut vocab = wordy_vocab(3000);
    for w in [
        "\"ab", "\"abc", "\"xyz", "fork", "forkee\"", "ée", "é", "abab", "abxyz", "abxy", "aé",
        "aéb", "aéb\"", "aê\"", "aëbc",
    ] {
        vocab.push(w.as_bytes().to_vec());
    }
    let trie = TokenTrie::new(&vocab);
    for src in grammars {
        let g = parse(src).unwrap();
        for budget in [0, 1, 3, usize::MAX] {
            let c = Compiled::new(&g);
            c.cold_budget(budget);
            for prefix in ["", "\"", "\"a", "\"ab", "{\"", "{\"f", "{\"é", "[", "[ab"] {
                let mut m = c.matcher();
                if !m.accept_bytes(prefix.as_bytes()) {
                    continue;
                }
                let (mut fast, mut all) = (TokenMask::default(), TokenMask::default());
                trie.mask(&m, &mut fast);
                trie.mask_walking_all(&m, &mut all);
                assert_eq!(fast, all, "{src} after {prefix:?}, budget {budget}");
            }
        }
    }
}

#[test]
fn plain_suffixes_start_where_the_definition_says() {
    let class = SLICE_CLASSES[0];
    let plain = |b: &[u8]| {
        std::str::from_utf8(b).is_ok_and(|s| {
            s.chars()
                .all(|c| class.iter().any(|&(a, z)| a <= c as u32 && c as u32 <= z))
        })
    };
    let vocab = wordy_vocab(3000);
    let extra: Vec<Vec<u8>> = [
        &b""[..],
        b"\"",
        b"a\"b",
        "\u{1F600}x".as_bytes(),
        "x\u{1F600}".as_bytes(),
        &[0xF0, 0x9F, 0x98],
        &[b'a', 0x98, 0x80],
        &[0xE2, 0x82, 0xAC, b'\n'],
        "\u{7f}".as_bytes(),
    ]
    .iter()
    .map(|b| b.to_vec())
    .collect();
    for t in vocab.iter().chain(&extra) {
        let p = plain_suffix_start(t);
        // The smallest offset whose rest is whole plain characters.
        let want = (0..=t.len()).find(|&q| plain(&t[q..])).unwrap();
        assert_eq!(p, want, "{t:?}");
    }
}

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
