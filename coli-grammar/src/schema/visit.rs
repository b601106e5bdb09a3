//! The walk over a schema: keywords sorted out, then `$ref`, `allOf`, `anyOf`/`oneOf`,
//! `const`/`enum`, and one alternative per type.

use super::keywords::{kind, Kind};
use super::{
    err, pointer_child, Conv, SchemaError, SchemaNote, MAX_NESTING, MAX_WORK, MEMO_MIN_BYTES,
};
use serde_json::{Map, Value};

/// The message of errors that mean "this schema accepts nothing" (dropped from `anyOf`).
pub(crate) const EMPTY: &str = "accepts nothing";

/// An error meaning the schema at `path` accepts no value.
pub(crate) fn empty<T>(path: &str, keyword: &str, why: &str) -> Result<T, SchemaError> {
    err(path, keyword, format!("{EMPTY}: {why}"))
}

/// A GBNF expression that matches nothing.
const NOTHING: &str = "[^\\x00-\\U0010FFFF]";

/// The message of errors about a schema that refers to itself without consuming input.
pub(crate) const CYCLE: &str = "refers to itself";

fn is_hard(e: &SchemaError) -> bool {
    e.msg.starts_with(EMPTY)
        || e.msg.starts_with(CYCLE)
        || e.keyword == "(nesting)"
        || e.keyword == "(size)"
}

