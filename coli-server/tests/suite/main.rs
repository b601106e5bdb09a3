//! coli-server's integration tests as one binary (one link instead of one per file).

mod common;
mod server;
mod tools;
