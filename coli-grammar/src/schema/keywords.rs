//! How each keyword is treated: converted, relaxed (left to the validator), an annotation
//! (ignored), or unknown (ignored with a warning).

/// Annotations of the specification (and of its older drafts): ignored silently.
pub(crate) const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "examples",
    "default",
    "$schema",
    "$id",
    "id",
    "$anchor",
    "$dynamicAnchor",
    "$recursiveAnchor",
    "$vocabulary",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "$defs",
    "definitions",
];

/// Keywords the converter turns into grammar (some only partly: see their code).
pub(crate) const CONVERTED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

/// Keywords that constrain but have no grammar here: the grammar ignores them and the
/// finished text is validated.
pub(crate) const RELAXED: &[&str] = &[
    "multipleOf",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
];

/// What to do with keyword `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Annotation,
    Converted,
    Relaxed,
    Unknown,
}

pub(crate) fn kind(k: &str) -> Kind {
    if CONVERTED.contains(&k) {
        Kind::Converted
    } else if RELAXED.contains(&k) {
        Kind::Relaxed
    } else if ANNOTATIONS.contains(&k) {
        Kind::Annotation
    } else {
        Kind::Unknown
    }
}

/// Whether `k` constrains instances (converted or relaxed).
pub(crate) fn constrains(k: &str) -> bool {
    matches!(kind(k), Kind::Converted | Kind::Relaxed)
}
