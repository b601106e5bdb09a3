//! Unit tests of the JSON Schema front end.
use super::*;
use crate::{Compiled, Matcher};
use serde_json::json;

pub(super) fn accepts(schema: Value, text: &str) -> bool {
    let c = Compiled::new(&compile_schema(&schema.to_string()).unwrap());
    Matcher::matches(&c, text)
}

pub(super) fn compiled(schema: &Value) -> Compiled {
    Compiled::new(&compile_schema(&schema.to_string()).unwrap_or_else(|e| panic!("{schema}: {e}")))
}

pub(super) fn reference(schema: &Value, text: &str) -> bool {
    let v = jsonschema_validator(schema, None, true).unwrap();
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

#[test]
fn a_warning_met_again_is_listed_once_where_first_met() {
    // The same definition merged twice at one place, and used at another.
    let s = json!({"$defs": {"a": {"type": "object", "x-a": 1}},
        "properties": {
            "p": {"allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}, {"x-b": 2}]},
            "q": {"$ref": "#/$defs/a"}}});
    let c = compiled(&s);
    let got: Vec<(&str, &str)> = c
        .warnings()
        .iter()
        .map(|w| (w.path.as_str(), w.keyword.as_str()))
        .collect();
    // Once each (the allOf met `x-a` twice), in the order first met.
    assert_eq!(
        got,
        [
            ("/properties/p/allOf", "x-a"),
            ("/properties/p/allOf", "x-b"),
            ("/$defs/a", "x-a")
        ]
    );
}

/// `name_base` by its definition, step by step: every character that is not an ASCII
/// letter or digit a dash, runs of dashes one, no dash at either end, lowercase, the first
/// 48 characters, a dash at the cut removed.
fn name_base_by_definition(hint: &str) -> String {
    let dashed: String = hint
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let words: Vec<&str> = dashed.split('-').filter(|w| !w.is_empty()).collect();
    let base: String = words.join("-").chars().take(48).collect();
    let base = base.trim_end_matches('-');
    if base.is_empty() {
        "r".to_string()
    } else {
        format!("r-{base}")
    }
}

proptest::proptest! {
    /// The one-pass cleaning gives the definition's name, on hints around the cut.
    #[test]
    fn rule_name_bases_follow_their_definition(hint in "[a-zA-Z0-9/_é -]{0,120}") {
        proptest::prop_assert_eq!(Conv::name_base(&hint), name_base_by_definition(&hint));
    }

    /// A hint that `fresh_name` takes as it is would have come out of the cleaning
    /// unchanged.
    #[test]
    fn clean_hints_are_their_own_rule_names(hint in "[a-z0-9-]{0,52}|[a-zA-Z0-9_/ -]{0,20}") {
        if Conv::is_clean_hint(&hint) {
            proptest::prop_assert_eq!(Conv::name_base(&hint), format!("r-{hint}"));
        }
    }
}