pub(crate) fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl Conv<'_> {
    /// GBNF for any JSON text valid against `s` (or a superset, recorded as a relaxation).
    /// A subschema the grammar cannot express becomes "any value", relaxed; a schema that
    /// accepts nothing, or one too deep or too large, is an error.
    pub(crate) fn visit(&mut self, s: &Value, path: &str) -> Result<String, SchemaError> {
        self.work += 1;
        if self.over_budget() {
            return err(
                path,
                "(size)",
                format!("the schema is too large (more than {MAX_WORK} subschemas or its grammar too long)"),
            );
        }
        if self.depth >= MAX_NESTING {
            return err(
                path,
                "(nesting)",
                format!("schemas nested or referenced deeper than {MAX_NESTING}"),
            );
        }
        // A subschema met again (real schemas repeat the same inline objects dozens of
        // times) reuses its rule, and its notes (warnings, relaxations) are noted again
        // at the new path. When a note lies outside the subschema (behind a `$ref`), the
        // subschema is converted again instead.
        let key = match s {
            Value::Object(o) if o.len() > 1 => {
                let mut k = String::new();
                memo_key(s, &mut k);
                Some(k).filter(|k| k.len() >= MEMO_MIN_BYTES)
            }
            _ => None,
        };
        if let Some((rule, notes)) = key.as_ref().and_then(|k| self.seen.get(k)).cloned() {
            for (warning, n) in notes {
                let at = format!("{path}{}", n.path);
                if warning {
                    self.warn(&at, &n.keyword, n.msg);
                } else {
                    self.relax(&at, &n.keyword, n.msg);
                }
            }
            return Ok(rule);
        }
        let (w0, r0) = (self.warnings.len(), self.relaxations.len());
        self.depth += 1;
        let r = self.visit_inner(s, path);
        self.depth -= 1;
        if let (Some(k), Ok(rule)) = (key, &r) {
            let notes: Vec<(bool, SchemaNote)> = self.warnings[w0..]
                .iter()
                .map(|n| (true, n))
                .chain(self.relaxations[r0..].iter().map(|n| (false, n)))
                .map(|(w, n)| {
                    let rel = n.path.strip_prefix(path).map(|p| SchemaNote {
                        path: p.to_string(),
                        ..n.clone()
                    });
                    (w, rel)
                })
                .filter_map(|(w, n)| Some((w, n?)))
                .collect();
            if notes.len() == self.warnings.len() - w0 + self.relaxations.len() - r0 {
                self.seen.insert(k, (rule.clone(), notes));
            }
        }
        match r {
            Err(e) if !is_hard(&e) => {
                self.relax(
                    &e.path,
                    &e.keyword,
                    format!(
                        "{} — any value accepted here; the finished text is validated",
                        e.msg
                    ),
                );
                Ok(self.prim("value"))
            }
            r => r,
        }
    }

    fn visit_inner(&mut self, s: &Value, path: &str) -> Result<String, SchemaError> {
        let o = match s {
            Value::Bool(true) => return Ok(self.prim("value")),
            Value::Bool(false) => return empty(path, "false", "the schema `false`"),
            Value::Object(o) => o,
            _ => return err(path, "(schema)", "a schema must be an object or a boolean"),
        };
        for (k, v) in o {
            match kind(k) {
                Kind::Unknown => self.warn(path, k, "unknown keyword ignored"),
                Kind::Relaxed if !is_no_op(k, v) => self.relax(
                    path,
                    k,
                    "not expressed in the grammar; the finished text is validated",
                ),
                _ => {}
            }
        }
        let converted = |o: &Map<String, Value>, except: &[&str]| {
            o.keys()
                .any(|k| kind(k) == Kind::Converted && !except.contains(&k.as_str()))
        };
        if let Some(r) = o.get("$ref") {
            let Some(r) = r.as_str() else {
                return err(path, "$ref", "must be a string");
            };
            if converted(o, &["$ref"]) {
                // $ref beside other keywords: both must hold.
                let merged = self.merge_all(std::slice::from_ref(s), path)?;
                return self.visit_merged(&merged, path);
            }
            return self.visit_ref(r, path);
        }
        if o.contains_key("allOf") {
            let merged = self.merge_all(std::slice::from_ref(s), &pointer_child(path, "allOf"))?;
            return self.visit_merged(&merged, path);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(any) = o.get(key) {
                return self.any_of(o, key, any, path);
            }
        }
        let types = self.types(o, path)?;
        if let Some(c) = o.get("const") {
            if types.as_ref().is_some_and(|t| !type_fits(t, type_of(c))) {
                return empty(path, "const", "the value does not have the schema's type");
            }
            if let Some(e) = o.get("enum").and_then(Value::as_array) {
                if !e.contains(c) {
                    return empty(path, "const", "the value is not in the enum");
                }
            }
            if converted(o, &["const", "type", "enum"]) {
                self.relax(
                    path,
                    "const",
                    "other keywords beside const are checked after generation",
                );
            }
            return Ok(self.literal(c));
        }
        if let Some(e) = o.get("enum") {
            let Some(values) = e.as_array().filter(|a| !a.is_empty()) else {
                return err(path, "enum", "must be a non-empty array");
            };
            let alts: Vec<String> = values
                .iter()
                .filter(|v| types.as_ref().is_none_or(|t| type_fits(t, type_of(v))))
                .map(|v| self.literal(v))
                .collect();
            if alts.is_empty() {
                return empty(path, "enum", "no value has the schema's type");
            }
            if converted(o, &["type", "enum"]) {
                self.relax(
                    path,
                    "enum",
                    "other keywords beside enum are checked after generation",
                );
            }
            return Ok(format!("( {} )", alts.join(" | ")));
        }
        let types =
            types.unwrap_or_else(|| vec!["object", "array", "string", "number", "boolean", "null"]);
        let mut alts = Vec::new();
        for t in &types {
            let alt = match *t {
                "object" => self.object(o, path),
                "array" => self.array(o, path),
                "string" => self.string(o, path),
                "integer" => self.integer(o, path),
                "number" => self.number(o, path),
                "boolean" => Ok(self.prim("boolean")),
                "null" => Ok(self.prim("null")),
                _ => unreachable!("checked in types()"),
            };
            match alt {
                Ok(a) => alts.push(a),
                Err(e) if e.msg.starts_with(EMPTY) && types.len() > 1 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else if alts.is_empty() {
            return empty(path, "type", "no type has a value");
        } else {
            format!("( {} )", alts.join(" | "))
        })
    }

    /// A rule for the schema `#/...`, converted once.
    fn visit_ref(&mut self, r: &str, path: &str) -> Result<String, SchemaError> {
        if let Some(name) = self.refs.get(r) {
            return Ok(name.clone());
        }
        let target = self.resolve(r, path)?;
        let name = self.fresh_name(
            r.trim_start_matches("#/")
                .trim_start_matches("$defs/")
                .trim_start_matches("definitions/"),
        );
        self.refs.insert(r.to_string(), name.clone());
        let idx = self.rules.len();
        self.push_rule(name.clone(), String::new());
        let body = self.visit(target, &r[1..]);
        self.fill(idx, body)?;
        Ok(name)
    }

    /// A rule for a schema built by merging, converted once per distinct schema (a
    /// recursion through `allOf` meets the same merged schema again and ends there).
    pub(crate) fn visit_merged(
        &mut self,
        merged: &Value,
        path: &str,
    ) -> Result<String, SchemaError> {
        let key = strip(merged).to_string();
        if let Some(name) = self.merged.get(&key) {
            return Ok(name.clone());
        }
        let name = self.fresh_name(&format!("{path}-all"));
        self.merged.insert(key, name.clone());
        let idx = self.rules.len();
        self.push_rule(name.clone(), String::new());
        let body = self.visit(merged, path);
        self.fill(idx, body)?;
        Ok(name)
    }

    /// Gives the rule made before its body its body; when the schema accepts nothing (the
    /// error goes on), a body that matches nothing, for the references already made.
    fn fill(&mut self, idx: usize, body: Result<String, SchemaError>) -> Result<(), SchemaError> {
        let (text, r) = match body {
            Ok(b) => (b, Ok(())),
            Err(e) => (NOTHING.to_string(), Err(e)),
        };
        self.size += text.len();
        self.rules[idx].1 = text;
        r
    }

    fn any_of(
        &mut self,
        o: &Map<String, Value>,
        key: &str,
        any: &Value,
        path: &str,
    ) -> Result<String, SchemaError> {
        let Some(branches) = any.as_array().filter(|a| !a.is_empty()) else {
            return err(path, key, "must be a non-empty array");
        };
        let mut rest = o.clone();
        rest.remove(key);
        let rest_constrains = rest.keys().any(|k| kind(k) == Kind::Converted);
        if key == "oneOf" && !self.disjoint(branches, &rest) {
            self.relax(
                path,
                "oneOf",
                "the branches may overlap: the grammar accepts any branch, the finished text is validated to match exactly one",
            );
        }
        // A branch that adds nothing to the rest of the schema makes the union the rest
        // itself (what its relaxed keywords remove is validated).
        let base = if rest_constrains {
            strip(
                &self
                    .merge_all(&[Value::Object(rest.clone())], path)
                    .unwrap_or(Value::Null),
            )
        } else {
            Value::Object(Map::new())
        };
        for (i, b) in branches.iter().enumerate() {
            let bp = pointer_child(&pointer_child(path, key), &i.to_string());
            if let Ok(m) = self.merge_all(&[b.clone(), Value::Object(rest.clone())], &bp) {
                if strip(&m) == base {
                    return self.visit_merged(&m, &bp);
                }
            }
        }
        let mut alts = Vec::new();
        let mut last_err = None;
        for (i, b) in branches.iter().enumerate() {
            let bp = pointer_child(&pointer_child(path, key), &i.to_string());
            let r = if rest_constrains {
                let mut parts = vec![b.clone(), Value::Object(rest.clone())];
                parts.retain(|p| p != &Value::Bool(true));
                self.merge_all(&parts, &bp)
                    .and_then(|m| self.visit_merged(&m, &bp))
            } else {
                self.visit(b, &bp)
            };
            match r {
                Ok(a) => {
                    if !alts.contains(&a) {
                        alts.push(a)
                    }
                }
                Err(e) if e.msg.starts_with(EMPTY) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        if alts.is_empty() {
            return Err(last_err.expect("some branch"));
        }
        Ok(format!("( {} )", alts.join(" | ")))
    }

    fn types(
        &self,
        o: &Map<String, Value>,
        path: &str,
    ) -> Result<Option<Vec<&'static str>>, SchemaError> {
        const TYPES: [&str; 7] = [
            "object", "array", "string", "integer", "number", "boolean", "null",
        ];
        let one = |v: &Value| -> Result<&'static str, SchemaError> {
            let s = v.as_str().unwrap_or("");
            match TYPES.iter().find(|t| **t == s) {
                Some(t) => Ok(t),
                None => err(path, "type", format!("unknown type {v}")),
            }
        };
        Ok(match o.get("type") {
            None => None,
            Some(Value::Array(a)) if !a.is_empty() => {
                let mut v: Vec<&'static str> = Vec::new();
                for t in a {
                    let t = one(t)?;
                    if !v.contains(&t) {
                        v.push(t);
                    }
                }
                if v.contains(&"number") {
                    v.retain(|t| *t != "integer");
                }
                Some(v)
            }
            Some(t) => Some(vec![one(t)?]),
        })
    }

    /// GBNF for exactly the JSON value `v` (members and items may be spaced).
    pub(crate) fn literal(&mut self, v: &Value) -> String {
        match v {
            Value::Array(a) if !a.is_empty() => {
                let ws = self.prim("ws");
                let items: Vec<String> = a
                    .iter()
                    .map(|x| format!("{} {ws}", self.literal(x)))
                    .collect();
                format!("\"[\" {ws} {} \"]\"", items.join(&format!(" \",\" {ws} ")))
            }
            Value::Object(m) if !m.is_empty() => {
                let ws = self.prim("ws");
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, x)| {
                        format!(
                            "{} {ws} \":\" {ws} {} {ws}",
                            super::lit(&Value::String(k.clone()).to_string()),
                            self.literal(x)
                        )
                    })
                    .collect();
                format!(
                    "\"{{\" {ws} {} \"}}\"",
                    items.join(&format!(" \",\" {ws} "))
                )
            }
            Value::Array(_) => format!("\"[\" {} \"]\"", self.prim("ws")),
            Value::Object(_) => format!("\"{{\" {} \"}}\"", self.prim("ws")),
            v => super::lit(&v.to_string()),
        }
    }
}

