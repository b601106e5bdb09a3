//! No input aborts the process: recursive and very deep schemas, deep instances, deep
//! patterns and grammars end in an error or a correct answer, on a thread with the small
//! stack of a test thread (2 MiB).

use coli_grammar::schema::jsonschema_validator;
use coli_grammar::{compile_schema, parse, schema_to_gbnf, Compiled, Matcher};
use serde_json::{json, Value};

fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .expect("no panic")
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema_validator(schema, None, false).unwrap()
}

/// Issue 17's crash: a recursive `$ref` inside `allOf`.
#[test]
fn recursive_ref_inside_all_of() {
    let text = r##"{"definitions":{"ChildFoo":{"type":"object"},"Foo":{"properties":{"childFoos":{"allOf":[{"$ref":"#/definitions/Foo"},{"$ref":"#/definitions/ChildFoo"}]}},"required":["childFoos"],"type":"object"}},"properties":{"Foo":{"$ref":"#/definitions/Foo"}},"required":["Foo"]}"##;
    let schema: Value = serde_json::from_str(text).unwrap();
    let v = validator(&schema);
    let c = on_small_stack(move || Compiled::new(&compile_schema(text).unwrap()));
    // Every Foo needs a child Foo: no finite object with "Foo" is valid (the root has no
    // type, so a number is).
    for t in [
        r#"{"Foo":{"childFoos":{}}}"#,
        r#"{"Foo":{"childFoos":{"childFoos":{}}}}"#,
        r#"{}"#,
        "1",
    ] {
        let want = v.is_valid(&serde_json::from_str(t).unwrap());
        assert_eq!(Matcher::matches(&c, t), want, "{t}");
        assert_eq!(want, t == "1");
    }
    // The same shape with the child optional: a recursive grammar.
    let optional = text.replace(r#""required":["childFoos"],"#, "");
    let schema: Value = serde_json::from_str(&optional).unwrap();
    let v = validator(&schema);
    let c = on_small_stack(move || Compiled::new(&compile_schema(&optional).unwrap()));
    let mut inst = json!({});
    for depth in 0..40 {
        let t = json!({"Foo": inst.clone()}).to_string();
        assert!(v.is_valid(&serde_json::from_str(&t).unwrap()));
        assert!(Matcher::matches(&c, &t), "depth {depth}: {t}");
        let bad = json!({"Foo": inst.clone(), "x": {"childFoos": 1}}).to_string();
        assert!(v.is_valid(&serde_json::from_str(&bad).unwrap()) == Matcher::matches(&c, &bad));
        inst = json!({"childFoos": inst});
    }
    assert!(!Matcher::matches(&c, r#"{"Foo":{"childFoos":5}}"#));
}

#[test]
fn reference_and_merge_cycles_end_in_errors() {
    for s in [
        json!({"$ref": "#"}),
        json!({"allOf": [{"$ref": "#"}]}),
        json!({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}),
        json!({"$defs": {"a": {"$ref": "#/$defs/a", "type": "object"}}, "$ref": "#/$defs/a"}),
        json!({"anyOf": [{"$ref": "#"}, {"type": "null"}]}),
        json!({"oneOf": [{"allOf": [{"$ref": "#"}]}, {"type": "null"}]}),
        json!({"properties": {"a": {"allOf": [{"$ref": "#"}, {"required": ["b"]}]}}, "required": ["a"]}),
    ] {
        let text = s.to_string();
        let r = on_small_stack(move || compile_schema(&text).map(|g| Compiled::new(&g)));
        if let Ok(c) = r {
            // A grammar: it must agree with the validator on a few texts.
            let v = validator(&s);
            for t in ["null", "{}", r#"{"a":{}}"#, r#"{"a":{"b":1}}"#, "[]"] {
                let want = v.is_valid(&serde_json::from_str(t).unwrap());
                if Matcher::matches(&c, t) {
                    assert!(want, "{s}: accepted {t}");
                }
            }
        }
    }
}

#[test]
fn very_deep_schemas_are_errors_not_overflows() {
    // 100k nested arrays as text: serde_json's recursion limit (128) refuses it.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let e = on_small_stack(move || compile_schema(&deep).unwrap_err());
    assert_eq!(e.keyword, "(json)");
    let deep = format!(
        "{}{{}}{}",
        r#"{"items":"#.repeat(100_000),
        "}".repeat(100_000)
    );
    let e = on_small_stack(move || compile_schema(&deep).unwrap_err());
    assert_eq!(e.keyword, "(json)");
    // Within serde's limit: converts.
    let ok = format!("{}{{}}{}", r#"{"items":"#.repeat(60), "}".repeat(60));
    assert!(on_small_stack(move || compile_schema(&ok).is_ok()));
    // Built in memory, deeper than any text: the converter's own limit.
    let e = on_small_stack(|| {
        let mut s = json!({"type": "integer"});
        for _ in 0..1000 {
            s = json!({"type": "array", "items": s});
        }
        schema_to_gbnf(&s).unwrap_err()
    });
    assert_eq!(e.keyword, "(nesting)");
    // A chain of 1,000 distinct references.
    let e = on_small_stack(|| {
        let mut defs = serde_json::Map::new();
        for i in 0..1000 {
            defs.insert(
                format!("d{i}"),
                json!({"type": "array", "items": {"$ref": format!("#/$defs/d{}", i + 1)}}),
            );
        }
        defs.insert("d1000".into(), json!({"type": "null"}));
        let s = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        compile_schema(&s.to_string()).unwrap_err()
    });
    assert_eq!(e.keyword, "(nesting)");
}

#[test]
fn very_deep_instances_are_refused_not_overflows() {
    for schema in [
        json!(true),
        json!({"type": "array"}),
        json!({"type": "array", "uniqueItems": true}),
    ] {
        let text = schema.to_string();
        let results = on_small_stack(move || {
            let c = Compiled::new(&compile_schema(&text).unwrap());
            [10usize, 100, 200, 5_000, 100_000]
                .iter()
                .map(|&n| Matcher::matches(&c, &format!("{}{}", "[".repeat(n), "]".repeat(n))))
                .collect::<Vec<bool>>()
        });
        assert_eq!(&results[..2], &[true, true], "{schema}");
        // Past the matcher's stack bound (and serde_json's, for validated grammars): refused.
        assert!(!results[4], "{schema}");
    }
}

#[test]
fn deep_patterns_and_grammars_are_errors() {
    let pattern = format!("{}a{}", "(".repeat(50_000), ")".repeat(50_000));
    let schema = json!({"type": "string", "pattern": pattern}).to_string();
    // The pattern is relaxed (too deep for the grammar) and checked by the validator — or
    // the validator refuses it: either way an answer.
    let _ = on_small_stack(move || compile_schema(&schema).map(|g| Compiled::new(&g)));
    let grammar = format!("root ::= {}\"a\"{}", "(".repeat(50_000), ")".repeat(50_000));
    assert!(on_small_stack(move || parse(&grammar).is_err()));
}

/// A grammar of a long chain of rules, each starting with the next: the left-recursion
/// check walks the chain without recursing on the stack, and the whole chain is parsed in
/// linear time (positions and nullability were once rescanned per rule).
#[test]
fn long_rule_chains_parse_on_a_small_stack() {
    let n = 100_000;
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i} ::= r{} \"b\" | \"a\"\n", i + 1));
    }
    g.push_str(&format!("r{n} ::= \"a\"?\n"));
    let parsed = on_small_stack(move || parse(&g).map(|g| g.rules.len()));
    assert_eq!(parsed.unwrap(), n + 2);
    // The same chain closed into a loop is left recursion, found and named.
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i} ::= r{} \"b\" | \"a\"\n", i + 1));
    }
    g.push_str(&format!("r{n} ::= r0 | \"a\"\n"));
    let err = on_small_stack(move || parse(&g).err()).expect("left recursion");
    assert!(err.msg.contains("left recursion"), "{err}");
}
