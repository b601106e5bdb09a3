//! JSON Schema → GBNF.
//!
//! The grammar accepts JSON text that validates against the schema. Where a keyword
//! cannot be written as a grammar (or only at a size that would not pay), the grammar is
//! *relaxed* — it accepts a superset — and the schema is kept with the grammar so that the
//! finished text is validated by a real validator (the `jsonschema` crate):
//! [`crate::Matcher::matches`] does so, and [`crate::Compiled::check_complete`] gives the
//! violation. Each relaxation is listed ([`crate::Compiled::relaxations`]); a grammar
//! without relaxations is exact on its own.
//!
//! Spelling: any JSON the schema allows (members in any order, any whitespace, numbers of
//! any length, `\u` escapes and surrogate pairs in plain strings, integers written `2.0`
//! or with an exponent when the value is integral, `1.5e38`), except that strings
//! constrained by `pattern`/`format` use each character's plain JSON spelling, keys of
//! additional properties escape only characters no declared name uses (see
//! `key_not_in`), numbers with bounds have no exponent, integers have no negative
//! exponent, and `enum`/`const` values are spelled as `serde_json` prints them (members
//! and items may be spaced). A schema without `additionalProperties` allows
//! other members, as the specification says; a schema without `type` allows every type.
//!
//! Exact keywords: `type`, `properties` (members in any order, each at most once, for
//! objects of up to [`MAX_TRACKED_ALL`] properties; beyond, the required ones are tracked
//! and repeats are left to the validator), `required`, `additionalProperties`, `items`,
//! `prefixItems`, `additionalItems`, `minItems`, `maxItems` (to 10,000), `enum`, `const`,
//! `anyOf`, `oneOf` (when its branches are provably disjoint: different types, distinct
//! `const`/`enum` values of a required property), `allOf` (when the parts merge), `$ref`
//! to `#/...` (recursion allowed), `minLength`/`maxLength` (to 10,000), `pattern` (the
//! [`crate::regex`] subset), `format` (date, time, date-time, uuid, email, ipv4, uri),
//! `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` (integral bounds of up to 15
//! digits). Relaxed and post-validated: the rest of the constraining vocabulary
//! (`multipleOf`, `uniqueItems`, `not`, `if`/`then`/`else`, `dependencies`,
//! `patternProperties`, `propertyNames`, `contains`, `minProperties`, …) and the cases
//! above beyond their limits. Annotations are ignored; unknown keywords are ignored with a
//! warning ([`crate::Compiled::warnings`]), as the specification says.
//!
//! Every recursion of the converter is bounded ([`MAX_NESTING`], [`MAX_WORK`]): a schema
//! too deep or too large is an error, never a stack overflow.

mod array;
mod check;
mod disjoint;
mod keywords;
mod merge;
mod object;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_keys;
#[cfg(test)]
mod tests_spelling;
mod visit;

pub use check::{
    jsonschema_validator, parse_strict, validator_for, SchemaInfo, SchemaNote, Violation,
};

use crate::gbnf::{parse, show, Expr, Grammar};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

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

pub(crate) fn err<T>(path: &str, keyword: &str, msg: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError {
        path: path.to_string(),
        keyword: keyword.to_string(),
        msg: msg.into(),
    })
}

/// Objects with at most this many declared properties track every member (any order, no
/// repeats) in the grammar.
pub const MAX_TRACKED_ALL: usize = 5;

/// Larger objects track at most this many required members in the grammar.
pub const MAX_TRACKED_REQUIRED: usize = 6;

/// Deepest nesting of schemas visited at once (subschemas, references, merges).
pub const MAX_NESTING: usize = 256;

/// Most subschemas visited in one conversion, and most grammar text (bytes / 64): beyond,
/// the schema is refused as too large.
pub const MAX_WORK: usize = 200_000;

/// Subschemas whose JSON text is at least this long are converted once per schema
/// (smaller ones cost less to convert again than to look up).
pub(crate) const MEMO_MIN_BYTES: usize = 128;

/// Most digits of an integer bound.
pub(crate) const MAX_DIGITS: u32 = 15;

