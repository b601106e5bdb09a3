//! coli-grammar's integration tests as one binary (one link instead of one per file).

mod corpus;
mod limits;
mod public_corpus;
mod random_schemas;
mod realworld;
