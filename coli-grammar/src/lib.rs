//! coli-grammar: constrained output.
//!
//! * [`gbnf`]: the GBNF grammar language (llama.cpp's dialect) — parser and validation
//!   (undefined and duplicate rules, empty grammars, left recursion), with errors that carry
//!   line, column and the rule's name.
//! * [`schema`]: JSON Schema → GBNF ([`regex`]: the `pattern` subset); keywords without a
//!   grammar relax it, and finished text is then validated (`jsonschema`).
//! * [`matcher`]: which text a grammar still allows, byte by byte (UTF-8 aware), and where
//!   the text is complete.
//! * [`mask`]: the tokens of a vocabulary the grammar allows next, through a byte trie.
//! * [`corpus`]: the schema corpus of the tests and benchmarks.
//! * [`cache`]: compiled grammars keyed on their text.

pub mod cache;
pub mod corpus;
pub mod gbnf;
pub mod mask;
pub mod matcher;
pub mod regex;
pub mod schema;
mod slices;
#[cfg(test)]
mod tests_shortcuts;

pub use cache::GrammarCache;
pub use gbnf::{parse, Expr, Grammar, GrammarError, Rule};
pub use mask::{TokenMask, TokenTrie};
pub use matcher::{Compiled, Matcher, MatcherState};
pub use schema::{
    compile_schema, compile_schema_value, parse_strict, schema_to_gbnf, validator_for, SchemaError,
    SchemaInfo, SchemaNote, Violation,
};
