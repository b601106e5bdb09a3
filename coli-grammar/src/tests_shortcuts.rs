//! The automaton's shortcuts against its reference stepping: the same masks, the same
//! accepted bytes and the same matcher states, byte for byte, with the shortcuts on (as
//! shipped, and with every mask's walk cold past its first fresh step) and off ([`Compiled::reference_stepping`]: every state's stacks concrete and
//! stepped on their own rather than relative to their anchors, every non-ASCII character
//! stepped through the stacks, every unfinished character a node of the automaton).

use crate::corpus::{corpus_in, vocab_from};
use crate::{compile_schema, parse, Compiled, Matcher, TokenMask, TokenTrie};

/// Texts with the characters the shortcuts are about: non-ASCII of every UTF-8 length,
/// in keys and values, next to quotes and escapes.
const EXTRA: &[&str] = &[
    "{\"é\":\"ü\",\"名前\":\"太郎\",\"x\u{1F600}\":\"\u{10FFFF}\"}",
    "{\"id\":\"\u{e9}t\u{e9}\",\"n\u{00A0}\":1,\"\u{7FF}\u{800}\":\"\u{FFFD}\"}",
    "\"\u{D7FF}\u{E000}\\u00e9\u{1F600}a\"",
];

/// Feeds `text` to a matcher of each grammar in greedy tokens of `trie`, comparing the
/// masks before every token, and then each byte's acceptance and the states.
fn agree(fast: &Compiled, slow: &Compiled, trie: &TokenTrie, text: &[u8], what: &str) {
    let (mut a, mut b) = (fast.matcher(), slow.matcher());
    let (mut ma, mut mb) = (TokenMask::default(), TokenMask::default());
    let mut rest = text;
    loop {
        trie.mask(&a, &mut ma);
        trie.mask(&b, &mut mb);
        assert_eq!(
            ma,
            mb,
            "{what}: mask before {:?}",
            String::from_utf8_lossy(rest)
        );
        let Some((_, n)) = trie.longest_prefix(rest) else {
            break;
        };
        for &byte in &rest[..n] {
            let (x, y) = (a.accept_bytes(&[byte]), b.accept_bytes(&[byte]));
            assert_eq!(x, y, "{what}: byte {byte:#x} before {:?}", rest);
            assert_eq!(a.state(), b.state(), "{what}");
        }
        rest = &rest[n..];
    }
    assert_eq!(a.is_complete(), b.is_complete(), "{what}");
}

/// Texts to feed: each valid instance, and the same with non-ASCII characters written
/// into it (valid or not, the two must agree).
fn texts(valid: &[String]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for t in valid.iter().chain(
        EXTRA
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .iter(),
    ) {
        out.push(t.as_bytes().to_vec());
        for (k, ins) in ["é", "\u{1F600}", "中"].iter().enumerate() {
            let at = t
                .char_indices()
                .map(|(i, _)| i)
                .nth(1 + k * 3)
                .unwrap_or(t.len());
            let mut s = t.clone();
            s.insert_str(at, ins);
            out.push(s.into_bytes());
        }
        // A character cut short, then ASCII.
        let mut cut = t.as_bytes()[..t.len().min(3)].to_vec();
        cut.extend_from_slice(&[0xE4, 0xB8, b'a']);
        out.push(cut);
    }
    out
}

#[test]
fn shortcuts_give_the_reference_masks_and_states_on_the_corpora() {
    let mut schemas = corpus_in(&crate::corpus::corpus_dir()).unwrap();
    schemas.extend(corpus_in(&crate::corpus::realworld_dir()).unwrap());
    let mut checked = 0;
    for s in &schemas {
        let Ok(grammar) = compile_schema(&s.schema.to_string()) else {
            continue;
        };
        let valid: Vec<String> = s
            .valid
            .iter()
            .map(|v| v.to_string())
            .chain(s.valid_texts.iter().cloned())
            .take(3)
            .collect();
        let all: Vec<String> = valid
            .iter()
            .cloned()
            .chain(EXTRA.iter().map(|x| x.to_string()))
            .collect();
        let trie = TokenTrie::new(&vocab_from(&all));
        let (fast, slow) = (Compiled::new(&grammar), Compiled::new(&grammar));
        slow.reference_stepping();
        // Every mask's walk cold past its first fresh step.
        let cold = Compiled::new(&grammar);
        cold.cold_budget(1);
        for t in texts(&valid) {
            agree(&fast, &slow, &trie, &t, &s.name);
            agree(&cold, &slow, &trie, &t, &s.name);
            checked += 1;
        }
    }
    assert!(checked > 200, "{checked} texts");
}

proptest::proptest! {
    /// Any text over characters of every UTF-8 length, fed byte by byte: the same bytes
    /// accepted and the same states, with and without the shortcuts.
    #[test]
    fn shortcuts_accept_the_reference_bytes(
        text in proptest::collection::vec(
            proptest::sample::select(vec!["\"", "a", "b", ":", "{", "}", ",", "é", "\u{7FF}",
                "\u{800}", "中", "\u{FFFF}", "\u{1F600}", "\u{10FFFF}", "\\", "u"]),
            0..24,
        ),
        cut in 0usize..4,
    ) {
        let grammars = [
            r#"root ::= "{" ( "\"" ( "ab" | "a:" | [^"\\a] [^"\\]* ) "\"" ":" "\"" [^"\\]* "\"" )? "}""#,
            r#"root ::= "\"" ( [^"\\\x7F-\U0010FFFF] | [^"\\\x00-\x7F] "b" )* "\"""#,
        ];
        let mut bytes = text.concat().into_bytes();
        // Sometimes end inside a character.
        if cut > 0 && bytes.last().is_some_and(|&b| b >= 0x80) {
            bytes.truncate(bytes.len().saturating_sub(cut.min(1)));
        }
        for src in grammars {
            let g = parse(src).unwrap();
            let (fast, slow) = (Compiled::new(&g), Compiled::new(&g));
            slow.reference_stepping();
            let (mut a, mut b) = (fast.matcher(), slow.matcher());
            for &byte in &bytes {
                proptest::prop_assert_eq!(a.accept_bytes(&[byte]), b.accept_bytes(&[byte]));
                proptest::prop_assert_eq!(a.state(), b.state());
            }
            proptest::prop_assert_eq!(
                Matcher::matches(&fast, std::str::from_utf8(&bytes).unwrap_or("\u{0}")),
                Matcher::matches(&slow, std::str::from_utf8(&bytes).unwrap_or("\u{0}"))
            );
        }
    }
}
