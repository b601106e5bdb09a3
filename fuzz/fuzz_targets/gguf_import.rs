//! Any bytes as a GGUF imported to a Hugging Face directory (in a temp directory): never
//! a panic; a success opens as a model directory, a failure leaves nothing behind.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

static SCRATCH: OnceLock<tempfile::TempDir> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let dir = SCRATCH.get_or_init(|| tempfile::tempdir().expect("temp dir"));
    coli_models::gguf_import::fuzzing::import(data, dir.path());
});
