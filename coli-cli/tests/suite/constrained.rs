//! Grammar- and JSON-Schema-constrained generation through `coli run`, and bad schemas.

use std::path::Path;

use serde_json::Value;

use crate::cli::{coli, expect_error, last_json, path_str};

/// `coli run --grammar`: on the demo model, greedy and sampled outputs always satisfy the
/// grammar (checked by the matcher and, for the JSON grammar, by serde_json); a bad grammar
/// is an error naming line and column.
#[test]
fn grammar_constrained_generation() {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("root ::= \" \" city \".\"\ncity ::= \"Paris\" | \"Lyon\" | \"Nice\"\n", false),
        (
            "root ::= \" {\\\"answer\\\": \\\"\" [A-Za-z ]{1,20} \"\\\", \\\"score\\\": \" [0-9]{1,2} \"}\"\n",
            true,
        ),
        ("root ::= \" \" [a-z]{1,8} (\",\" \" \" [a-z]{1,8}){2}\n", false),
    ];
    for (i, (src, is_json)) in cases.iter().enumerate() {
        let path = tmp.path().join(format!("g{i}.gbnf"));
        std::fs::write(&path, src).unwrap();
        let compiled = coli_grammar::Compiled::new(&coli_grammar::parse(src).unwrap());
        for (temp, seed) in [("0", "0"), ("0.9", "1"), ("1.2", "7")] {
            let out = coli(&[
                "run",
                "--model",
                path_str(&dir),
                "--prompt",
                "Give a JSON answer:",
                "--grammar",
                path_str(&path),
                "--max-tokens",
                "48",
                "--temperature",
                temp,
                "--seed",
                seed,
                "--json",
            ]);
            assert!(
                out.status.success(),
                "{src}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v = last_json(&out);
            let text = v["text"].as_str().unwrap();
            assert_eq!(v["finish_reason"], "stop", "{src} t={temp}: {text:?}");
            assert!(
                coli_grammar::Matcher::matches(&compiled, text),
                "{src} t={temp}: {text:?}"
            );
            if *is_json {
                let parsed: Value = serde_json::from_str(text.trim()).unwrap();
                assert!(parsed["score"].as_u64().unwrap() < 100);
            }
        }
    }
    std::fs::write(tmp.path().join("bad.gbnf"), "root ::= \"a\" | missing\n").unwrap();
    expect_error(
        &[
            "run",
            "--model",
            path_str(&dir),
            "--prompt",
            "x",
            "--grammar",
            path_str(&tmp.path().join("bad.gbnf")),
        ],
        "line 1, column 16 (rule \"missing\"): undefined rule",
    );
}

// Two tests of two schemas each, so that they run side by side.
#[test]
fn json_schema_constrained_generation_tool_calls() {
    schema_constrained_runs(&["01-weather-call", "26-openai-tool-call"]);
}

#[test]
fn json_schema_constrained_generation_enum_and_const() {
    schema_constrained_runs(&["32-sentiment", "09-const-version"]);
}

/// Each schema at temperature 0 and 0.8, drafts on and off: the output finishes, parses,
/// validates (independent validator) and does not depend on drafts.
fn schema_constrained_runs(names: &[&str]) {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tmp = tempfile::tempdir().unwrap();
    let corpus = coli_grammar::corpus::corpus_dir();
    for name in names {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(corpus.join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        let schema = &v["schema"];
        let path = tmp.path().join(format!("{name}.schema.json"));
        std::fs::write(&path, schema.to_string()).unwrap();
        let validator = coli_grammar::schema::jsonschema_validator(schema, None, true).unwrap();
        for (temp, seed) in [("0", "0"), ("0.8", "3")] {
            let mut texts = Vec::new();
            for drafts in [true, false] {
                let mut args = vec![
                    "run",
                    "--model",
                    path_str(&dir),
                    "--chat",
                    "--prompt",
                    "Call the weather tool for Paris. Reply with JSON only.",
                    "--json-schema",
                    path_str(&path),
                    "--max-tokens",
                    "300",
                    "--temperature",
                    temp,
                    "--seed",
                    seed,
                    "--json",
                ];
                if !drafts {
                    args.push("--no-drafts");
                }
                let out = coli(&args);
                assert!(
                    out.status.success(),
                    "{name}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let r = last_json(&out);
                let text = r["text"].as_str().unwrap().to_string();
                assert_eq!(r["finish_reason"], "stop", "{name} t={temp}: {text}");
                let parsed: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{name} t={temp}: {e}: {text}"));
                assert!(validator.is_valid(&parsed), "{name} t={temp}: {text}");
                texts.push((r["generated_ids"].clone(), text));
            }
            assert_eq!(texts[0], texts[1], "{name}: drafts changed the output");
        }
    }
}

#[test]
fn bad_json_schemas_get_named_errors() {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tmp = tempfile::tempdir().unwrap();
    // A schema nothing can satisfy, a malformed file, a missing file: named errors, exit 2.
    let bad = tmp.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"type":"object","properties":{"n":{"allOf":[{"type":"integer"},{"type":"string"}]}},"required":["n"]}"#,
    )
    .unwrap();
    let base = [
        "run",
        "--model",
        path_str(&dir),
        "--prompt",
        "x",
        "--json-schema",
    ];
    let with = |p: &Path| -> Vec<String> {
        base.iter()
            .map(|s| s.to_string())
            .chain([path_str(p).to_string()])
            .collect()
    };
    let args = with(&bad);
    expect_error(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        "accepts nothing",
    );
    assert!(String::from_utf8_lossy(
        &coli(&args.iter().map(String::as_str).collect::<Vec<_>>()).stderr
    )
    .contains("/properties/n"));
    std::fs::write(&bad, "{ not json").unwrap();
    expect_error(
        &with(&bad).iter().map(String::as_str).collect::<Vec<_>>(),
        "not valid JSON",
    );
    let missing = tmp.path().join("missing.json");
    expect_error(
        &with(&missing)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "missing.json",
    );
}
