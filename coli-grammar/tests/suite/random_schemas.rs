//! Seeded random schemas — deep, recursive (`$ref` into `$defs`, also inside `allOf`),
//! with every kind of keyword — through the public entry point (`compile_schema`,
//! `Compiled`, `Matcher::matches`), on a 2 MiB stack. Whatever converts must agree with the
//! independent validator (the `jsonschema` crate) on random instances: nothing invalid is
//! ever accepted, and exact grammars (no relaxation) accept every valid instance.

use coli_grammar::schema::jsonschema_validator;
use coli_grammar::{compile_schema, Compiled, Matcher};
use serde_json::{json, Map, Value};

/// xorshift64*: a fixed, dependency-free generator (reproducible on every platform).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

const NAMES: [&str; 5] = ["a", "b", "c", "kind", "x"];
const DEFS: [&str; 3] = ["d0", "d1", "d2"];

fn schema(r: &mut Rng, depth: u32) -> Value {
    if depth == 0 || r.below(4) == 0 {
        return leaf(r);
    }
    let d = depth - 1;
    let mut s = match r.below(12) {
        0 => json!({"type": "object"}),
        1 => {
            let mut props = Map::new();
            for _ in 0..r.below(4) {
                props.insert(r.pick(&NAMES).to_string(), schema(r, d));
            }
            let req: Vec<&str> = props
                .keys()
                .filter(|_| r.below(2) == 0)
                .map(String::as_str)
                .collect();
            let mut o = json!({"type": "object", "properties": props.clone(), "required": req});
            match r.below(4) {
                0 => o["additionalProperties"] = json!(false),
                1 => o["additionalProperties"] = schema(r, d),
                2 => o["patternProperties"] = json!({"^x": schema(r, d)}),
                _ => {}
            }
            o
        }
        2 => {
            json!({"type": "array", "items": schema(r, d), "minItems": r.below(2), "maxItems": 1 + r.below(3)})
        }
        3 => {
            json!({"prefixItems": [schema(r, d), schema(r, d)], "items": if r.below(2) == 0 { json!(false) } else { schema(r, d) }})
        }
        4 => json!({"anyOf": [schema(r, d), schema(r, d)]}),
        5 => json!({"oneOf": [schema(r, d), schema(r, d)]}),
        6 => json!({"allOf": [schema(r, d), schema(r, d)]}),
        7 => json!({"$ref": format!("#/$defs/{}", r.pick(&DEFS))}),
        8 => json!({"allOf": [{"$ref": format!("#/$defs/{}", r.pick(&DEFS))}, schema(r, d)]}),
        9 => json!({"not": schema(r, d)}),
        10 => json!({"if": schema(r, d), "then": schema(r, d), "else": schema(r, d)}),
        _ => json!({"type": ["array", "object", "null"], "minProperties": 1, "uniqueItems": true}),
    };
    if r.below(6) == 0 {
        s["x-vendor"] = json!(true);
    }
    s
}

fn leaf(r: &mut Rng) -> Value {
    match r.below(14) {
        0 => json!({"type": "string"}),
        1 => json!({"type": "string", "minLength": 1, "maxLength": 3}),
        2 => json!({"type": "string", "pattern": "^[ab]+$"}),
        3 => json!({"type": "integer", "minimum": -2, "maximum": 5}),
        4 => json!({"type": "integer", "multipleOf": 2}),
        5 => json!({"type": "number", "exclusiveMinimum": 0.5}),
        6 => json!({"type": "boolean"}),
        7 => json!({"type": "null"}),
        8 => json!({"enum": ["a", 1, null, [1], {"a": 1}]}),
        9 => json!({"const": "b"}),
        10 => json!(true),
        11 => json!({"type": ["integer", "string"]}),
        12 => json!({"format": "date"}),
        _ => json!({}),
    }
}

fn instance(r: &mut Rng, depth: u32) -> Value {
    match if depth == 0 { r.below(7) } else { r.below(9) } {
        0 => Value::Null,
        1 => json!(r.below(2) == 0),
        2 => json!(r.below(9) as i64 - 3),
        3 => json!([0.25, 1.5, 0.75, 2.0][r.below(4) as usize]),
        4 => json!(["a", "b", "ab", "", "abcd", "2024-02-29"][r.below(6) as usize]),
        5 => json!(r.pick(&NAMES).to_string()),
        6 => json!({"a": 1}),
        7 => {
            let n = r.below(4);
            Value::Array((0..n).map(|_| instance(r, depth - 1)).collect())
        }
        _ => {
            let mut m = Map::new();
            for _ in 0..r.below(4) {
                m.insert(r.pick(&NAMES).to_string(), instance(r, depth - 1));
            }
            Value::Object(m)
        }
    }
}

#[test]
fn seeded_random_schemas_agree_with_the_validator() {
    let stats = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(run)
        .unwrap()
        .join()
        .expect("no panic, no overflow");
    let (schemas, converted, checked, valid_accepted) = stats;
    eprintln!("{converted}/{schemas} schemas converted, {checked} texts checked, {valid_accepted} valid ones accepted");
    assert!(
        converted * 4 >= schemas * 3,
        "{converted} of {schemas} converted"
    );
    assert!(
        checked > 10_000 && valid_accepted > 1000,
        "{checked} {valid_accepted}"
    );
}

/// Schemas tried: 400, or `COLI_RANDOM_SCHEMAS` (a longer local run).
fn run() -> (usize, usize, usize, usize) {
    let n: usize = std::env::var("COLI_RANDOM_SCHEMAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut r = Rng(0x5EED_0017);
    let (mut converted, mut checked, mut valid_accepted) = (0, 0, 0);
    for i in 0..n {
        let mut defs = Map::new();
        for d in DEFS {
            defs.insert(d.to_string(), schema(&mut r, 3));
        }
        let mut s = schema(&mut r, 1 + (i % 6) as u32);
        if let Value::Object(o) = &mut s {
            o.insert("$defs".into(), Value::Object(defs));
        }
        let text = s.to_string();
        let g = match compile_schema(&text) {
            Ok(g) => g,
            Err(e) => {
                // Only a schema that accepts nothing, one that refers to itself without
                // consuming input, or one whose expansion goes past the nesting bound
                // (a reference cycle through oneOf/anyOf and allOf) may be refused.
                assert!(
                    e.msg.starts_with("accepts nothing")
                        || e.msg.contains("left recursion")
                        || e.msg.starts_with("refers to itself")
                        || e.keyword == "(nesting)",
                    "{text}: {e}"
                );
                continue;
            }
        };
        converted += 1;
        let c = Compiled::new(&g);
        let exact = c.relaxations().is_empty();
        let v = jsonschema_validator(&s, None, true).expect("the validator takes the schema");
        for _ in 0..40 {
            let inst = instance(&mut r, 3);
            let want = v.is_valid(&inst);
            for t in [
                inst.to_string(),
                serde_json::to_string_pretty(&inst).unwrap(),
            ] {
                let got = Matcher::matches(&c, &t);
                checked += 1;
                assert!(!got || want, "schema {text}\naccepted invalid {t}");
                if exact {
                    assert_eq!(got, want, "schema {text}\nexact grammar refuses valid {t}");
                }
                valid_accepted += (got && want) as usize;
            }
        }
    }
    (n, converted, checked, valid_accepted)
}
