//! `allOf` and `$ref`-with-siblings: the parts merged into one schema. Parts that cannot be
//! merged are left out of the grammar (it then accepts more) and recorded as relaxations.

use super::keywords::{kind, Kind};
use super::visit::{empty, CYCLE};
use super::{err, Conv, SchemaError, MAX_NESTING};
use serde_json::{Map, Value};

impl Conv<'_> {
    /// One schema that all of `parts` describe (their `$ref`s followed and `allOf`s
    /// flattened), or a superset of it when some keyword differs in a way that cannot be
    /// merged (recorded).
    pub(crate) fn merge_all(&mut self, parts: &[Value], path: &str) -> Result<Value, SchemaError> {
        if self.depth >= MAX_NESTING {
            return err(
                path,
                "(nesting)",
                format!("allOf/$ref nested deeper than {MAX_NESTING}"),
            );
        }
        self.depth += 1;
        let r = self.merge_inner(parts, path);
        self.depth -= 1;
        r
    }

    fn merge_inner(&mut self, parts: &[Value], path: &str) -> Result<Value, SchemaError> {
        let mut out = Map::new();
        for p in parts {
            self.work += 1;
            if self.over_budget() {
                return err(path, "(size)", "the schema is too large");
            }
            let po = match p {
                Value::Bool(true) => continue,
                Value::Bool(false) => return empty(path, "allOf", "a part is `false`"),
                Value::Object(o) => o,
                _ => return err(path, "allOf", "a part is not a schema"),
            };
            // Expand the part's own $ref and allOf first (a part without them is read in
            // place: cloning it whole, a resolved definition at every level of a nested
            // merge, was most of a large schema's compile).
            let expanded;
            let po: &Map<String, Value> = if po.contains_key("$ref") || po.contains_key("allOf") {
                let mut rest = po.clone();
                let mut list = Vec::new();
                let mut expanding = None;
                if let Some(r) = rest.remove("$ref") {
                    let Some(r) = r.as_str() else {
                        return err(path, "$ref", "must be a string");
                    };
                    if self.merging.iter().any(|m| m == r) {
                        return err(
                            path,
                            "$ref",
                            format!("{CYCLE} through allOf/$ref without consuming input ({r})"),
                        );
                    }
                    list.push(self.resolve(r, path)?.clone());
                    expanding = Some(r.to_string());
                }
                if let Some(all) = rest.remove("allOf") {
                    let Some(a) = all.as_array().filter(|a| !a.is_empty()) else {
                        return err(path, "allOf", "must be a non-empty array");
                    };
                    list.extend(a.iter().cloned());
                }
                list.push(Value::Object(rest));
                let pushed = expanding.is_some();
                self.merging.extend(expanding);
                let merged = self.merge_all(&list, path);
                if pushed {
                    self.merging.pop();
                }
                expanded = match merged? {
                    Value::Object(m) => m,
                    _ => unreachable!("merge returns objects"),
                };
                &expanded
            } else {
                po
            };
            for (k, v) in po {
                if kind(k) == Kind::Annotation || kind(k) == Kind::Unknown {
                    if kind(k) == Kind::Unknown {
                        self.warn(path, k, "unknown keyword ignored");
                    }
                    continue;
                }
                let merged = match out.get(k) {
                    None => {
                        out.insert(k.clone(), v.clone());
                        continue;
                    }
                    Some(prev) if prev == v => continue,
                    Some(prev) => merge_keyword(k, prev, v, path)?,
                };
                match merged {
                    Some(m) => {
                        out.insert(k.clone(), m);
                    }
                    None => self.relax(
                        path,
                        k,
                        "allOf parts disagree on this keyword: the grammar keeps the first, the finished text is validated",
                    ),
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// The merge of two different values of keyword `k` (`None`: they do not merge).
fn merge_keyword(
    k: &str,
    prev: &Value,
    v: &Value,
    path: &str,
) -> Result<Option<Value>, SchemaError> {
    Ok(Some(match k {
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
            let (a, b) = (set(prev), set(v));
            let has = |s: &[Value], t: &str| s.contains(&Value::from(t));
            // Integers are numbers: number and integer on either side meet in integer,
            // and number stays where both sides have it.
            let mut both: Vec<Value> = a.iter().filter(|t| b.contains(t)).cloned().collect();
            if ((has(&a, "integer") && has(&b, "number"))
                || (has(&a, "number") && has(&b, "integer")))
                && !both.contains(&Value::from("integer"))
            {
                both.push(Value::from("integer"));
            }
            if both.is_empty() {
                return empty(path, "type", "allOf parts have no type in common");
            }
            Value::Array(both)
        }
        "minLength" | "minItems" | "minimum" | "exclusiveMinimum" | "minProperties"
            if prev.is_number() && v.is_number() =>
        {
            if prev.as_f64() >= v.as_f64() {
                prev.clone()
            } else {
                v.clone()
            }
        }
        "maxLength" | "maxItems" | "maximum" | "exclusiveMaximum" | "maxProperties"
            if prev.is_number() && v.is_number() =>
        {
            if prev.as_f64() <= v.as_f64() {
                prev.clone()
            } else {
                v.clone()
            }
        }
        "additionalProperties" if prev == &Value::Bool(false) || v == &Value::Bool(false) => {
            Value::Bool(false)
        }
        "additionalProperties" | "items" | "additionalItems" | "propertyNames" | "contains"
            if prev.is_object() || v.is_object() =>
        {
            serde_json::json!({"allOf": [prev, v]})
        }
        "enum" => {
            let (Some(a), Some(b)) = (prev.as_array(), v.as_array()) else {
                return Ok(None);
            };
            let both: Vec<Value> = a.iter().filter(|x| b.contains(x)).cloned().collect();
            if both.is_empty() {
                return empty(path, "enum", "allOf parts have no enum value in common");
            }
            Value::Array(both)
        }
        _ => return Ok(None),
    }))
}
