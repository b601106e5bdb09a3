//! Any bytes as a safetensors file: header validation never panics, and what it accepts
//! is in bounds, sized by shape × dtype, free of overlaps, and converts to f32.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = coli_core::fuzzing::safetensors(data);
});
