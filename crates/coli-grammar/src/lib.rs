//! coli-grammar: constrained output.
//!
//! * [`gbnf`]: the GBNF grammar language (llama.cpp's dialect) — parser and validation
//!   (undefined and duplicate rules, empty grammars, left recursion), with errors that carry
//!   line, column and the rule's name.

pub mod gbnf;

pub use gbnf::{parse, Expr, Grammar, GrammarError, Rule};