/// The primitive rules, emitted when used.
const PRIMITIVES: &[(&str, &str)] = &[
    ("ws", "[ \\t\\n\\r]*"),
    ("value", "object | array | string | number | boolean | null"),
    (
        "object",
        r#""{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}""#,
    ),
    ("array", r#""[" ws ( value ws ( "," ws value ws )* )? "]""#),
    ("string", r#""\"" char* "\"""#),
    (
        "char",
        r#"[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2} ) )"#,
    ),
    ("number", r#"integer frac? exp?"#),
    ("integer", r#""-"? ( "0" | [1-9] [0-9]* )"#),
    // Written by `integral_body` (exponent spellings of integers).
    ("integral", ""),
    ("frac", r#""." [0-9]+"#),
    ("exp", r#"[eE] [-+]? [0-9]+"#),
    ("boolean", r#""true" | "false""#),
    ("null", r#""null""#),
    ("kchar", r#"[^"\\\x00-\x1F]"#),
];

/// Most fraction digits of an integer written with an exponent (`1.5e1`): Rust and
/// Python print at most 17 significant digits.
pub(crate) const MAX_EXP_FRACTION: usize = 20;

/// The `integral` primitive: the spellings of integers. `-12`, `2.0`, and exponent forms
/// whose value is integral, as Rust and Python print large integral floats: one digit
/// before the point, the fraction's digits beyond the exponent all zeros (`1.5e1`,
/// `1.50e1`, `-5.6e+37`, `3e0`), fractions of up to [`MAX_EXP_FRACTION`] digits and
/// exponents up to 299, so that the value is a finite double (`1e1965` is valid JSON but
/// no parser's number). Negative exponents are not taken (`10e-1` is 1, but refused).
fn integral_body() -> String {
    // Exponents from `f` to 299, after any leading zeros.
    let upto_299 = "[12] [0-9] [0-9]";
    let ge = |f: usize| match f {
        0 => format!("[0-9] | [1-9] [0-9] | {upto_299}"),
        1..=9 => format!("[{f}-9] | [1-9] [0-9] | {upto_299}"),
        _ => format!(
            "\"{}\" [{}-9] | [{}-9] [0-9] | {upto_299}",
            f / 10,
            f % 10,
            f / 10 + 1
        ),
    };
    let mut alts = vec![
        r#"integer ( "." "0"+ )?"#.to_string(),
        format!(r#""-"? [0-9] ( "." "0"+ )? [eE] "+"? "0"* ( {} )"#, ge(0)),
    ];
    for f in 1..=MAX_EXP_FRACTION {
        alts.push(format!(
            r#""-"? [0-9] "." [0-9]{{{f}}} "0"* [eE] "+"? "0"* ( {} )"#,
            ge(f)
        ));
    }
    alts.join(" | ")
}

fn prim_deps(name: &str) -> &'static [&'static str] {
    match name {
        "value" => &["object", "array", "string", "number", "boolean", "null"],
        "object" => &["ws", "string", "value"],
        "array" => &["ws", "value"],
        "string" => &["char"],
        "number" => &["integer", "frac", "exp"],
        "integral" => &["integer"],
        _ => &[],
    }
}

/// A GBNF string literal for `s` (the grammar printer's spelling).
pub(crate) fn lit(s: &str) -> String {
    show(&Expr::Literal(s.chars().collect()), &[])
}

/// JSON Pointer `path` extended by `key`.
pub(crate) fn pointer_child(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// Choices of the conversion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchemaOptions {
    /// Objects without `additionalProperties` take only their declared members (the
    /// specification allows any other member). A narrower language: valid instances with
    /// undeclared members are refused, and masks at member names are much cheaper (a few
    /// names instead of nearly any string).
    pub closed_objects: bool,
    /// Whitespace between tokens is at most one space, or a newline and up to 20 spaces or
    /// tabs (the specification allows any amount). For generation: a model cannot pad
    /// for ever.
    pub bounded_space: bool,
}

impl SchemaOptions {
    /// What generation uses: closed objects and bounded whitespace. Every output is valid
    /// against the schema; the language is narrower than the schema's.
    pub const GENERATION: SchemaOptions = SchemaOptions {
        closed_objects: true,
        bounded_space: true,
    };
}

/// The converter's state: rules written so far, names taken, references and merged
/// schemas already converted, and what was relaxed or ignored.
pub(crate) struct Conv<'a> {
    root: &'a Value,
    rules: Vec<(String, String)>,
    taken: HashSet<String>,
    /// Next `-vN` suffix to try per name base.
    suffix: HashMap<String, usize>,
    refs: HashMap<String, String>,
    /// Canonical text of a merged schema → its rule (so a recursion through `allOf` ends).
    merged: HashMap<String, String>,
    /// Text of a subschema converted → its rule, and its notes with paths relative to
    /// it (`true`: a warning), see `visit`.
    seen: HashMap<String, (String, Vec<(bool, SchemaNote)>)>,
    /// Sorted declared names → the rule of keys that are none of them.
    key_rules: HashMap<Vec<String>, String>,
    /// Body → rule, for the rules written through [`Conv::shared_rule`].
    shared: HashMap<String, String>,
    prims: Vec<&'static str>,
    /// References being expanded by the merge in progress (a cycle is an error).
    merging: Vec<String>,
    /// Subschemas visited at once.
    depth: usize,
    /// Subschemas visited so far.
    work: usize,
    /// Grammar text written so far.
    size: usize,
    /// Notes in the order first met, and the sets of them (a schema whose references
    /// are expanded many times meets the same note tens of thousands of times: a search
    /// of the list for each took most of a minute on SchemaStore's `azure-pipelines`).
    warnings: Vec<SchemaNote>,
    relaxations: Vec<SchemaNote>,
    warned: HashSet<SchemaNote>,
    relaxed: HashSet<SchemaNote>,
    pub(crate) options: SchemaOptions,
}

impl<'a> Conv<'a> {
    fn new(root: &'a Value, options: SchemaOptions) -> Self {
        Conv {
            options,
            root,
            rules: Vec::new(),
            taken: HashSet::new(),
            suffix: HashMap::new(),
            refs: HashMap::new(),
            merged: HashMap::new(),
            seen: HashMap::new(),
            key_rules: HashMap::new(),
            shared: HashMap::new(),
            prims: Vec::new(),
            merging: Vec::new(),
            depth: 0,
            work: 0,
            size: 0,
            warnings: Vec::new(),
            relaxations: Vec::new(),
            warned: HashSet::new(),
            relaxed: HashSet::new(),
        }
    }

    pub(crate) fn prim(&mut self, name: &'static str) -> String {
        if !self.prims.contains(&name) {
            self.prims.push(name);
            for d in prim_deps(name) {
                self.prim(d);
            }
        }
        name.to_string()
    }

    /// A rule name's base from any hint: `r-` and its ASCII letters and digits,
    /// lowercase, with every run of other characters as one dash, 48 characters at most.
    /// One pass that stops at the 48th character: hints are JSON pointers, some of them
    /// hundreds of characters long, and an object asks for one name per set of members.
    fn name_base(hint: &str) -> String {
        let mut out = String::with_capacity(50);
        out.push_str("r-");
        let (mut len, mut gap) = (0, false);
        for c in hint.chars() {
            if !c.is_ascii_alphanumeric() {
                gap = true;
                continue;
            }
            if gap && len > 0 {
                if len + 1 >= 48 {
                    // The dash would be the 48th character (cut, then trimmed) or past it.
                    break;
                }
                out.push('-');
                len += 1;
            }
            gap = false;
            if len == 48 {
                break;
            }
            out.push(c.to_ascii_lowercase());
            len += 1;
        }
        if len == 0 {
            "r".to_string()
        } else {
            out
        }
    }

    /// Whether `name_base` would give `r-` and the hint unchanged.
    fn is_clean_hint(hint: &str) -> bool {
        !hint.is_empty()
            && hint.len() <= 48
            && hint
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !hint.starts_with('-')
            && !hint.ends_with('-')
            && !hint.contains("--")
    }

    pub(crate) fn fresh_name(&mut self, hint: &str) -> String {
        // A hint already in the form `name_base` gives (lowercase words joined by single
        // dashes, 48 bytes at most: `key-not-declared`, asked once per node of every key
        // trie) is taken as it is.
        let base = if Self::is_clean_hint(hint) {
            format!("r-{hint}")
        } else {
            Self::name_base(hint)
        };
        // The next free suffix per base, so many rules of one hint cost no rescans.
        let n = self.suffix.entry(base.clone()).or_insert(1);
        let mut name = if *n == 1 {
            base.clone()
        } else {
            format!("{base}-v{n}")
        };
        while self.taken.contains(&name) {
            *n += 1;
            name = format!("{base}-v{n}");
        }
        *n += 1;
        self.taken.insert(name.clone());
        name
    }

    pub(crate) fn add_rule(&mut self, hint: &str, body: String) -> String {
        let name = self.fresh_name(hint);
        self.push_rule(name.clone(), body);
        name
    }

    /// [`Conv::add_rule`], or the rule written before with the same body: one rule for
    /// each of the many copies a schema asks for (the nodes of its key tries that share a
    /// suffix, the escapes of keys).
    pub(crate) fn shared_rule(&mut self, hint: &str, body: String) -> String {
        if let Some(name) = self.shared.get(&body) {
            return name.clone();
        }
        let name = self.add_rule(hint, body.clone());
        self.shared.insert(body, name.clone());
        name
    }

    pub(crate) fn push_rule(&mut self, name: String, body: String) {
        self.size += name.len() + body.len();
        self.rules.push((name, body));
    }

    /// Whether the grammar written so far is past [`MAX_WORK`].
    pub(crate) fn over_budget(&self) -> bool {
        self.work > MAX_WORK || self.size / 64 > MAX_WORK
    }

    /// Records that the grammar accepts more than the schema at `path` (`keyword`): the
    /// finished text is validated.
    pub(crate) fn relax(&mut self, path: &str, keyword: &str, msg: impl Into<String>) {
        let note = SchemaNote {
            path: path.to_string(),
            keyword: keyword.to_string(),
            msg: msg.into(),
        };
        if self.relaxed.insert(note.clone()) {
            self.relaxations.push(note);
        }
    }

    /// Records a keyword ignored (unknown to the specification, or an annotation of a
    /// vendor).
    pub(crate) fn warn(&mut self, path: &str, keyword: &str, msg: impl Into<String>) {
        let note = SchemaNote {
            path: path.to_string(),
            keyword: keyword.to_string(),
            msg: msg.into(),
        };
        if self.warned.insert(note.clone()) {
            self.warnings.push(note);
        }
    }

    pub(crate) fn resolve(&self, reference: &str, path: &str) -> Result<&'a Value, SchemaError> {
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

    fn finish(mut self, root: String) -> String {
        let mut text = format!("root ::= {root}\n");
        for (name, body) in &self.rules {
            let _ = writeln!(text, "{name} ::= {body}");
        }
        self.prims.sort_unstable();
        let integral = integral_body();
        for p in &self.prims {
            let body = match *p {
                // Generation's whitespace: none, one space, or a newline and an indent of at
                // most 20 (a model cannot pad for ever).
                "ws" if self.options.bounded_space => r#"( " " | "\n" [ \t]{0,20} )?"#,
                "integral" => integral.as_str(),
                _ => {
                    PRIMITIVES
                        .iter()
                        .find(|x| x.0 == *p)
                        .expect("known primitive")
                        .1
                }
            };
            let _ = writeln!(text, "{p} ::= {body}");
        }
        text
    }
}

/// Converts a JSON Schema to GBNF text (rules `root`, `r-...`, and primitives). Relaxations
/// are not reported here: use [`compile_schema`] for a grammar that carries them.
pub fn schema_to_gbnf(schema: &Value) -> Result<String, SchemaError> {
    convert(schema, SchemaOptions::default()).map(|(text, _, _)| text)
}

type Converted = (String, Vec<SchemaNote>, Vec<SchemaNote>);

fn convert(schema: &Value, options: SchemaOptions) -> Result<Converted, SchemaError> {
    let mut c = Conv::new(schema, options);
    let root = c.visit(schema, "")?;
    let (warnings, relaxations) = (
        std::mem::take(&mut c.warnings),
        std::mem::take(&mut c.relaxations),
    );
    Ok((c.finish(root), warnings, relaxations))
}

/// Parses JSON Schema text and converts it to a validated grammar. The grammar carries the
/// schema, the warnings and the relaxations ([`Grammar::schema`]); when something was
/// relaxed it carries the validator that checks finished text too.
pub fn compile_schema(text: &str) -> Result<Grammar, SchemaError> {
    let v: Value = serde_json::from_str(text)
        .or_else(|e| err("", "(json)", format!("not valid JSON: {e}")))?;
    compile_schema_value(&v)
}

/// [`compile_schema`] with [`SchemaOptions`].
pub fn compile_schema_with(text: &str, options: SchemaOptions) -> Result<Grammar, SchemaError> {
    let v: Value = serde_json::from_str(text)
        .or_else(|e| err("", "(json)", format!("not valid JSON: {e}")))?;
    compile_value(&v, options)
}

/// [`compile_schema`] for a parsed schema.
pub fn compile_schema_value(v: &Value) -> Result<Grammar, SchemaError> {
    compile_value(v, SchemaOptions::default())
}

fn compile_value(v: &Value, options: SchemaOptions) -> Result<Grammar, SchemaError> {
    let (gbnf, warnings, relaxations) = convert(v, options)?;
    let mut g = parse(&gbnf).or_else(|e| {
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
    })?;
    g.schema = Some(Arc::new(SchemaInfo::new(v, warnings, relaxations)?));
    Ok(g)
}
