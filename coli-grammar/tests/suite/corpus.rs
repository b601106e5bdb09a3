//! The schema corpus (coli-grammar/corpus): every schema converts; its valid
//! instances (checked valid by the independent `jsonschema` validator) are accepted byte by
//! byte, compact and pretty-printed; its invalid ones (checked invalid by the validator) are
//! rejected.

use coli_grammar::schema::jsonschema_validator;
use coli_grammar::{compile_schema, Compiled, Matcher};
use serde_json::Value;

/// The corpus as (name, schema, valid instances, invalid instances).
fn corpus() -> Vec<(String, Value, Vec<Value>, Vec<Value>)> {
    coli_grammar::corpus::corpus()
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.schema, c.valid, c.invalid))
        .collect()
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema_validator(schema, None, true).expect("the validator takes the schema")
}

#[test]
fn corpus_has_at_least_40_schemas() {
    assert!(corpus().len() >= 40);
}

#[test]
fn valid_instances_are_accepted_byte_by_byte() {
    for (name, schema, valid, _) in corpus() {
        let g = compile_schema(&schema.to_string()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let c = Compiled::new(&g);
        let v = validator(&schema);
        for inst in &valid {
            assert!(
                v.is_valid(inst),
                "{name}: corpus instance {inst} is not valid"
            );
            for text in [
                serde_json::to_string(inst).unwrap(),
                serde_json::to_string_pretty(inst).unwrap(),
            ] {
                let mut m = c.matcher();
                for (i, b) in text.bytes().enumerate() {
                    assert!(
                        m.accept_bytes(&[b]),
                        "{name}: refused byte {i} ({:?}) of {text}",
                        b as char
                    );
                }
                assert!(m.is_complete(), "{name}: {text} accepted but not complete");
            }
        }
    }
}

#[test]
fn invalid_instances_are_rejected() {
    for (name, schema, _, invalid) in corpus() {
        let c = Compiled::new(&compile_schema(&schema.to_string()).unwrap());
        let v = validator(&schema);
        for inst in &invalid {
            assert!(!v.is_valid(inst), "{name}: corpus instance {inst} is valid");
            for text in [
                serde_json::to_string(inst).unwrap(),
                serde_json::to_string_pretty(inst).unwrap(),
            ] {
                assert!(!Matcher::matches(&c, &text), "{name}: accepted {text}");
            }
        }
    }
}

#[test]
fn masks_with_the_slice_shortcut_equal_walking_every_token() {
    use coli_grammar::{TokenMask, TokenTrie};
    let cases = corpus();
    let texts: Vec<String> = cases
        .iter()
        .flat_map(|(_, _, valid, _)| {
            valid.iter().flat_map(|v| {
                [
                    serde_json::to_string(v).unwrap(),
                    serde_json::to_string_pretty(v).unwrap(),
                ]
            })
        })
        .collect();
    let vocab = coli_grammar::corpus::vocab_from(&texts);
    let trie = TokenTrie::new(&vocab);
    let (mut fast, mut slow) = (TokenMask::default(), TokenMask::default());
    let mut checked = 0;
    for (name, schema, valid, _) in &cases {
        let c = Compiled::new(&compile_schema(&schema.to_string()).unwrap());
        for v in valid {
            let text = serde_json::to_string_pretty(v).unwrap();
            let mut m = c.matcher();
            for (i, b) in text.bytes().enumerate() {
                trie.mask(&m, &mut fast);
                trie.mask_walking_all(&m, &mut slow);
                assert_eq!(fast, slow, "{name} at byte {i} of {text}");
                if i % 7 == 0 {
                    // Against feeding each token alone.
                    for (id, bytes) in vocab.iter().enumerate() {
                        let mut alone = m.clone();
                        let want = !bytes.is_empty() && alone.accept_bytes(bytes);
                        assert_eq!(
                            fast.is_allowed(id as u32),
                            want,
                            "{name} byte {i} token {bytes:?}"
                        );
                    }
                }
                checked += 1;
                assert!(m.accept_bytes(&[b]));
            }
        }
    }
    assert!(checked > 1000);
}

/// Character classes that stop one short of a slice class's edge (`[a-y]` inside `[a-z]`,
/// `[0-8]`, `[B-Z]`, a string body without `~`…): the shortcut must not take the class as
/// covered. Every mask equals feeding each token alone, before and after a first character.
#[test]
fn classes_one_short_of_a_slice_class_are_not_taken_as_covering_it() {
    let mut vocab: Vec<Vec<u8>> = (0x20u8..0x7F).map(|c| vec![c]).collect();
    for w in [
        "az", "za", "zz", "ay", "09", "90", "AZ", "ZA", "BZ", "a~", "~~", "ab", "yy", "am", "ma",
    ] {
        vocab.push(w.as_bytes().to_vec());
    }
    for src in [
        r#"root ::= [a-y]+ "!""#,
        r#"root ::= [b-z]+ "!""#,
        r#"root ::= [0-8a-z]+ "!""#,
        r#"root ::= [0-9a-y]+ "!""#,
        r#"root ::= [A-Ya-z]+ "!""#,
        r#"root ::= [0-9A-Za-y]+ "!""#,
        r#"root ::= "\"" [ !#-\[\]-}]* "\"""#,
        // A gap inside the class (no `m`), and a class that does not loop.
        r#"root ::= [a-ln-z]+ "!""#,
        r#"root ::= [a-z] "!""#,
    ] {
        masks_equal_feeding_each_token(src, &vocab, &["", "b", "0", "B", "\""]);
    }
}

/// States where the mask's slice shortcuts must look past the first step: a class whose
/// ranges start before a slice class and leave a gap in it (`[Z-ln-z]`, no `m`); a state
/// whose characters lead to a loop and, for one character, to a state that takes only
/// letters (the shortcut must check where every character leads, not only the first
/// state); a state that treats the space apart, where the other characters lead to a loop
/// and the space to a state that takes one more character; the narrower slices, asked
/// where a non-ASCII character makes the first decline. Every mask equals feeding each
/// token alone, before and after each prefix.
#[test]
fn shortcuts_follow_every_state_a_class_reaches() {
    let mut vocab: Vec<Vec<u8>> = (0x20u8..0x7F).map(|c| vec![c]).collect();
    for w in [
        "x ", "x!", "xa", "xab", "abc", "a b", " a", " ab", "  ", "mm", "ab", "Zm", "am", "ma",
        "Zl", "0a", "a0", "abcdef", "a\"", "é", "aé", "z", "zz", "az", "A", "Ab", "09",
    ] {
        vocab.push(w.as_bytes().to_vec());
    }
    for src in [
        r#"root ::= [Z-ln-zé]+ "!""#,
        r#"root ::= [Z-ln-z]+ "!""#,
        // With `é` in the class, the plain-content slice declines and the narrower
        // slices are asked: a gap (no `m`), a class one short of `[a-z]`.
        r#"root ::= [a-ln-zé]+ "!""#,
        r#"root ::= [a-yé]+ "!""#,
        // Letters and the space lead to loops over letters and digits, digits and
        // capitals are refused: the alphanumeric slice's representative must be one of
        // its own characters, not the space.
        r#"root ::= [a-z] [0-9A-Za-z]* "!" | " " [0-9A-Za-z]* "!" | "é" "!""#,
        r#"root ::= "\"" ( "x" [a-z]* | [^"\\x] [^"\\]* ) "\"""#,
        r#"root ::= "\"" ( " " [^"\\]? | [^"\\ ] [^"\\]* ) "\"""#,
    ] {
        masks_equal_feeding_each_token(src, &vocab, &["", "Z", "a", "\"", "\"x", "\" ", "\"a"]);
    }
}

/// Under GBNF `src`, after each prefix it accepts, the mask allows exactly the tokens of
/// `vocab` that the matcher takes when fed alone.
fn masks_equal_feeding_each_token(src: &str, vocab: &[Vec<u8>], prefixes: &[&str]) {
    use coli_grammar::{gbnf, TokenMask, TokenTrie};
    let trie = TokenTrie::new(vocab);
    let mut mask = TokenMask::default();
    let c = Compiled::new(&gbnf::parse(src).unwrap());
    for prefix in prefixes {
        let mut m = c.matcher();
        if !m.accept_bytes(prefix.as_bytes()) {
            continue;
        }
        trie.mask(&m, &mut mask);
        for (id, bytes) in vocab.iter().enumerate() {
            let want = m.clone().accept_bytes(bytes);
            assert_eq!(
                mask.is_allowed(id as u32),
                want,
                "{src} after {prefix:?}: token {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}
