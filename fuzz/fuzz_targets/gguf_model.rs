//! Any bytes as a GGUF model file: opening it (metadata to config, tensor names, stacked
//! experts sliced, Q/K rows reordered) never panics, and every view lies inside the file
//! with the bytes its type and shape need.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = coli_core::fuzzing::gguf_model(data);
});
