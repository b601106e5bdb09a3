//! JSON Schema → GBNF.
//!
//! The grammar accepts JSON text that validates against the schema, with these deliberate
//! restrictions on *spelling* (never on meaning): object members appear in the schema's
//! declared order (optional ones may be left out, additional ones come last and never
//! repeat a declared name), whitespace between tokens is at most one space or a newline and
//! 20 spaces/tabs of indentation, numbers have at most 16 integral and 16 fractional digits
//! and a two-digit exponent, `\u` escapes never encode surrogates, and strings constrained
//! by `pattern`/`format`/keys of additional properties use each character's plain JSON
//! spelling.
//!
//! Keywords: `type` (also arrays of types), `properties`, `required`,
//! `additionalProperties` (false unless given: strict), `items` (a schema, or an array in
//! the pre-2020 tuple form), `prefixItems` (no further items unless `items` allows them),
//! `minItems`, `maxItems`, `enum`, `const`, `anyOf`, `oneOf` (as anyOf), `allOf` (merged
//! when the parts merge cleanly), `$ref` to `#/...` pointers (into `$defs`/`definitions`,
//! recursion allowed), string `minLength`/`maxLength`/`pattern`/`format` (date, time,
//! date-time, uuid, email, ipv4, uri), integer and number `minimum`/`maximum`/
//! `exclusiveMinimum`/`exclusiveMaximum` (integral bounds for numbers). Ignored
//! annotations: `title`, `description`, `examples`, `default`, `$schema`, `$id`,
//! `$comment`, `deprecated`, `readOnly`, `writeOnly`. Any other keyword is an error naming
//! it and its location: a constraint is never silently dropped.

use crate::gbnf::{parse, show, Expr, Grammar};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

/// A schema the converter cannot honour, and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("JSON Schema at {}: {keyword:?}: {msg}", if path.is_empty() { "the root" } else { path })]
pub struct SchemaError {
    /// JSON Pointer to the schema object (empty for the root).
    pub path: String,
    /// The keyword at fault.
    pub keyword: String,
    /// What is wrong.
    pub msg: String,
}

fn err<T>(path: &str, keyword: &str, msg: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError {
        path: path.to_string(),
        keyword: keyword.to_string(),
        msg: msg.into(),
    })
}

const IGNORED: &[&str] = &[
    "title",
    "description",
    "examples",
    "default",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
];

const HANDLED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "definitions",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

/// Most digits of an unbounded integer's magnitude.
const MAX_DIGITS: u32 = 16;

