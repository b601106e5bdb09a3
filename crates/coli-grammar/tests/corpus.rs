//! The schema corpus (crates/coli-grammar/corpus): every schema converts; its valid
//! instances (checked valid by the independent `jsonschema` validator) are accepted byte by
//! byte, compact and pretty-printed; its invalid ones (checked invalid by the validator) are
//! rejected.

use coli_grammar::{compile_schema, Compiled, Matcher};
use serde_json::Value;
use std::path::PathBuf;

/// The corpus: (file name, schema, valid instances, invalid instances).
pub fn corpus() -> Vec<(String, Value, Vec<Value>, Vec<Value>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let list = |k: &str| v[k].as_array().unwrap().clone();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                v["schema"].clone(),
                list("valid"),
                list("invalid"),
            )
        })
        .collect()
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .expect("the validator takes the schema")
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
