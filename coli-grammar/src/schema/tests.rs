//! Unit tests of the JSON Schema front end.
use super::*;
use crate::{Compiled, Matcher};
use serde_json::json;

fn accepts(schema: Value, text: &str) -> bool {
    let c = Compiled::new(&compile_schema(&schema.to_string()).unwrap());
    Matcher::matches(&c, text)
}

fn compiled(schema: &Value) -> Compiled {
    Compiled::new(&compile_schema(&schema.to_string()).unwrap_or_else(|e| panic!("{schema}: {e}")))
}

fn reference(schema: &Value, text: &str) -> bool {
    let v = jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap();
    v.is_valid(&serde_json::from_str(text).unwrap())
}

#[test]
fn errors_name_keyword_and_path() {
    for (schema, path, keyword) in [
        (json!({"$ref": "https://example.com/s.json"}), "", "$ref"),
        (json!({"$ref": "#/$defs/missing"}), "", "$ref"),
        (
            json!({"type": "integer", "minimum": 5, "maximum": 4}),
            "",
            "maximum",
        ),
        (
            json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
            "/allOf",
            "type",
        ),
        (
            json!({"type": "object", "properties": {"a": false}, "required": ["a"]}),
            "/properties/a",
            "false",
        ),
        (
            json!({"type": "object", "additionalProperties": false, "required": ["a"]}),
            "",
            "required",
        ),
        (json!(false), "", "false"),
    ] {
        let e = compile_schema(&schema.to_string()).unwrap_err();
        assert_eq!(
            (e.path.as_str(), e.keyword.as_str()),
            (path, keyword),
            "{schema}: {e}"
        );
        assert!(e.to_string().contains(keyword), "{e}");
    }
    let cycle = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"});
    assert_eq!(
        compile_schema(&cycle.to_string()).unwrap_err().keyword,
        "$ref"
    );
    assert_eq!(compile_schema("{").unwrap_err().keyword, "(json)");
}

#[test]
fn unknown_keywords_are_ignored_with_a_warning() {
    let s = json!({"type": "string", "javaType": "x", "x-foo": 1, "nullable": true,
        "_private": 1, "readonly": true, "": 1, "propertyOrder": 3, "discriminator": {}});
    let c = compiled(&s);
    let mut warned: Vec<&str> = c.warnings().iter().map(|w| w.keyword.as_str()).collect();
    warned.sort_unstable();
    assert_eq!(
        warned,
        [
            "",
            "_private",
            "discriminator",
            "javaType",
            "nullable",
            "propertyOrder",
            "readonly",
            "x-foo"
        ]
    );
    assert!(c.warnings()[0].to_string().contains("the root"));
    assert!(c.relaxations().is_empty() && !c.needs_validation());
    assert!(Matcher::matches(&c, "\"a\""));
    assert!(!Matcher::matches(&c, "null"), "nullable is not JSON Schema");
    let nested = compiled(&json!({"properties": {"a": {"type": "integer", "example": 3}}}));
    assert_eq!(nested.warnings()[0].path, "/properties/a");
}

