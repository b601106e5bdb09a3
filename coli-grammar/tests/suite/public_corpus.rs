//! The committed sample of the public real-world corpus (`corpus-public/sample.jsonl`,
//! picked by `bench/grammar/realworld/sample.py` from schemas of Kubernetes, GitHub's REST
//! API and webhooks, and the Berkeley function-calling sets; instances from
//! hypothesis-jsonschema and mutations of them, labelled by Python's `jsonschema`).
//!
//! Each label is re-checked with the `jsonschema` crate, and instances the two validators
//! disagree on are left out (few: Python checks no `uri` format without an extra
//! package). Then, against issue 17's targets: every schema compiles (or is refused with
//! a named keyword: at most 2%), at least 99.5% of valid instances are accepted, and no
//! invalid instance is.

use coli_grammar::schema::jsonschema_validator;
use coli_grammar::{compile_schema, Compiled, Matcher};
use serde_json::Value;

#[test]
fn public_corpus_sample_meets_the_targets() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus-public/sample.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let (mut schemas, mut compiled) = (0, 0);
    let (mut valid, mut valid_ok, mut invalid, mut disagreements) = (0, 0, 0, 0);
    let mut rejected = Vec::new();
    for line in text.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let name = row["name"].as_str().unwrap();
        let schema = &row["schema"];
        schemas += 1;
        let Ok(v) = jsonschema_validator(schema, None, true) else {
            continue;
        };
        let g = match compile_schema(&schema.to_string()) {
            Ok(g) => g,
            Err(e) => {
                assert!(!e.keyword.is_empty(), "{name}: {e}");
                continue;
            }
        };
        compiled += 1;
        let c = Compiled::new(&g);
        for (key, label) in [("valid", true), ("invalid", false)] {
            for inst in row[key].as_array().unwrap() {
                if v.is_valid(inst) != label {
                    disagreements += 1;
                    continue;
                }
                let t = inst.to_string();
                let took = Matcher::matches(&c, &t);
                if label {
                    valid += 1;
                    valid_ok += took as usize;
                    if !took {
                        rejected.push(format!("{name}: {t}"));
                    }
                } else {
                    invalid += 1;
                    assert!(!took, "{name}: accepted the invalid {t}");
                }
            }
        }
    }
    eprintln!(
        "{schemas} schemas, {compiled} compiled; valid {valid_ok}/{valid}; invalid rejected {invalid}; {disagreements} label disagreements"
    );
    assert!(schemas >= 100 && valid >= 300 && invalid >= 300);
    assert!(compiled * 100 >= schemas * 98, "{compiled} of {schemas}");
    assert!(
        valid_ok * 1000 >= valid * 995,
        "{valid_ok} of {valid} valid accepted; refused: {rejected:#?}"
    );
    assert!(disagreements * 20 <= valid + invalid, "{disagreements}");
}

/// The mask shortcuts against walking every token, on the sample's first schemas (the
/// big objects of real APIs, whose keys exercise the slice order).
#[test]
fn public_corpus_masks_equal_walking_every_token() {
    use coli_grammar::{TokenMask, TokenTrie};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus-public/sample.jsonl");
    let rows: Vec<Value> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Every other schema (all sources), the first valid instance, at most 1,200 bytes.
    let cases: Vec<(&Value, String)> = rows
        .iter()
        .step_by(2)
        .filter_map(|r| {
            let t = r["valid"].get(0)?.to_string();
            (t.len() <= 1200).then_some((r, t))
        })
        .collect();
    let texts: Vec<String> = cases.iter().map(|c| c.1.clone()).collect();
    let vocab = coli_grammar::corpus::vocab_from(&texts);
    let trie = TokenTrie::new(&vocab);
    let (mut fast, mut slow) = (TokenMask::default(), TokenMask::default());
    let mut checked = 0;
    for (row, text) in &cases {
        let Ok(g) = compile_schema(&row["schema"].to_string()) else {
            continue;
        };
        let c = Compiled::new(&g);
        let mut m = c.matcher();
        for (i, b) in text.bytes().enumerate() {
            if i % 2 == 0 {
                trie.mask(&m, &mut fast);
                trie.mask_walking_all(&m, &mut slow);
                assert_eq!(fast, slow, "{} at byte {i} of {text}", row["name"]);
                checked += 1;
            }
            if !m.accept_bytes(&[b]) {
                break;
            }
        }
    }
    assert!(checked > 2000, "{checked}");
}
