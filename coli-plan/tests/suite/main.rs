//! coli-plan's integration tests as one binary (one link instead of one per file).

mod analyze;
mod common;
mod fuzz_seeded;
mod plan;