/// Keywords without a grammar: relaxed, listed, and checked on the finished text, against
/// the independent validator.
#[test]
fn relaxed_keywords_are_validated_after_generation() {
    let long = format!("\"{}\"", "a".repeat(20_001));
    let seven: Vec<String> = (0..7).map(|i| format!("p{i}")).collect();
    let seven_props: serde_json::Map<String, Value> = seven
        .iter()
        .map(|p| (p.clone(), json!({"type": "integer"})))
        .collect();
    let seven_all = r#"{"p0":0,"p1":1,"p2":2,"p3":3,"p4":4,"p5":5,"p6":6}"#;
    let seven_less = r#"{"p0":0,"p1":1,"p2":2,"p3":3,"p4":4,"p5":5}"#;
    for (schema, keyword, good, bad) in [
        (
            json!({"type": "integer", "multipleOf": 3}),
            "multipleOf",
            "9",
            "10",
        ),
        (
            json!({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": false}),
            "patternProperties",
            r#"{"x-a": 1}"#,
            r#"{"x-a": 1, "y": 2}"#,
        ),
        (
            json!({"type": "string", "not": {"const": "a"}}),
            "not",
            "\"b\"",
            "\"a\"",
        ),
        (
            json!({"type": "array", "uniqueItems": true}),
            "uniqueItems",
            "[1, 2]",
            "[1, 1]",
        ),
        (
            json!({"type": "object", "minProperties": 1}),
            "minProperties",
            r#"{"a":1}"#,
            "{}",
        ),
        (
            json!({"maxProperties": 1}),
            "maxProperties",
            r#"{"a":1}"#,
            r#"{"a":1,"b":2}"#,
        ),
        (
            json!({"if": {"properties": {"k": {"const": 1}}}, "then": {"required": ["v"]}}),
            "if",
            r#"{"k":1,"v":2}"#,
            r#"{"k":1}"#,
        ),
        (
            json!({"dependencies": {"a": ["b"]}}),
            "dependencies",
            r#"{"a":1,"b":1}"#,
            r#"{"a":1}"#,
        ),
        (
            json!({"dependentRequired": {"a": ["b"]}}),
            "dependentRequired",
            r#"{"a":1,"b":1}"#,
            r#"{"a":1}"#,
        ),
        (
            json!({"propertyNames": {"maxLength": 2}}),
            "propertyNames",
            r#"{"ab":1}"#,
            r#"{"abc":1}"#,
        ),
        (
            json!({"type": "array", "contains": {"type": "string"}}),
            "contains",
            r#"[1,"a"]"#,
            "[1,2]",
        ),
        (
            json!({"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}),
            "oneOf",
            r#"{"a":1}"#,
            r#"{"a":1,"b":2}"#,
        ),
        (
            json!({"type": "number", "minimum": 0.5}),
            "minimum",
            "0.5",
            "0.2",
        ),
        (
            json!({"type": "number", "exclusiveMaximum": 2.5}),
            "maximum",
            "2.4",
            "2.5",
        ),
        (
            json!({"type": "integer", "maximum": 1e20}),
            "maximum",
            "5",
            "200000000000000000000000",
        ),
        (
            json!({"type": "string", "maxLength": 20000}),
            "maxLength",
            "\"abc\"",
            long.as_str(),
        ),
        (
            json!({"type": "string", "pattern": "^[a-z]+$", "minLength": 3}),
            "minLength",
            "\"abc\"",
            "\"ab\"",
        ),
        (
            json!({"type": "string", "format": "ipv6"}),
            "format",
            "\"::1\"",
            "\"xyz\"",
        ),
        (
            json!({"type": "string", "pattern": "^(?!x)"}),
            "pattern",
            "\"a\"",
            "\"xa\"",
        ),
        (
            json!({"type": "object", "properties": seven_props, "required": seven}),
            "required",
            seven_all,
            seven_less,
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {}, "c": {}, "d": {}, "e": {}, "f": {}}}),
            "properties",
            r#"{"a": 1, "f": 2}"#,
            r#"{"a": 1, "a": 2}"#,
        ),
    ] {
        let c = compiled(&schema);
        assert!(c.needs_validation(), "{schema}");
        assert!(
            c.relaxations().iter().any(|r| r.keyword == keyword),
            "{schema}: {:?}",
            c.relaxations()
        );
        assert!(reference(&schema, good), "{schema} {good}");
        assert!(Matcher::matches(&c, good), "{schema} refuses {good}");
        if !bad.contains("\"a\": 1, \"a\"") {
            assert!(!reference(&schema, bad), "{schema} {bad}");
        }
        assert!(!Matcher::matches(&c, bad), "{schema} accepts {bad}");
        assert!(c.check_complete(bad).is_err());
    }
}

#[test]
fn disjoint_one_of_is_exact() {
    for s in [
        json!({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}),
        json!({"oneOf": [{"const": 1}, {"const": "1"}]}),
        json!({"oneOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
            {"type": "object", "properties": {"kind": {"enum": ["b", "c"]}}, "required": ["kind"]}
        ]}),
        json!({"$defs": {"s": {"type": "string"}}, "oneOf": [{"$ref": "#/$defs/s"}, {"type": "array"}]}),
        json!({"oneOf": [
            {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": false},
            {"type": "object", "properties": {"b": {}}, "required": ["b"], "additionalProperties": false}
        ]}),
    ] {
        let c = compiled(&s);
        assert!(c.relaxations().is_empty(), "{s}: {:?}", c.relaxations());
    }
    let c = compiled(&json!({"oneOf": [{"type": "integer"}, {"type": "number"}]}));
    assert!(c.needs_validation());
    assert!(!Matcher::matches(&c, "1"), "1 matches both branches");
    assert!(Matcher::matches(&c, "1.5"));
}

#[test]
fn annotations_are_ignored() {
    let s = json!({"$schema": "x", "title": "t", "description": "d", "examples": [1],
        "default": 2, "$comment": "c", "type": "integer", "minimum": 1});
    assert!(accepts(s.clone(), "7"));
    assert!(!accepts(s.clone(), "0"));
    assert!(compiled(&s).warnings().is_empty());
}

#[test]
fn members_in_any_order_each_at_most_once() {
    let s = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
    assert!(!compiled(&s).needs_validation());
    for ok in [
        "{\"a\":1}",
        "{\"a\":1,\"b\":2}",
        "{\"b\":2,\"a\":1}",
        "{ \"b\" : 2 ,\n\t \"a\": 1 }",
    ] {
        assert!(accepts(s.clone(), ok), "{ok}");
    }
    for bad in [
        "{}",
        "{\"b\":2}",
        "{\"a\":1,}",
        "{,\"a\":1}",
        "{\"a\":1,\"c\":1}",
        "{\"a\":1,\"a\":1}",
        "{\"b\":2,\"a\":1,\"b\":2}",
    ] {
        assert!(!accepts(s.clone(), bad), "{bad}");
    }
    // Without additionalProperties, other members are allowed (as the specification says),
    // anywhere, but never under a declared name.
    let open =
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    for ok in ["{\"c\":\"x\",\"a\":1}", "{\"a\":1,\"c\":[],\"d\":{}}"] {
        assert!(accepts(open.clone(), ok), "{ok}");
    }
    for bad in ["{\"c\":1}", "{\"a\":\"x\"}", "{\"a\":1,\"a\":2}"] {
        assert!(!accepts(open.clone(), bad), "{bad}");
    }
    // A required name not declared: an additional member that must be there.
    let req = json!({"type": "object", "properties": {"a": {}}, "required": ["z"], "additionalProperties": {"type": "integer"}});
    assert!(accepts(req.clone(), "{\"z\":1}"));
    assert!(!accepts(req.clone(), "{\"a\":1}"));
    assert!(!accepts(req, "{\"z\":\"s\"}"));
}

#[test]
fn closed_objects_option_refuses_undeclared_members() {
    let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}}).to_string();
    let closed = SchemaOptions {
        closed_objects: true,
        ..SchemaOptions::default()
    };
    let strict = Compiled::new(&compile_schema_with(&s, closed).unwrap());
    let open = Compiled::new(&compile_schema(&s).unwrap());
    assert!(Matcher::matches(&strict, "{\"a\":1}") && Matcher::matches(&open, "{\"a\":1}"));
    assert!(!Matcher::matches(&strict, "{\"b\":1}"));
    assert!(Matcher::matches(&open, "{\"b\":1}"));
    // additionalProperties given: the option changes nothing.
    let given = json!({"properties": {"a": {}}, "additionalProperties": {"type": "string"}});
    let g = Compiled::new(&compile_schema_with(&given.to_string(), closed).unwrap());
    assert!(Matcher::matches(&g, "{\"b\":\"x\"}"));
}

