//! The real-world-shaped corpus (coli-grammar/corpus-realworld: Kubernetes, SchemaStore,
//! OpenAPI, GitHub workflows, function calling…): every schema converts; every instance's
//! label agrees with the independent validator (the `jsonschema` crate); valid instances —
//! compact, pretty, and as written in `valid_texts` — are accepted byte by byte and by
//! `Matcher::matches`; invalid ones are rejected (by the grammar or, where it is relaxed,
//! by the validation of the finished text).

use coli_grammar::corpus::{corpus_in, realworld_dir};
use coli_grammar::schema::jsonschema_validator;
use coli_grammar::{compile_schema, Compiled, Matcher};

#[test]
fn realworld_corpus_valid_accepted_invalid_rejected() {
    let corpus = corpus_in(&realworld_dir()).unwrap();
    assert!(corpus.len() >= 20);
    let (mut valid, mut invalid, mut relaxed, mut warned) = (0, 0, 0, 0);
    for c in &corpus {
        let g = compile_schema(&c.schema.to_string()).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let compiled = Compiled::new(&g);
        relaxed += !compiled.relaxations().is_empty() as usize;
        warned += !compiled.warnings().is_empty() as usize;
        // The draft named by $schema (else 2020-12); OpenAPI-style draft-4 booleans need 4.
        let build = |d| jsonschema_validator(&c.schema, d, true);
        let v = build(None)
            .or_else(|_| build(Some(jsonschema::Draft::Draft4)))
            .unwrap();
        let mut texts = Vec::new();
        for inst in &c.valid {
            assert!(
                v.is_valid(inst),
                "{}: labelled valid but is not: {inst}",
                c.name
            );
            texts.push(serde_json::to_string(inst).unwrap());
            texts.push(serde_json::to_string_pretty(inst).unwrap());
        }
        for t in &c.valid_texts {
            let inst: serde_json::Value = serde_json::from_str(t).unwrap();
            assert!(
                v.is_valid(&inst),
                "{}: labelled valid but is not: {t}",
                c.name
            );
            texts.push(t.clone());
        }
        for t in &texts {
            let mut m = compiled.matcher();
            for (i, b) in t.bytes().enumerate() {
                assert!(m.accept_bytes(&[b]), "{}: refused byte {i} of {t}", c.name);
            }
            assert!(m.is_complete(), "{}: {t} not complete", c.name);
            assert!(
                Matcher::matches(&compiled, t),
                "{}: {t} refused: {:?}",
                c.name,
                compiled.check_complete(t)
            );
            valid += 1;
        }
        for inst in &c.invalid {
            assert!(
                !v.is_valid(inst),
                "{}: labelled invalid but is valid: {inst}",
                c.name
            );
            for t in [
                serde_json::to_string(inst).unwrap(),
                serde_json::to_string_pretty(inst).unwrap(),
            ] {
                assert!(
                    !Matcher::matches(&compiled, &t),
                    "{}: accepted invalid {t}",
                    c.name
                );
                invalid += 1;
            }
        }
    }
    eprintln!(
        "{} schemas converted ({relaxed} relaxed, {warned} with warnings); {valid} valid texts accepted, {invalid} invalid texts rejected",
        corpus.len()
    );
}
