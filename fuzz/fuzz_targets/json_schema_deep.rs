//! Deep and recursive JSON Schemas built from the fuzzer's bytes (each byte picks the next
//! keyword: nested objects/arrays, `$ref` into `$defs` — also inside `allOf` — anyOf, oneOf,
//! not, if/then/else, patternProperties…). Conversion and matching never abort; whatever is
//! accepted as a complete text validates against the schema (the `jsonschema` crate, used by
//! `Matcher::matches` for relaxed grammars) or is accepted by an exact grammar.
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};

struct Bytes<'a>(&'a [u8], usize);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        let b = self.0.get(self.1).copied().unwrap_or(0);
        self.1 += 1;
        b
    }
}

fn schema(b: &mut Bytes, depth: u32) -> Value {
    if depth > 200 || b.1 >= b.0.len() {
        return json!({"type": "integer"});
    }
    let d = depth + 1;
    let def = format!("#/$defs/d{}", b.next() % 3);
    match b.next() % 14 {
        0 => json!({"type": "array", "items": schema(b, d)}),
        1 => json!({"type": "object", "properties": {"a": schema(b, d), "b": schema(b, d)}, "required": ["a"]}),
        2 => json!({"anyOf": [schema(b, d), schema(b, d)]}),
        3 => json!({"oneOf": [schema(b, d), schema(b, d)]}),
        4 => json!({"allOf": [{"$ref": def}, schema(b, d)]}),
        5 => json!({"$ref": def}),
        6 => json!({"not": schema(b, d)}),
        7 => json!({"if": schema(b, d), "then": schema(b, d)}),
        8 => json!({"patternProperties": {"^x": schema(b, d)}, "additionalProperties": false}),
        9 => json!({"prefixItems": [schema(b, d)], "items": false}),
        10 => json!({"type": "string", "maxLength": b.next()}),
        11 => json!({"enum": [1, "a", null]}),
        12 => json!({"type": "number", "minimum": 0.5, "maximum": 1e20}),
        _ => json!(true),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data, 0);
    let mut defs = Map::new();
    for i in 0..3 {
        defs.insert(format!("d{i}"), schema(&mut b, 0));
    }
    let mut s = schema(&mut b, 0);
    if let Value::Object(o) = &mut s {
        o.insert("$defs".into(), Value::Object(defs));
    }
    let Ok(g) = coli_grammar::compile_schema(&s.to_string()) else {
        return;
    };
    let c = coli_grammar::Compiled::new(&g);
    let _ = c.matcher().forced_bytes(64);
    let v = coli_grammar::validator_for(&s).expect("the validator takes a converted schema");
    for t in ["1", "\"a\"", "null", "[]", "[1]", "{}", r#"{"a":1}"#, r#"{"a":[1],"b":"x"}"#] {
        if coli_grammar::Matcher::matches(&c, t) {
            assert!(v.is_valid(&serde_json::from_str(t).unwrap()), "{s} accepted {t}");
        }
    }
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let _ = coli_grammar::Matcher::matches(&c, &deep);
});