#[test]
fn any_json_spelling_is_accepted() {
    let number = json!({"type": "number"});
    for ok in [
        "12345678901234567890123",
        "1e300",
        "1.5E-308",
        "0.30000000000000004",
        "-0",
        "1e+05",
    ] {
        assert!(accepts(number.clone(), ok), "{ok}");
    }
    let int = json!({"type": "integer", "minimum": 0});
    assert!(accepts(int.clone(), "123456789012345678901234567890"));
    assert!(!accepts(int, "-1"));
    let s = json!({"type": "string", "maxLength": 2});
    for ok in [r#""\ud83d\ude00""#, r#""\u00e9x""#, "\"\u{1F600}\""] {
        assert!(accepts(s.clone(), ok), "{ok}");
    }
    assert!(
        !accepts(s, r#""\ud83d""#),
        "a lone surrogate is not a character"
    );
    let deep = json!({"type": "array", "items": {"type": "array", "items": {"type": "integer"}}});
    let pretty = format!(
        "[\n{}[\n{}1\n{}]\n]",
        " ".repeat(40),
        " ".repeat(50),
        " ".repeat(40)
    );
    assert!(accepts(deep, &pretty));
}

#[test]
fn integer_ranges_match_exactly_the_integers_in_range() {
    for (lo, hi) in [
        (Some(-130), Some(-7)),
        (Some(0), Some(100)),
        (Some(-12), Some(345)),
        (Some(99), None),
        (None, Some(-101)),
        (Some(7), Some(7)),
    ] {
        let mut s = json!({"type": "integer"});
        if let Some(l) = lo {
            s["minimum"] = json!(l);
        }
        if let Some(h) = hi {
            s["maximum"] = json!(h);
        }
        let c = Compiled::new(&compile_schema(&s.to_string()).unwrap());
        for n in -1200i64..1200 {
            let want = lo.is_none_or(|l| n >= l) && hi.is_none_or(|h| n <= h);
            assert_eq!(Matcher::matches(&c, &n.to_string()), want, "{s} {n}");
        }
        assert!(!Matcher::matches(&c, "007"));
    }
}

#[test]
fn number_ranges_match_exactly_the_numbers_in_range() {
    for (s, lo, hi, lo_ex, hi_ex) in [
        (
            json!({"type": "number", "minimum": -3, "maximum": 12}),
            -3.0,
            12.0,
            false,
            false,
        ),
        (
            json!({"type": "number", "exclusiveMinimum": -3, "exclusiveMaximum": 2}),
            -3.0,
            2.0,
            true,
            true,
        ),
        (
            json!({"type": "number", "exclusiveMinimum": 0}),
            0.0,
            f64::INFINITY,
            true,
            false,
        ),
    ] {
        let c = Compiled::new(&compile_schema(&s.to_string()).unwrap());
        for i in -1500i64..1500 {
            for text in [
                format!("{}", i as f64 / 100.0),
                format!("{:.3}", i as f64 / 100.0),
                format!("{}", i / 10),
            ] {
                let x: f64 = text.parse().unwrap();
                let want = (if lo_ex { x > lo } else { x >= lo })
                    && (if hi_ex { x < hi } else { x <= hi });
                assert_eq!(Matcher::matches(&c, &text), want, "{s} {text}");
            }
        }
    }
}

/// Schema-like JSON: the supported keywords (and some others) with values of any
/// shape, nested.
fn schema_like() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(json!("string")),
        Just(json!("integer")),
        Just(json!(["number", "null"])),
        any::<i64>().prop_map(|n| json!(n % 1000)),
        any::<bool>().prop_map(Value::Bool),
        "[a-z#/$\\\\^.*()\\[\\]{}0-9-]{0,12}".prop_map(Value::String),
        Just(json!("#/$defs/a")),
        Just(Value::Null),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            Just("type"),
            Just("properties"),
            Just("required"),
            Just("additionalProperties"),
            Just("items"),
            Just("prefixItems"),
            Just("minItems"),
            Just("maxItems"),
            Just("enum"),
            Just("const"),
            Just("anyOf"),
            Just("oneOf"),
            Just("allOf"),
            Just("$ref"),
            Just("$defs"),
            Just("minLength"),
            Just("maxLength"),
            Just("pattern"),
            Just("format"),
            Just("minimum"),
            Just("maximum"),
            Just("exclusiveMinimum"),
            Just("exclusiveMaximum"),
            Just("title"),
            Just("a"),
            Just("b"),
            Just("not"),
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((key, inner), 0..5).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
    /// Any schema-shaped JSON converts or fails with a named keyword, never panics;
    /// what converts compiles and runs.
    #[test]
    fn schema_front_end_never_panics(v in schema_like()) {
        match compile_schema(&v.to_string()) {
            Ok(g) => {
                let c = Compiled::new(&g);
                let mut m = c.matcher();
                let _ = m.forced_bytes(32);
                let _ = m.accept_bytes(b"{\"a\": [1, \"x\", null]}");
            }
            Err(e) => proptest::prop_assert!(!e.keyword.is_empty()),
        }
    }

    /// Any text as a schema or as a pattern: an answer, never a panic.
    #[test]
    fn any_text_gets_an_answer(t in "\\PC{0,40}") {
        let _ = compile_schema(&t);
        let _ = crate::regex::pattern_to_gbnf(&t);
    }
}

