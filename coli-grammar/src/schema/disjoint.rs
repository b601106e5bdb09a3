//! When `oneOf` is exact as `anyOf`: no value can match two branches. Proven for branches
//! of different JSON types, and for object branches that require a property whose
//! `const`/`enum` values differ (a discriminator). Otherwise the grammar relaxes `oneOf`.

use super::visit::type_of;
use super::Conv;
use serde_json::{Map, Value};

const NULL: u8 = 1;
const BOOLEAN: u8 = 2;
const OBJECT: u8 = 4;
const ARRAY: u8 = 8;
const STRING: u8 = 16;
const INTEGER: u8 = 32;
/// Numbers that are not integers.
const FRACTION: u8 = 64;
const ALL: u8 = 127;

fn type_bits(t: &str) -> u8 {
    match t {
        "null" => NULL,
        "boolean" => BOOLEAN,
        "object" => OBJECT,
        "array" => ARRAY,
        "string" => STRING,
        "integer" => INTEGER,
        "number" => INTEGER | FRACTION,
        _ => ALL,
    }
}

fn value_bits(v: &Value) -> u8 {
    match type_of(v) {
        "number" => FRACTION,
        t => type_bits(t),
    }
}

impl Conv<'_> {
    /// Whether no instance matches two of `branches` (each also under `rest`).
    pub(crate) fn disjoint(&self, branches: &[Value], rest: &Map<String, Value>) -> bool {
        let rest_bits = self.kinds(&Value::Object(rest.clone()), 0);
        let bs: Vec<(u8, Option<&Map<String, Value>>)> = branches
            .iter()
            .map(|b| {
                let b = self.follow(b);
                (self.kinds(b, 0) & rest_bits, b.as_object())
            })
            .collect();
        for i in 0..bs.len() {
            for j in i + 1..bs.len() {
                let common = bs[i].0 & bs[j].0;
                if common == 0 {
                    continue;
                }
                let told_apart = common == OBJECT
                    && match (bs[i].1, bs[j].1) {
                        (Some(a), Some(b)) => discriminated(self, a, b, rest),
                        _ => false,
                    };
                if !told_apart {
                    return false;
                }
            }
        }
        true
    }

    /// `s` with a pure `$ref` followed (a few steps).
    fn follow<'v>(&'v self, mut s: &'v Value) -> &'v Value {
        for _ in 0..8 {
            match s.as_object() {
                Some(o)
                    if o.len() == 1
                        || o.keys()
                            .all(|k| !super::keywords::constrains(k) || k == "$ref") =>
                {
                    match o
                        .get("$ref")
                        .and_then(Value::as_str)
                        .and_then(|r| self.resolve(r, "").ok())
                    {
                        Some(t) => s = t,
                        None => return s,
                    }
                }
                _ => return s,
            }
        }
        s
    }

    /// The JSON types `s` may accept (a superset).
    fn kinds(&self, s: &Value, depth: usize) -> u8 {
        let o = match s {
            Value::Bool(b) => return if *b { ALL } else { 0 },
            Value::Object(o) => o,
            _ => return ALL,
        };
        if depth > 16 {
            return ALL;
        }
        let mut k = ALL;
        if let Some(c) = o.get("const") {
            k &= value_bits(c);
        }
        if let Some(e) = o.get("enum").and_then(Value::as_array) {
            k &= e.iter().fold(0, |acc, v| acc | value_bits(v));
        }
        match o.get("type") {
            Some(Value::String(t)) => k &= type_bits(t),
            Some(Value::Array(ts)) => {
                k &= ts
                    .iter()
                    .fold(0, |acc, t| acc | type_bits(t.as_str().unwrap_or("")))
            }
            _ => {}
        }
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            if let Ok(t) = self.resolve(r, "") {
                k &= self.kinds(t, depth + 1);
            }
        }
        for p in o
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            k &= self.kinds(p, depth + 1);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(bs) = o.get(key).and_then(Value::as_array) {
                k &= bs.iter().fold(0, |acc, b| acc | self.kinds(b, depth + 1));
            }
        }
        k
    }
}

/// Whether objects valid against `a` and `b` (under `rest`) always differ in a property
/// both require, whose allowed values (`const`/`enum`) share nothing.
fn discriminated(
    c: &Conv,
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    rest: &Map<String, Value>,
) -> bool {
    let required = |o: &Map<String, Value>, p: &str| {
        [o, rest].iter().any(|o| {
            o.get("required")
                .and_then(Value::as_array)
                .is_some_and(|r| r.iter().any(|n| n == p))
        })
    };
    let values = |o: &Map<String, Value>, p: &str| -> Option<Vec<Value>> {
        let s = c.follow(o.get("properties")?.get(p)?);
        let s = s.as_object()?;
        if let Some(v) = s.get("const") {
            return Some(vec![v.clone()]);
        }
        s.get("enum").and_then(Value::as_array).cloned()
    };
    // A member one requires and the other forbids.
    let forbids = |o: &Map<String, Value>, p: &str| {
        o.get("additionalProperties") == Some(&Value::Bool(false))
            && !o.contains_key("patternProperties")
            && !o
                .get("properties")
                .and_then(Value::as_object)
                .is_some_and(|m| m.contains_key(p))
    };
    let names = |o: &Map<String, Value>| -> Vec<String> {
        o.get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect()
    };
    if names(a).iter().any(|p| forbids(b, p)) || names(b).iter().any(|p| forbids(a, p)) {
        return true;
    }
    let Some(props) = a.get("properties").and_then(Value::as_object) else {
        return false;
    };
    props.keys().any(|p| {
        if !required(a, p) || !required(b, p) {
            return false;
        }
        match (values(a, p), values(b, p)) {
            (Some(x), Some(y)) => !x.iter().any(|v| y.contains(v)),
            _ => false,
        }
    })
}