/// The primitive rules, emitted when used.
const PRIMITIVES: &[(&str, &str)] = &[
    ("ws", r#""" | " " | "\n" [ \t]{0,20}"#),
    ("value", "object | array | string | number | boolean | null"),
    (
        "object",
        r#""{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}""#,
    ),
    ("array", r#""[" ws ( value ws ( "," ws value ws )* )? "]""#),
    ("string", r#""\"" char* "\"""#),
    (
        "char",
        r#"[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )"#,
    ),
    ("number", r#"integer frac? exp?"#),
    ("integer", r#""-"? ( "0" | [1-9] [0-9]{0,15} )"#),
    ("frac", r#""." [0-9]{1,16}"#),
    ("exp", r#"[eE] [-+]? [0-9]{1,2}"#),
    ("boolean", r#""true" | "false""#),
    ("null", r#""null""#),
    ("kchar", r#"[^"\\\x00-\x1F]"#),
];

fn prim_deps(name: &str) -> &'static [&'static str] {
    match name {
        "value" => &["object", "array", "string", "number", "boolean", "null"],
        "object" => &["ws", "string", "value"],
        "array" => &["ws", "value"],
        "string" => &["char"],
        "number" => &["integer", "frac", "exp"],
        _ => &[],
    }
}

/// A GBNF string literal for `s` (the grammar printer's spelling).
fn lit(s: &str) -> String {
    show(&Expr::Literal(s.chars().collect()), &[])
}

struct Conv<'a> {
    root: &'a Value,
    rules: Vec<(String, String)>,
    taken: HashSet<String>,
    refs: HashMap<String, String>,
    prims: Vec<&'static str>,
}

fn type_of(v: &Value) -> &'static str {
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

fn pointer_child(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

impl<'a> Conv<'a> {
    fn prim(&mut self, name: &'static str) -> String {
        if !self.prims.contains(&name) {
            self.prims.push(name);
            for d in prim_deps(name) {
                self.prim(d);
            }
        }
        name.to_string()
    }

    fn fresh_name(&mut self, hint: &str) -> String {
        let base: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect::<String>()
            .split('-')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("-");
        let base = if base.is_empty() {
            "r".to_string()
        } else {
            format!("r-{base}")
        };
        let mut name = base.clone();
        let mut n = 1;
        while self.taken.contains(&name) {
            n += 1;
            name = format!("{base}-v{n}");
        }
        self.taken.insert(name.clone());
        name
    }

    fn add_rule(&mut self, hint: &str, body: String) -> String {
        let name = self.fresh_name(hint);
        self.rules.push((name.clone(), body));
        name
    }

    fn resolve(&self, reference: &str, path: &str) -> Result<&'a Value, SchemaError> {
        let Some(ptr) = reference.strip_prefix('#') else {
            return err(
                path,
                "$ref",
                format!("only local references (#/...) are supported, not {reference:?}"),
            );
        };
        let ptr = ptr.replace("%25", "%");
        match self.root.pointer(&ptr) {
            Some(v) => Ok(v),
            None => err(path, "$ref", format!("{reference:?} points at nothing")),
        }
    }

    /// The schema with `$ref`s followed (for merging).
    fn deref(&self, s: &Value, path: &str) -> Result<Value, SchemaError> {
        let mut s = s.clone();
        for _ in 0..64 {
            match s.get("$ref").and_then(Value::as_str) {
                Some(r)
                    if s.as_object().is_some_and(|o| {
                        o.keys()
                            .all(|k| k == "$ref" || IGNORED.contains(&k.as_str()))
                    }) =>
                {
                    s = self.resolve(r, path)?.clone();
                }
                _ => return Ok(s),
            }
        }
        err(path, "$ref", "reference chain too long (a cycle?)")
    }

    /// GBNF for any JSON text valid against `s`.
    fn visit(&mut self, s: &Value, path: &str) -> Result<String, SchemaError> {
        let o = match s {
            Value::Bool(true) => return Ok(self.prim("value")),
            Value::Bool(false) => return err(path, "false", "the schema `false` accepts nothing"),
            Value::Object(o) => o,
            _ => return err(path, "(schema)", "a schema must be an object or a boolean"),
        };
        for k in o.keys() {
            if !IGNORED.contains(&k.as_str()) && !HANDLED.contains(&k.as_str()) {
                return err(path, k, "keyword not supported");
            }
        }
        let constraining: Vec<&String> = o
            .keys()
            .filter(|k| {
                !IGNORED.contains(&k.as_str()) && !matches!(k.as_str(), "$defs" | "definitions")
            })
            .collect();
        if let Some(r) = o.get("$ref") {
            let Some(r) = r.as_str() else {
                return err(path, "$ref", "must be a string");
            };
            if constraining.len() > 1 {
                // $ref beside other keywords: both must hold.
                let mut rest = o.clone();
                rest.remove("$ref");
                let merged =
                    self.merge_all(&[self.resolve(r, path)?.clone(), Value::Object(rest)], path)?;
                return self.visit(&merged, path);
            }
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
            self.rules.push((name.clone(), String::new()));
            let body = self.visit(target, &r[1..])?;
            self.rules[idx].1 = body;
            return Ok(name);
        }
        if let Some(all) = o.get("allOf") {
            let Some(parts) = all.as_array().filter(|a| !a.is_empty()) else {
                return err(path, "allOf", "must be a non-empty array");
            };
            let mut list: Vec<Value> = parts.to_vec();
            let mut rest = o.clone();
            rest.remove("allOf");
            list.push(Value::Object(rest));
            let merged = self.merge_all(&list, &pointer_child(path, "allOf"))?;
            return self.visit(&merged, path);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(any) = o.get(key) {
                let Some(branches) = any.as_array().filter(|a| !a.is_empty()) else {
                    return err(path, key, "must be a non-empty array");
                };
                let mut rest = o.clone();
                rest.remove(key);
                let rest_constrains = rest.keys().any(|k| {
                    !IGNORED.contains(&k.as_str()) && !matches!(k.as_str(), "$defs" | "definitions")
                });
                let mut alts = Vec::new();
                for (i, b) in branches.iter().enumerate() {
                    let bp = pointer_child(&pointer_child(path, key), &i.to_string());
                    if rest_constrains {
                        let merged =
                            self.merge_all(&[b.clone(), Value::Object(rest.clone())], &bp)?;
                        alts.push(self.visit(&merged, &bp)?);
                    } else {
                        alts.push(self.visit(b, &bp)?);
                    }
                }
                return Ok(format!("( {} )", alts.join(" | ")));
            }
        }
        if let Some(c) = o.get("const") {
            return Ok(self.literal(c));
        }
        let types = self.types(o, path)?;
        if let Some(e) = o.get("enum") {
            let Some(values) = e.as_array().filter(|a| !a.is_empty()) else {
                return err(path, "enum", "must be a non-empty array");
            };
            let alts: Vec<String> = values
                .iter()
                .filter(|v| {
                    types.as_ref().is_none_or(|t| {
                        let vt = type_of(v);
                        t.iter()
                            .any(|t| *t == vt || (*t == "number" && vt == "integer"))
                    })
                })
                .map(|v| self.literal(v))
                .collect();
            if alts.is_empty() {
                return err(path, "enum", "no value has the schema's type");
            }
            return Ok(format!("( {} )", alts.join(" | ")));
        }
        let types = match types {
            Some(t) => t,
            None => match infer_type(o) {
                Some(t) => vec![t],
                None => return Ok(self.prim("value")),
            },
        };
        let mut alts = Vec::new();
        for t in &types {
            alts.push(match *t {
                "object" => self.object(o, path)?,
                "array" => self.array(o, path)?,
                "string" => self.string(o, path)?,
                "integer" => self.integer(o, path)?,
                "number" => self.number(o, path)?,
                "boolean" => self.prim("boolean"),
                "null" => self.prim("null"),
                _ => unreachable!("checked in types()"),
            });
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            format!("( {} )", alts.join(" | "))
        })
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
    fn literal(&mut self, v: &Value) -> String {
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
                            lit(&Value::String(k.clone()).to_string()),
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
            v => lit(&v.to_string()),
        }
    }

    fn object(&mut self, o: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let ws = self.prim("ws");
        let empty = Map::new();
        let props = match o.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return err(path, "properties", "must be an object"),
        };
        let mut required: Vec<&str> = Vec::new();
        if let Some(r) = o.get("required") {
            let Some(r) = r.as_array() else {
                return err(path, "required", "must be an array of names");
            };
            for n in r {
                let Some(n) = n.as_str() else {
                    return err(path, "required", "must be an array of names");
                };
                if !props.contains_key(n) {
                    if matches!(
                        o.get("additionalProperties"),
                        None | Some(Value::Bool(false))
                    ) {
                        return err(path, "required", format!("{n:?} is required but not among the properties (and no additional properties are allowed)"));
                    }
                    return err(
                        path,
                        "required",
                        format!("{n:?} is required but not declared in properties (not supported)"),
                    );
                }
                required.push(n);
            }
        }
        let additional = match o.get("additionalProperties") {
            None | Some(Value::Bool(false)) => None,
            Some(s) => {
                let p = pointer_child(path, "additionalProperties");
                Some(self.visit(s, &p)?)
            }
        };
        // Member i: "name" ws ":" ws value ws.
        let mut kvs = Vec::new();
        for (name, s) in props {
            let p = pointer_child(&pointer_child(path, "properties"), name);
            let v = self.visit(s, &p)?;
            let key = lit(&Value::String(name.clone()).to_string());
            kvs.push((
                format!("{key} {ws} \":\" {ws} {v} {ws}"),
                required.contains(&name.as_str()),
            ));
        }
        let extra = match &additional {
            Some(v) => {
                let key = self.key_not_in(props.keys().map(String::as_str).collect());
                let kv = self.add_rule(
                    &format!("{path}-additional-kv"),
                    format!("\"\\\"\" {key} \"\\\"\" {ws} \":\" {ws} {v} {ws}"),
                );
                Some(kv)
            }
            None => None,
        };
        // rest_i: members i.. after at least one member; first_i: before any.
        let (mut rest, mut first) = match &extra {
            Some(kv) => (
                format!("( \",\" {ws} {kv} )*"),
                format!("( {kv} ( \",\" {ws} {kv} )* )?"),
            ),
            None => (String::new(), String::new()),
        };
        for (i, (kv, req)) in kvs.iter().enumerate().rev() {
            let rest_name = if rest.is_empty() {
                String::new()
            } else {
                self.add_rule(&format!("{path}-rest-{i}"), rest.clone())
            };
            let new_rest = if *req {
                format!("\",\" {ws} {kv} {rest_name}")
            } else {
                format!("( \",\" {ws} {kv} )? {rest_name}")
            };
            let new_first = if *req {
                format!("{kv} {rest_name}")
            } else if first.is_empty() {
                format!("( {kv} {rest_name} )?")
            } else {
                let first_name = self.add_rule(&format!("{path}-first-{i}"), first.clone());
                format!("( {kv} {rest_name} | {first_name} )")
            };
            rest = new_rest;
            first = new_first;
        }
        let body = format!("\"{{\" {ws} {first} \"}}\"");
        Ok(self.add_rule(&format!("{path}-object"), body))
    }

    /// A rule for JSON string content (plain characters) that is none of `names`.
    fn key_not_in(&mut self, names: Vec<&str>) -> String {
        let kchar = self.prim("kchar");
        // A trie of the names.
        struct Node {
            end: bool,
            kids: Vec<(char, usize)>,
        }
        let mut nodes = vec![Node {
            end: false,
            kids: Vec::new(),
        }];
        for n in &names {
            let mut at = 0;
            for c in n.chars() {
                at = match nodes[at].kids.iter().find(|k| k.0 == c) {
                    Some(k) => k.1,
                    None => {
                        nodes.push(Node {
                            end: false,
                            kids: Vec::new(),
                        });
                        let new = nodes.len() - 1;
                        nodes[at].kids.push((c, new));
                        new
                    }
                };
            }
            nodes[at].end = true;
        }
        let names: Vec<String> = (0..nodes.len())
            .map(|_| self.fresh_name("key-not-declared"))
            .collect();
        let base = names[0].clone();
        let name = |i: usize| names[i].clone();
        for (i, node) in nodes.iter().enumerate() {
            let mut alts = Vec::new();
            if !node.end {
                alts.push("\"\"".to_string());
            }
            let mut excluded: Vec<(u32, u32)> = vec![(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)];
            for (c, kid) in &node.kids {
                excluded.push((*c as u32, *c as u32));
                alts.push(format!("{} {}", lit(&c.to_string()), name(*kid)));
            }
            let allowed = crate::regex::complement(&crate::regex::norm(excluded));
            alts.push(format!("{} {kchar}*", crate::regex::class(&allowed)));
            self.rules.push((name(i), alts.join(" | ")));
        }
        base
    }

    fn array(&mut self, o: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let ws = self.prim("ws");
        let count = |k: &str| -> Result<Option<u64>, SchemaError> {
            match o.get(k) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) => Ok(Some(n)),
                    None => err(path, k, "must be a non-negative integer"),
                },
            }
        };
        let min = count("minItems")?.unwrap_or(0);
        let max = count("maxItems")?;
        if max.is_some_and(|m| m < min) {
            return err(path, "maxItems", "below minItems");
        }
        if min > 10_000 || max.is_some_and(|m| m > 10_000) {
            return err(path, "maxItems", "counts above 10000 are not supported");
        }
        if o.get("uniqueItems")
            .is_some_and(|u| u != &Value::Bool(false))
        {
            return err(path, "uniqueItems", "not supported");
        }
        let mut prefix = Vec::new();
        let tuple = match (o.get("prefixItems"), o.get("items")) {
            (Some(Value::Array(p)), _) => Some(("prefixItems", p)),
            (Some(_), _) => return err(path, "prefixItems", "must be an array of schemas"),
            (None, Some(Value::Array(p))) => Some(("items", p)),
            _ => None,
        };
        if let Some((key, p)) = tuple {
            for (i, s) in p.iter().enumerate() {
                let sp = pointer_child(&pointer_child(path, key), &i.to_string());
                prefix.push(self.visit(s, &sp)?);
            }
        }
        let item = match (tuple, o.get("items")) {
            (Some(("items", _)), _) => None,
            (_, Some(Value::Bool(false))) => None,
            (_, Some(s)) => Some(self.visit(s, &pointer_child(path, "items"))?),
            (Some(_), None) => None,
            (None, None) => Some(self.prim("value")),
        };
        let p = prefix.len() as u64;
        let eff_p = max.map_or(p, |m| m.min(p));
        if item.is_none() && min > p {
            return err(
                path,
                "minItems",
                "more items required than the schema allows",
            );
        }
        // Tail after j >= p present elements, each preceded by a comma.
        let tail = |j: u64| -> String {
            match &item {
                None => String::new(),
                Some(it) => {
                    let lo = min.saturating_sub(j);
                    let hi = max.map(|m| m.saturating_sub(j));
                    if hi == Some(0) {
                        return String::new();
                    }
                    let q = match hi {
                        None if lo == 0 => "*".to_string(),
                        None if lo == 1 => "+".to_string(),
                        None => format!("{{{lo},}}"),
                        Some(h) if h == lo => format!("{{{lo}}}"),
                        Some(h) => format!("{{{lo},{h}}}"),
                    };
                    format!("( \",\" {ws} {it} {ws} ){q}")
                }
            }
        };
        let body = if eff_p == 0 {
            match &item {
                None => String::new(),
                Some(it) => {
                    if max == Some(0) {
                        String::new()
                    } else {
                        let first = format!("{it} {ws} {}", {
                            let lo = min.saturating_sub(1);
                            let hi = max.map(|m| m - 1);
                            match hi {
                                Some(0) => String::new(),
                                _ => {
                                    let q = match hi {
                                        None if lo == 0 => "*".to_string(),
                                        None => format!("{{{lo},}}"),
                                        Some(h) if h == lo => format!("{{{lo}}}"),
                                        Some(h) => format!("{{{lo},{h}}}"),
                                    };
                                    format!("( \",\" {ws} {it} {ws} ){q}")
                                }
                            }
                        });
                        if min == 0 {
                            format!("( {first} )?")
                        } else {
                            first
                        }
                    }
                }
            }
        } else {
            // after(j): elements j.. given j >= 1 present.
            let mut after = if eff_p == p { tail(p) } else { String::new() };
            for j in (1..eff_p).rev() {
                let e = format!("\",\" {ws} {} {ws} {after}", prefix[j as usize]);
                after = if j < min { e } else { format!("( {e} )?") };
            }
            let e = format!("{} {ws} {after}", prefix[0]);
            if min >= 1 {
                e
            } else {
                format!("( {e} )?")
            }
        };
        Ok(self.add_rule(&format!("{path}-array"), format!("\"[\" {ws} {body} \"]\"")))
    }

    fn string(&mut self, o: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let len = |k: &str| -> Result<Option<u64>, SchemaError> {
            match o.get(k) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if n <= 10_000 => Ok(Some(n)),
                    _ => err(path, k, "must be an integer from 0 to 10000"),
                },
            }
        };
        let (min, max) = (len("minLength")?, len("maxLength")?);
        if let (Some(a), Some(b)) = (min, max) {
            if b < a {
                return err(path, "maxLength", "below minLength");
            }
        }
        let has_len = min.is_some() || max.is_some();
        let content = match (o.get("pattern"), o.get("format")) {
            (Some(_), Some(_)) => {
                return err(
                    path,
                    "pattern",
                    "pattern together with format is not supported",
                )
            }
            (Some(p), None) => {
                if has_len {
                    return err(
                        path,
                        "pattern",
                        "pattern together with minLength/maxLength is not supported",
                    );
                }
                let Some(p) = p.as_str() else {
                    return err(path, "pattern", "must be a string");
                };
                crate::regex::pattern_to_gbnf(p).or_else(|e| err(path, "pattern", e))?
            }
            (None, Some(f)) => {
                if has_len {
                    return err(
                        path,
                        "format",
                        "format together with minLength/maxLength is not supported",
                    );
                }
                let f = f.as_str().unwrap_or("");
                let Some(g) = format_rule(f) else {
                    return err(path, "format", format!("format {f:?} is not supported (date, time, date-time, uuid, email, ipv4, uri are)"));
                };
                let name = format!("format-{f}");
                if !self.rules.iter().any(|r| r.0 == name) {
                    self.rules.push((name.clone(), g.to_string()));
                }
                name
            }
            (None, None) => {
                if !has_len {
                    return Ok(self.prim("string"));
                }
                self.prim("string");
                let lo = min.unwrap_or(0);
                match max {
                    None => format!("char{{{lo},}}"),
                    Some(h) => format!("char{{{lo},{h}}}"),
                }
            }
        };
        Ok(self.add_rule(
            &format!("{path}-string"),
            format!("\"\\\"\" {content} \"\\\"\""),
        ))
    }

    /// Bounds: (value, exclusive) from minimum/exclusiveMinimum (draft 4 booleans too).
    fn bounds(&self, o: &Map<String, Value>, path: &str) -> Result<(Bound, Bound), SchemaError> {
        let num = |k: &str| -> Result<Option<f64>, SchemaError> {
            match o.get(k) {
                None | Some(Value::Bool(_)) => Ok(None),
                Some(v) => match v.as_f64() {
                    Some(f) if f.is_finite() => Ok(Some(f)),
                    _ => err(path, k, "must be a number"),
                },
            }
        };
        let flag = |k: &str| o.get(k) == Some(&Value::Bool(true));
        let pick = |incl: Option<f64>,
                    excl: Option<f64>,
                    draft4: bool,
                    lower: bool|
         -> Option<(f64, bool)> {
            let a = incl.map(|v| (v, draft4));
            let b = excl.map(|v| (v, true));
            match (a, b) {
                (Some(x), Some(y)) => {
                    // The tighter bound.
                    let x_tighter = if lower { x.0 > y.0 } else { x.0 < y.0 };
                    Some(if x_tighter { x } else { y })
                }
                (x, y) => x.or(y),
            }
        };
        let lo = pick(
            num("minimum")?,
            num("exclusiveMinimum")?,
            flag("exclusiveMinimum"),
            true,
        );
        let hi = pick(
            num("maximum")?,
            num("exclusiveMaximum")?,
            flag("exclusiveMaximum"),
            false,
        );
        Ok((lo, hi))
    }

    fn integer(&mut self, o: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let (lo, hi) = self.bounds(o, path)?;
        if lo.is_none() && hi.is_none() {
            return Ok(self.prim("integer"));
        }
        let limit = 10f64.powi(MAX_DIGITS as i32) - 1.0;
        let lo = lo.map(|(v, ex)| if ex { v.floor() + 1.0 } else { v.ceil() });
        let hi = hi.map(|(v, ex)| if ex { v.ceil() - 1.0 } else { v.floor() });
        for (b, k) in [(lo, "minimum"), (hi, "maximum")] {
            if b.is_some_and(|b| b.abs() > limit) {
                return err(
                    path,
                    k,
                    format!("bounds beyond {MAX_DIGITS} digits are not supported"),
                );
            }
        }
        let (lo, hi) = (lo.map(|v| v as i64), hi.map(|v| v as i64));
        if let (Some(a), Some(b)) = (lo, hi) {
            if a > b {
                return err(path, "maximum", "no integer lies within the bounds");
            }
        }
        let body = int_range(lo, hi);
        Ok(self.add_rule(&format!("{path}-integer"), body))
    }

    fn number(&mut self, o: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let (lo, hi) = self.bounds(o, path)?;
        if lo.is_none() && hi.is_none() {
            return Ok(self.prim("number"));
        }
        for (b, k) in [(lo, "minimum"), (hi, "maximum")] {
            if let Some((v, _)) = b {
                if v.fract() != 0.0 || v.abs() > 1e15 {
                    return err(path, k, "number bounds must be integers of at most 15 digits (fractional bounds are not supported)");
                }
            }
        }
        if let (Some((a, ae)), Some((b, be))) = (lo, hi) {
            if a > b || (a == b && (ae || be)) {
                return err(path, "maximum", "no number lies within the bounds");
            }
        }
        self.prim("frac");
        let lo = lo.map(|(v, e)| (v as i64, e));
        let hi = hi.map(|(v, e)| (v as i64, e));
        let mut alts = Vec::new();
        // Non-negative part: magnitudes within [max(lo,0), hi].
        if hi.is_none_or(|(h, e)| h > 0 || (h == 0 && !e)) {
            let low = match lo {
                Some((l, e)) if l >= 0 => Some((l as u64, e)),
                _ => None,
            };
            alts.push(mag_range(low, hi.map(|(h, e)| (h as u64, e))));
        }
        // Negative part: "-" magnitude within [max(-hi,0), -lo] (exclusive ends carried).
        if lo.is_none_or(|(l, _)| l < 0) {
            let low = match hi {
                Some((h, e)) if h <= 0 => Some(((-h) as u64, e)),
                _ => None,
            };
            let high = lo.map(|(l, e)| ((-l) as u64, e));
            let m = mag_range(low, high);
            alts.push(format!("\"-\" ( {m} )"));
        }
        Ok(self.add_rule(&format!("{path}-number"), alts.join(" | ")))
    }

    fn merge_all(&self, parts: &[Value], path: &str) -> Result<Value, SchemaError> {
        let mut out = Map::new();
        for p in parts {
            let p = self.deref(p, path)?;
            let Some(po) = p.as_object() else {
                if p == Value::Bool(true) {
                    continue;
                }
                return err(path, "allOf", "only object schemas can be merged");
            };
            // A part that is itself an allOf: flatten.
            let po = if let Some(inner) = po.get("allOf").and_then(Value::as_array) {
                let mut list = inner.clone();
                let mut rest = po.clone();
                rest.remove("allOf");
                list.push(Value::Object(rest));
                match self.merge_all(&list, path)? {
                    Value::Object(m) => m,
                    _ => unreachable!("merge returns objects"),
                }
            } else {
                po.clone()
            };
            for (k, v) in po {
                if IGNORED.contains(&k.as_str()) {
                    continue;
                }
                let Some(prev) = out.get(&k).cloned() else {
                    out.insert(k, v);
                    continue;
                };
                if prev == v {
                    continue;
                }
                let merged = match k.as_str() {
                    "properties" => {
                        let (Some(a), Some(b)) = (prev.as_object(), v.as_object()) else {
                            return err(path, "properties", "must be objects");
                        };
                        let mut m = a.clone();
                        for (name, s) in b {
                            let new = match m.get(name) {
                                Some(old) if old != s => serde_json::json!({"allOf": [old, s]}),
                                _ => s.clone(),
                            };
                            m.insert(name.clone(), new);
                        }
                        Value::Object(m)
                    }
                    "required" => {
                        let mut r = prev.as_array().cloned().unwrap_or_default();
                        for n in v.as_array().into_iter().flatten() {
                            if !r.contains(n) {
                                r.push(n.clone());
                            }
                        }
                        Value::Array(r)
                    }
                    "type" => {
                        let set = |t: &Value| -> Vec<Value> {
                            match t {
                                Value::Array(a) => a.clone(),
                                t => vec![t.clone()],
                            }
                        };
                        let (a, b) = (set(&prev), set(&v));
                        let mut both: Vec<Value> =
                            a.iter().filter(|t| b.contains(t)).cloned().collect();
                        if both.is_empty() {
                            if a.contains(&Value::from("integer"))
                                && b.contains(&Value::from("number"))
                                || a.contains(&Value::from("number"))
                                    && b.contains(&Value::from("integer"))
                            {
                                both.push(Value::from("integer"));
                            } else {
                                return err(path, "type", "allOf parts have no type in common");
                            }
                        }
                        Value::Array(both)
                    }
                    "minLength" | "minItems" | "minimum" | "exclusiveMinimum"
                        if prev.is_number() && v.is_number() =>
                    {
                        if prev.as_f64() >= v.as_f64() {
                            prev
                        } else {
                            v
                        }
                    }
                    "maxLength" | "maxItems" | "maximum" | "exclusiveMaximum"
                        if prev.is_number() && v.is_number() =>
                    {
                        if prev.as_f64() <= v.as_f64() {
                            prev
                        } else {
                            v
                        }
                    }
                    "additionalProperties"
                        if prev == Value::Bool(false) || v == Value::Bool(false) =>
                    {
                        Value::Bool(false)
                    }
                    _ => {
                        return err(
                            path,
                            &k,
                            "allOf parts disagree on this keyword and cannot be merged",
                        )
                    }
                };
                out.insert(k, merged);
            }
        }
        Ok(Value::Object(out))
    }

    fn finish(mut self, root: String) -> String {
        let mut text = format!("root ::= {root}\n");
        for (name, body) in &self.rules {
            let _ = writeln!(text, "{name} ::= {body}");
        }
        self.prims.sort_unstable();
        for p in &self.prims {
            let body = PRIMITIVES
                .iter()
                .find(|x| x.0 == *p)
                .expect("known primitive")
                .1;
            let _ = writeln!(text, "{p} ::= {body}");
        }
        text
    }
}

/// A numeric bound: (value, exclusive).
type Bound = Option<(f64, bool)>;

fn infer_type(o: &Map<String, Value>) -> Option<&'static str> {
    let has = |ks: &[&str]| ks.iter().any(|k| o.contains_key(*k));
    let kinds = [
        has(&["properties", "required", "additionalProperties"]).then_some("object"),
        has(&[
            "items",
            "prefixItems",
            "minItems",
            "maxItems",
            "uniqueItems",
        ])
        .then_some("array"),
        has(&["minLength", "maxLength", "pattern", "format"]).then_some("string"),
        has(&["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]).then_some("number"),
    ];
    let found: Vec<&'static str> = kinds.into_iter().flatten().collect();
    (found.len() == 1).then(|| found[0])
}

/// GBNF (content of a JSON string) for a supported `format`.
fn format_rule(f: &str) -> Option<&'static str> {
    const DATE: &str = concat!(
        r#"( [0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) "#,
        r#"| ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) "#,
        r#"| "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ) "#,
        r#"| ( [0-9]{2} ( "0" [48] | [2468] [048] | [13579] [26] ) | ( [02468] [048] | [13579] [26] ) "00" ) "-02-29" )"#
    );
    const TIME: &str = r#"( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#;
    Some(match f {
        "date" => DATE,
        "time" => TIME,
        "date-time" => concat!(
            r#"( [0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) "#,
            r#"| ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) "#,
            r#"| "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ) "#,
            r#"| ( [0-9]{2} ( "0" [48] | [2468] [048] | [13579] [26] ) | ( [02468] [048] | [13579] [26] ) "00" ) "-02-29" ) "#,
            r#""T" ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#
        ),
        "uuid" => {
            r#"[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}"#
        }
        "email" => {
            r#"[a-zA-Z0-9_+-]{1,30} ( "." [a-zA-Z0-9_+-]{1,30} )? "@" [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,18} [a-zA-Z0-9] )? ( "." [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,18} [a-zA-Z0-9] )? ){0,2} "." [a-zA-Z]{2,12}"#
        }
        "ipv4" => {
            r#"( [0-9] | [1-9] [0-9] | "1" [0-9]{2} | "2" [0-4] [0-9] | "25" [0-5] ) ( "." ( [0-9] | [1-9] [0-9] | "1" [0-9]{2} | "2" [0-4] [0-9] | "25" [0-5] ) ){3}"#
        }
        "uri" => {
            r##"[a-zA-Z] [a-zA-Z0-9+.-]{0,15} "://" [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )? ( "." [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )? ){0,4} ( ":" [1-9] [0-9]{0,4} )? ( "/" ( [a-zA-Z0-9._~!$&'()*+,;=:@-] | "%" [0-9a-fA-F]{2} ){0,40} ){0,8} ( "?" ( [a-zA-Z0-9._~!$&'()*+,;=:@/?-] | "%" [0-9a-fA-F]{2} ){0,60} )? ( "#" ( [a-zA-Z0-9._~!$&'()*+,;=:@/?-] | "%" [0-9a-fA-F]{2} ){0,40} )?"##
        }
        _ => return None,
    })
}

/// GBNF for the decimal digits of the integers in `lo..=hi`, both with `n` digits.
fn same_len(lo: &[u8], hi: &[u8]) -> String {
    if lo.is_empty() {
        return String::new();
    }
    let n = lo.len() - 1;
    let any = |k: usize| {
        if k == 0 {
            String::new()
        } else {
            format!(" [0-9]{{{k}}}")
        }
    };
    if lo[0] == hi[0] {
        let rest = same_len(&lo[1..], &hi[1..]);
        return format!("\"{}\" {rest}", lo[0] as char)
            .trim_end()
            .to_string();
    }
    let lo_rest_zero = lo[1..].iter().all(|&d| d == b'0');
    let hi_rest_nine = hi[1..].iter().all(|&d| d == b'9');
    let mut alts = Vec::new();
    let mut mid_lo = lo[0] + 1;
    let mut mid_hi = hi[0] - 1;
    if lo_rest_zero {
        mid_lo = lo[0];
    } else {
        let nines = vec![b'9'; n];
        alts.push(format!(
            "\"{}\" ( {} )",
            lo[0] as char,
            same_len(&lo[1..], &nines)
        ));
    }
    if hi_rest_nine {
        mid_hi = hi[0];
    }
    if mid_lo <= mid_hi {
        let class = if mid_lo == mid_hi {
            format!("\"{}\"", mid_lo as char)
        } else {
            format!("[{}-{}]", mid_lo as char, mid_hi as char)
        };
        alts.push(format!("{class}{}", any(n)));
    }
    if !hi_rest_nine {
        let zeros = vec![b'0'; n];
        alts.push(format!(
            "\"{}\" ( {} )",
            hi[0] as char,
            same_len(&zeros, &hi[1..])
        ));
    }
    format!("( {} )", alts.join(" | "))
}

fn digits(v: u64) -> u32 {
    v.checked_ilog10().unwrap_or(0) + 1
}

/// GBNF for the unsigned integers in `lo..=hi` (hi `None`: up to [`MAX_DIGITS`] digits).
fn uint_range(lo: u64, hi: Option<u64>) -> String {
    let cap = 10u64.pow(MAX_DIGITS) - 1;
    let hi = hi.unwrap_or(cap).min(cap);
    let mut alts = Vec::new();
    for d in digits(lo)..=digits(hi) {
        let a = lo.max(if d == 1 { 0 } else { 10u64.pow(d - 1) });
        let b = hi.min(10u64.pow(d) - 1);
        if a <= b {
            alts.push(same_len(a.to_string().as_bytes(), b.to_string().as_bytes()));
        }
    }
    format!("( {} )", alts.join(" | "))
}

/// GBNF for the integers in `lo..=hi` (either side open).
fn int_range(lo: Option<i64>, hi: Option<i64>) -> String {
    let mut alts = Vec::new();
    if lo.is_none_or(|l| l < 0) {
        // Negatives -m with m in [max(1, -hi), -lo].
        let m_lo = match hi {
            Some(h) if h < 0 => (-h) as u64,
            _ => 1,
        };
        let m_hi = lo.map(|l| (-l) as u64);
        if m_hi.is_none_or(|m| m >= m_lo) {
            alts.push(format!("\"-\" {}", uint_range(m_lo, m_hi)));
        }
    }
    if hi.is_none_or(|h| h >= 0) {
        alts.push(uint_range(
            lo.map_or(0, |l| l.max(0) as u64),
            hi.map(|h| h as u64),
        ));
    }
    alts.join(" | ")
}

/// GBNF for non-negative decimal numbers (no exponent) with magnitude in the given
/// integral bounds `(value, exclusive)`.
fn mag_range(lo: Option<(u64, bool)>, hi: Option<(u64, bool)>) -> String {
    let frac = "frac?";
    let mut alts = Vec::new();
    let (a, a_ex) = lo.unwrap_or((0, false));
    match hi {
        None => {
            let start = if a_ex { a + 1 } else { a };
            alts.push(format!("{} {frac}", uint_range(start, None)));
        }
        Some((b, b_ex)) => {
            // Integral part in [a', b-1] with any fraction; then b itself.
            let start = if a_ex { a + 1 } else { a };
            if b >= 1 && start < b {
                alts.push(format!("{} {frac}", uint_range(start, Some(b - 1))));
            }
            if !b_ex && (b > a || !a_ex) {
                alts.push(format!("\"{b}\" ( \".\" \"0\"{{1,16}} )?"));
            }
        }
    }
    if a_ex && hi.is_none_or(|(b, _)| b > a) {
        // Just above the exclusive lower bound: a.000…d with a non-zero digit.
        alts.push(format!("\"{a}\" \".\" \"0\"{{0,15}} [1-9] [0-9]{{0,15}}"));
    }
    alts.join(" | ")
}

/// Converts a JSON Schema to GBNF text (rules `root`, `r-...`, and primitives).
pub fn schema_to_gbnf(schema: &Value) -> Result<String, SchemaError> {
    let mut c = Conv {
        root: schema,
        rules: Vec::new(),
        taken: HashSet::new(),
        refs: HashMap::new(),
        prims: Vec::new(),
    };
    let root = c.visit(schema, "")?;
    Ok(c.finish(root))
}

/// Parses JSON Schema text and converts it to a validated grammar.
pub fn compile_schema(text: &str) -> Result<Grammar, SchemaError> {
    let v: Value = serde_json::from_str(text)
        .or_else(|e| err("", "(json)", format!("not valid JSON: {e}")))?;
    let gbnf = schema_to_gbnf(&v)?;
    parse(&gbnf).or_else(|e| {
        let keyword = if e.msg.contains("left recursion") {
            "$ref"
        } else {
            "(grammar)"
        };
        err(
            "",
            keyword,
            format!("the schema gives an unusable grammar: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Compiled, Matcher};
    use serde_json::json;

    fn accepts(schema: Value, text: &str) -> bool {
        let c = Compiled::new(&compile_schema(&schema.to_string()).unwrap());
        Matcher::matches(&c, text)
    }

    #[test]
    fn unsupported_keywords_are_errors_naming_keyword_and_path() {
        for (schema, path, keyword) in [
            (
                json!({"type": "integer", "multipleOf": 3}),
                "",
                "multipleOf",
            ),
            (
                json!({"properties": {"a": {"type": "object", "patternProperties": {}}}}),
                "/properties/a",
                "patternProperties",
            ),
            (
                json!({"type": "array", "items": {"not": {}}}),
                "/items",
                "not",
            ),
            (
                json!({"type": "array", "uniqueItems": true}),
                "",
                "uniqueItems",
            ),
            (
                json!({"type": "string", "format": "hostname"}),
                "",
                "format",
            ),
            (json!({"type": "string", "pattern": "(?=x)"}), "", "pattern"),
            (json!({"$ref": "https://example.com/s.json"}), "", "$ref"),
            (json!({"$ref": "#/$defs/missing"}), "", "$ref"),
            (json!({"type": "number", "minimum": 0.5}), "", "minimum"),
            (
                json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
                "/allOf",
                "type",
            ),
            (
                json!({"type": "object", "minProperties": 1}),
                "",
                "minProperties",
            ),
            (
                json!({"type": "integer", "minimum": 5, "maximum": 4}),
                "",
                "maximum",
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
        // Found by the fuzzer: an empty keyword is still named (quoted).
        let e = compile_schema(r#"{"type": "string", "": 1}"#).unwrap_err();
        assert_eq!(e.keyword, "");
        assert!(e.to_string().contains("\"\": keyword not supported"), "{e}");
    }

    #[test]
    fn annotations_are_ignored() {
        let s = json!({"$schema": "x", "title": "t", "description": "d", "examples": [1],
            "default": 2, "$comment": "c", "type": "integer", "minimum": 1});
        assert!(accepts(s.clone(), "7"));
        assert!(!accepts(s, "0"));
    }

    #[test]
    fn optional_properties_keep_declared_order() {
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}});
        for ok in [
            "{}",
            "{\"a\":1}",
            "{\"b\":2}",
            "{\"a\":1,\"b\":2}",
            "{ \"a\": 1 }",
        ] {
            assert!(accepts(s.clone(), ok), "{ok}");
        }
        for bad in [
            "{\"b\":2,\"a\":1}",
            "{\"a\":1,}",
            "{,\"a\":1}",
            "{\"c\":1}",
            "{\"a\":1,\"a\":1}",
        ] {
            assert!(!accepts(s.clone(), bad), "{bad}");
        }
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
}