/// Whether a value of JSON type `vt` has one of the types `t`.
fn type_fits(t: &[&str], vt: &str) -> bool {
    t.iter()
        .any(|t| *t == vt || (*t == "number" && vt == "integer"))
}

/// Relaxed keywords whose value constrains nothing.
fn is_no_op(k: &str, v: &Value) -> bool {
    match k {
        "uniqueItems" => v == &Value::Bool(false),
        "minProperties" => v.as_u64() == Some(0),
        "dependencies" | "dependentRequired" | "dependentSchemas" => {
            v.as_object().is_some_and(|m| m.is_empty())
        }
        _ => false,
    }
}

/// `s` without its top-level relaxed keywords (they do not change the grammar).
fn strip(s: &Value) -> Value {
    match s {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| kind(k) != Kind::Relaxed)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        s => s.clone(),
    }
}

/// The text of schema `v` without its annotations (`title`, `description`, `default`,
/// ...), which the conversion ignores: two subschemas with the same key convert to the
/// same grammar. Keywords are told apart from member names: `properties` maps names to
/// schemas, and `enum`, `const` and the like are data, kept whole.
fn memo_key(v: &Value, out: &mut String) {
    let Value::Object(o) = v else {
        out.push_str(&v.to_string());
        return;
    };
    out.push('{');
    for (k, x) in o {
        if kind(k) == Kind::Annotation {
            continue;
        }
        out.push_str(&Value::String(k.clone()).to_string());
        out.push(':');
        match (k.as_str(), x) {
            (
                "properties" | "patternProperties" | "dependentSchemas" | "dependencies",
                Value::Object(m),
            ) => {
                out.push('{');
                for (name, sub) in m {
                    out.push_str(&Value::String(name.clone()).to_string());
                    out.push(':');
                    memo_key(sub, out);
                    out.push(',');
                }
                out.push('}');
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems" | "items", Value::Array(a)) => {
                out.push('[');
                for sub in a {
                    memo_key(sub, out);
                    out.push(',');
                }
                out.push(']');
            }
            (
                "items"
                | "additionalProperties"
                | "additionalItems"
                | "not"
                | "if"
                | "then"
                | "else"
                | "contains"
                | "propertyNames"
                | "unevaluatedProperties"
                | "unevaluatedItems",
                _,
            ) => memo_key(x, out),
            _ => out.push_str(&x.to_string()),
        }
        out.push(',');
    }
    out.push('}');
}
