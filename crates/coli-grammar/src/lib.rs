//! coli-grammar: constrained output.
//!
//! * [`gbnf`]: the GBNF grammar language (llama.cpp's dialect) — parser and validation
//!   (undefined and duplicate rules, empty grammars, left recursion), with errors that carry
//!   line, column and the rule's name.
//! * [`matcher`]: which text a grammar still allows, byte by byte (UTF-8 aware), and where
//!   the text is complete.

pub mod gbnf;
pub mod matcher;

pub use gbnf::{parse, Expr, Grammar, GrammarError, Rule};
pub use matcher::{Compiled, Matcher};
