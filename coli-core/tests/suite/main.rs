//! coli-core's integration tests as one binary (one link instead of one per file).

mod bad_input;
mod fuzz_seeded;
mod gguf_quants;