#[test]
fn bounded_space_option_limits_padding_only() {
    let s = json!({"type": "array", "items": {"type": "integer"}}).to_string();
    let bounded = Compiled::new(&compile_schema_with(&s, SchemaOptions::GENERATION).unwrap());
    let free = Compiled::new(&compile_schema(&s).unwrap());
    for ok in ["[1,2]", "[ 1, 2 ]", "[\n  1,\n  2\n]"] {
        assert!(
            Matcher::matches(&bounded, ok) && Matcher::matches(&free, ok),
            "{ok}"
        );
    }
    // 21 spaces of indent, or two spaces: valid JSON, but generation does not pad so.
    let deep = format!("[\n{}1]", " ".repeat(21));
    for padded in [deep.as_str(), "[  1]", "[1 \n 2]"] {
        assert!(!Matcher::matches(&bounded, padded), "{padded:?}");
    }
    assert!(Matcher::matches(&free, &deep) && Matcher::matches(&free, "[  1]"));
}

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

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
    /// `format: uri`: what the grammar takes, the validator (RFC 3986) takes.
    #[test]
    fn uri_format_takes_only_uris(
        s in "[a-z]{1,3}:(//([a-z@:%]{0,3}@)?[a-zA-Z0-9.%:-]{0,8})?[a-z0-9/%?#:@!$&'()*+,;=._~\\[\\]-]{0,16}"
    ) {
        let schema = json!({"type": "string", "format": "uri"});
        let text = json!(s).to_string();
        if accepts(schema.clone(), &text) {
            proptest::prop_assert!(reference(&schema, &text), "grammar takes {}", text);
        }
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

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
    /// `format: email`: what the grammar takes, the validator takes (labels with "--" in
    /// the third and fourth places are IDNA labels and were once taken unchecked).
    #[test]
    fn email_format_takes_only_emails(
        s in "[a-z'=&.{}+-]{0,4}@([a-z0-9-]{1,6}\\.){1,3}[a-z-]{1,4}"
    ) {
        let schema = json!({"type": "string", "format": "email"});
        let text = json!(s).to_string();
        if accepts(schema.clone(), &text) {
            proptest::prop_assert!(reference(&schema, &text), "grammar takes {}", text);
        }
    }
}

#[test]
fn email_format_takes_real_addresses() {
    let schema = json!({"type": "string", "format": "email"});
    let c = compiled(&schema);
    for (e, ok) in [
        ("octocat@github.com", true),
        ("K'OsR@s2vnM.ZorRp.jXe.q.xEROX", true),
        ("TB=o@m.S.fVzjZWgjIM3.sOftbank", true),
        ("first.last+tag@mail.example.co.uk", true),
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
