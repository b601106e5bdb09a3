//! Any bytes as a GGUF file: parsing never panics, every accepted tensor dequantizes, the
//! output is bounded by the file size; raw bytes dequantize as each ggml type.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = coli_core::fuzzing::gguf(data);
});
