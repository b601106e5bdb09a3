//! Any bytes as `model.safetensors.index.json`: the full parse and the names-only parse
//! agree, and shard names are plain file names.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = coli_core::fuzzing::safetensors_index(data);
});
