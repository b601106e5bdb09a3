//! What a schema grammar carries besides its rules: the schema, the keywords ignored, the
//! relaxations, and (when something was relaxed) the validator of finished text.

use super::{err, SchemaError};
use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// A note about one keyword of the schema: where, which, and what.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SchemaNote {
    /// JSON Pointer to the schema object (empty for the root).
    pub path: String,
    /// The keyword.
    pub keyword: String,
    /// What was done.
    pub msg: String,
}

impl fmt::Display for SchemaNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.path.is_empty() {
            "the root"
        } else {
            &self.path
        };
        write!(f, "JSON Schema at {at}: {:?}: {}", self.keyword, self.msg)
    }
}

/// Finished text the schema rejects although the (relaxed) grammar accepted it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("output violates the JSON Schema at {instance_path:?}: {msg}")]
pub struct Violation {
    /// JSON Pointer into the instance (empty: the whole text).
    pub instance_path: String,
    /// What is wrong.
    pub msg: String,
}

/// The schema behind a grammar.
#[derive(Debug)]
pub struct SchemaInfo {
    schema: Value,
    warnings: Vec<SchemaNote>,
    relaxations: Vec<SchemaNote>,
    validator: Option<jsonschema::Validator>,
}

impl PartialEq for SchemaInfo {
    fn eq(&self, other: &Self) -> bool {
        self.schema == other.schema
            && self.warnings == other.warnings
            && self.relaxations == other.relaxations
    }
}

impl Eq for SchemaInfo {}

impl SchemaInfo {
    /// The schema with its notes; builds the validator when something was relaxed (an
    /// error when the validator refuses the schema: the relaxation could not be checked).
    pub fn new(
        schema: &Value,
        warnings: Vec<SchemaNote>,
        relaxations: Vec<SchemaNote>,
    ) -> Result<SchemaInfo, SchemaError> {
        let validator = if relaxations.is_empty() {
            None
        } else {
            match validator_for(schema) {
                Ok(v) => Some(v),
                Err(e) => {
                    let first = &relaxations[0];
                    return err(
                        &first.path,
                        &first.keyword,
                        format!(
                            "{} — and the validator that would check it refuses the schema: {e}",
                            first.msg
                        ),
                    );
                }
            }
        };
        Ok(SchemaInfo {
            schema: schema.clone(),
            warnings,
            relaxations,
            validator,
        })
    }

    /// The schema.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Keywords ignored (unknown or vendor annotations), with where.
    pub fn warnings(&self) -> &[SchemaNote] {
        &self.warnings
    }

    /// Where the grammar accepts more than the schema (the finished text is validated).
    pub fn relaxations(&self) -> &[SchemaNote] {
        &self.relaxations
    }

    /// Whether finished text must be validated (the grammar alone is not exact).
    pub fn needs_validation(&self) -> bool {
        self.validator.is_some()
    }

    /// Checks finished text: a no-op for exact grammars; otherwise the text must be JSON
    /// without repeated member names and valid against the schema.
    pub fn check(&self, text: &str) -> Result<(), Violation> {
        let Some(validator) = &self.validator else {
            return Ok(());
        };
        let value = parse_strict(text).map_err(|msg| Violation {
            instance_path: String::new(),
            msg,
        })?;
        let first = validator.iter_errors(&value).next().map(|e| Violation {
            instance_path: e.instance_path().to_string(),
            msg: e.to_string(),
        });
        match first {
            None => Ok(()),
            Some(v) => Err(v),
        }
    }
}

/// The validator of `schema` (formats checked): the draft its `$schema` names, else 2020-12;
/// a schema that draft refuses is tried as draft 7, then draft 4 (real schemas without
/// `$schema` often use `exclusiveMinimum: true` or `definitions`).
pub fn validator_for(schema: &Value) -> Result<jsonschema::Validator, String> {
    let build = |d| jsonschema_validator(schema, d, true);
    build(None).or_else(|first| {
        build(Some(jsonschema::Draft::Draft7))
            .or_else(|_| build(Some(jsonschema::Draft::Draft4)))
            .map_err(|_| first)
    })
}

/// The `jsonschema` crate's validator of `schema`, as that crate builds it: at `draft`
/// (`None`: the draft its `$schema` names, else 2020-12), `format` checked when `formats`.
/// Nothing of coli's own, so tests use it as their independent check.
///
/// One non-generic place that instantiates the crate's generic builder: every crate that
/// calls `jsonschema::options().build()` itself compiles that builder anew, about a minute
/// of release build per test binary.
pub fn jsonschema_validator(
    schema: &Value,
    draft: Option<jsonschema::Draft>,
    formats: bool,
) -> Result<jsonschema::Validator, String> {
    let mut o = jsonschema::options().should_validate_formats(formats);
    if let Some(d) = draft {
        o = o.with_draft(d);
    }
    o.build(schema).map_err(|e| e.to_string())
}

/// JSON text to a value, refusing repeated member names (a plain parse keeps the last and
/// the validator would never see the first). Nesting is bounded by serde_json's limit.
pub fn parse_strict(text: &str) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Strict.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(v)
}

struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element_seed(Strict)? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut m = Map::new();
        while let Some(k) = a.next_key::<String>()? {
            let v = a.next_value_seed(Strict)?;
            if m.insert(k.clone(), v).is_some() {
                return Err(A::Error::custom(format!("member {k:?} appears twice")));
            }
        }
        Ok(Value::Object(m))
    }
}
