//! Unit tests of the spellings real data uses: escaped keys of additional properties,
//! integers and bounded numbers with exponents, `format` uri and email, and repeated
//! subschemas converted once. Each against the `jsonschema` crate.
use super::tests::{accepts, compiled, reference};
use super::*;
use crate::{Compiled, Matcher};
use serde_json::json;

/// Keys of additional properties may use escapes (as serde_json and Python write control
/// and non-ASCII characters), but never an escaped spelling of a declared name: whatever
/// the grammar takes, the validator takes.
#[test]
fn additional_keys_take_escapes_but_never_spell_a_declared_name() {
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}},
        "additionalProperties": {"type": "string"}
    });
    let c = compiled(&schema);
    let pieces = [
        "a",
        "b",
        r"\u0061",
        r"\n",
        r"\u00e9",
        "é",
        r#"\""#,
        r"\ud83d\ude00",
        r"\u0001",
        "/",
        r"\/",
    ];
    let mut keys = vec![String::new()];
    for _ in 0..3 {
        let mut next = keys.clone();
        for k in &keys {
            for p in pieces {
                next.push(format!("{k}{p}"));
            }
        }
        keys = next;
    }
    keys.sort();
    keys.dedup();
    let (mut taken, mut valid_taken) = (0, 0);
    for k in &keys {
        for v in ["1", "\"x\""] {
            let text = format!("{{\"{k}\":{v}}}");
            let ok = reference(&schema, &text);
            if Matcher::matches(&c, &text) {
                taken += 1;
                assert!(ok, "grammar takes the invalid {text}");
            }
            if ok {
                // serde_json's own spelling of every valid instance is taken.
                let value: Value = serde_json::from_str(&text).unwrap();
                let spelled = value.to_string();
                assert!(Matcher::matches(&c, &spelled), "refused valid {spelled}");
                valid_taken += 1;
            }
        }
    }
    assert!(taken > 1000 && valid_taken > 1000, "{taken} {valid_taken}");
    // A control character written as an escape, as the corpus's valid instances do.
    assert!(Matcher::matches(&c, r#"{"\u001dx":"y","a":1}"#));
    assert!(!Matcher::matches(&c, r#"{"\u0061":"y"}"#));
}

/// Integers may be written with an exponent when the value is integral (serde_json and
/// Python print large integral floats so); never a spelling of a non-integer.
#[test]
fn integers_written_with_exponents() {
    let schema = json!({"type": "integer"});
    let c = compiled(&schema);
    let mantissas = [
        "1",
        "12",
        "-3",
        "0",
        "1.5",
        "1.25",
        "1.50",
        "-5.632287068924375",
        "0.0",
        "3.0",
        "1.00000000000000000001",
        "9.99999999999999999999",
        "1.000000000000000000001",
    ];
    let exponents = [
        "", "e0", "e1", "e2", "E+2", "e+37", "e-1", "e05", "e19", "e20", "e21", "e+0020", "e100",
        "e299", "e300", "e1965",
    ];
    let mut taken = 0;
    for m in mantissas {
        for e in exponents {
            let text = format!("{m}{e}");
            if serde_json::from_str::<Value>(&text).is_err() {
                // Out of a double's range: no parser's number.
                assert!(!Matcher::matches(&c, &text), "{text}");
                continue;
            }
            let ok = reference(&schema, &text);
            if Matcher::matches(&c, &text) {
                taken += 1;
                assert!(ok, "grammar takes the non-integer {text}");
            }
        }
    }
    assert!(taken > 60, "{taken}");
    for x in [
        1e16,
        1.5e38,
        -4.58305538054107e36,
        1.2345678901234567e299,
        1e21,
    ] {
        let text = json!(x).to_string();
        assert!(text.contains('e'), "{text}");
        assert!(Matcher::matches(&c, &text), "{text}");
    }
    // Valid JSON, but no double: a parser would refuse it, so the grammar does.
    for text in ["1e1965", "5.55555552552525255252E1965", "1e300", "12e299"] {
        assert!(!Matcher::matches(&c, text), "{text}");
    }
}

/// `format` `f`: what the grammar takes, the validator takes.
fn format_takes_only(f: &str, s: &str) -> Result<(), proptest::test_runner::TestCaseError> {
    let schema = json!({"type": "string", "format": f});
    let text = json!(s).to_string();
    if accepts(schema.clone(), &text) {
        proptest::prop_assert!(reference(&schema, &text), "grammar takes {}", text);
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
    /// `format: uri`: what the grammar takes, the validator (RFC 3986) takes.
    #[test]
    fn uri_format_takes_only_uris(
        s in "[a-z]{1,3}:(//([a-z@:%]{0,3}@)?[a-zA-Z0-9.%:-]{0,8})?[a-z0-9/%?#:@!$&'()*+,;=._~\\[\\]-]{0,16}"
    ) {
        format_takes_only("uri", &s)?;
    }

    /// `format: email`: what the grammar takes, the validator takes (labels with "--" in
    /// the third and fourth places are IDNA labels and were once taken unchecked).
    #[test]
    fn email_format_takes_only_emails(
        s in "[a-z'=&.{}+-]{0,4}(\\.?[a-z}F9{]{1,20}){0,4}@([a-z0-9-]{1,6}\\.){1,3}[a-z-]{1,4}"
    ) {
        format_takes_only("email", &s)?;
    }
}

#[test]
fn uri_format_takes_real_uris() {
    let schema = json!({"type": "string", "format": "uri"});
    let c = compiled(&schema);
    for u in [
        "https://h.GEG6QED.d.B.f.a.GoOGlE",
        "https://api.github.com/repos/octocat/Hello-World/issues{/number}",
        "http://user:pw@host.example:8080/a/b/c/d/e/f/g/h/i/j?q=1&r=%20#frag",
        "mailto:someone@example.com",
        "urn:isbn:0451450523",
        "file:///etc/hosts",
        "https://x.XB7e603qzD.P.R.z.Xn--cG4bkI",
        "http://192.168.0.1:80/",
    ] {
        let text = json!(u).to_string();
        let ok = reference(&schema, &text);
        assert_eq!(Matcher::matches(&c, &text), ok, "{u}");
        if !u.contains('{') {
            assert!(ok, "{u}");
        }
    }
}

/// An address with a local part of `local` characters and a domain of four labels of
/// `label` characters and a top-level label of `tld`.
fn long_email(local: usize, label: usize, tld: usize) -> String {
    let l = "x".repeat(label);
    format!("{}@{l}.{l}.{l}.{l}.{}", "a".repeat(local), "c".repeat(tld))
}

#[test]
fn email_format_takes_real_addresses() {
    let schema = json!({"type": "string", "format": "email"});
    let c = compiled(&schema);
    let (widest, too_wide) = (long_email(64, 56, 24), long_email(64, 63, 24));
    for (e, ok) in [
        ("octocat@github.com", true),
        ("K'OsR@s2vnM.ZorRp.jXe.q.xEROX", true),
        ("TB=o@m.S.fVzjZWgjIM3.sOftbank", true),
        ("first.last+tag@mail.example.co.uk", true),
        ("first.middle.last@example.com", true),
        ("F9}SN8{x.y.z.w@example.org", true),
        // 64 characters in the local part, then 65.
        (
            "abcdefghij.abcdefghij.abcdefghij.abcdefghij.abcdefghij.abcdefghi@x.io",
            true,
        ),
        (
            "abcdefghij.abcdefghij.abcdefghij.abcdefghij.abcdefghij.abcdefghij@x.io",
            false,
        ),
        ("a.@x.com", false),
        (".a@x.com", false),
        // A domain of 252 characters (four labels of 56 and a top-level label of 24),
        // behind a local part of 64; then one of 280 (labels of 63), past the 254 a
        // domain may have.
        (widest.as_str(), true),
        (too_wide.as_str(), false),
        ("a@ab--c.com", false),
        ("a@-a.com", false),
        ("a..b@x.com", false),
    ] {
        let text = json!(e).to_string();
        assert_eq!(reference(&schema, &text), ok, "{e}");
        assert_eq!(Matcher::matches(&c, &text), ok, "{e}");
    }
}

/// A subschema repeated (up to its annotations) is converted once: its notes are still
/// reported at every path, and what it accepts is unchanged. A member named like an
/// annotation (`description`) is no annotation.
#[test]
fn repeated_subschemas_keep_their_notes_and_their_language() {
    let item = |title: &str, extra: &str| {
        json!({
            "title": title,
            "type": "object",
            "properties": {
                "url": {"type": "string", "format": "uri-template"},
                "description": {"type": extra},
                "count": {"type": "integer", "description": "how many"},
                "created_at": {"type": "string", "format": "date-time"},
                "updated_at": {"type": "string", "format": "date-time"}
            },
            "required": ["description"]
        })
    };
    let schema = json!({
        "type": "object",
        "properties": {
            "a": item("first", "integer"),
            "b": item("second", "integer"),
            "c": item("third", "string")
        }
    });
    let g = compile_schema(&schema.to_string()).unwrap();
    let c = Compiled::new(&g);
    let paths: Vec<&str> = c.relaxations().iter().map(|n| n.path.as_str()).collect();
    for p in ["/properties/a/", "/properties/b/", "/properties/c/"] {
        assert!(
            paths.iter().any(|x| x.starts_with(p)),
            "{p} missing from {paths:?}"
        );
    }
    for (text, ok) in [
        (
            r#"{"a":{"description":1},"b":{"description":2},"c":{"description":"x"}}"#,
            true,
        ),
        (r#"{"b":{"description":"x"}}"#, false),
        (r#"{"c":{"description":1}}"#, false),
        (r#"{"a":{"description":1,"count":1.5}}"#, false),
    ] {
        assert_eq!(reference(&schema, text), ok, "{text}");
        assert_eq!(Matcher::matches(&c, text), ok, "{text}");
    }
}

/// Numbers with bounds written with a negative exponent (as Python and serde print small
/// numbers): taken only where every such number is within the bounds.
#[test]
fn bounded_numbers_with_negative_exponents() {
    let bounds = [
        json!({"type": "number", "minimum": 0, "maximum": 100}),
        json!({"type": "number", "minimum": 0, "maximum": 1}),
        json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        json!({"type": "number", "minimum": -1, "maximum": 0}),
        json!({"type": "number", "minimum": -1, "exclusiveMaximum": 0}),
        json!({"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1}),
        json!({"type": "number", "minimum": 1}),
        json!({"type": "number", "maximum": -1}),
        json!({"type": "number", "minimum": -5}),
    ];
    let mut taken = 0;
    for s in &bounds {
        let c = compiled(s);
        for m in ["0", "1", "9.99", "-0", "-1", "-9.5", "5.0", "0.0"] {
            for e in ["e-1", "E-01", "e-2", "e-300", "e-0", "e1", "e+1", ""] {
                let text = format!("{m}{e}");
                let ok = reference(s, &text);
                if Matcher::matches(&c, &text) {
                    taken += 1;
                    assert!(ok, "{s}: grammar takes {text}");
                }
            }
        }
        for x in [2.5e-5, -2.5e-5, 1.1125369292536007e-308] {
            let text = json!(x).to_string();
            if reference(s, &text) {
                assert!(Matcher::matches(&c, &text), "{s}: refused {text}");
            }
        }
    }
    assert!(taken > 60, "{taken}");
}

/// Type lists meet as sets where integers are numbers: `number` on both sides stays
/// `number` (it was narrowed to `integer`, so `42.5` was refused), `number` against
/// `integer` is `integer`.
#[test]
fn type_lists_meet_with_integers_inside_numbers() {
    let cases = [
        json!({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "integer"}],
               "type": ["null", "string", "number", "integer"]}),
        json!({"allOf": [{"type": ["number", "string"]}, {"type": ["integer", "number"]}]}),
        json!({"allOf": [{"type": ["number", "null"]}, {"type": ["integer", "null"]}]}),
        json!({"allOf": [{"type": "integer"}, {"type": ["number", "string"]}]}),
    ];
    let texts = [
        "42.5",
        "1.1125369292536007e-308",
        "7",
        "-3.0",
        "1e3",
        "\"x\"",
        "null",
        "true",
    ];
    for schema in cases {
        let c = compiled(&schema);
        for t in texts {
            assert_eq!(
                Matcher::matches(&c, t),
                reference(&schema, t),
                "{schema} on {t}"
            );
        }
    }
}
