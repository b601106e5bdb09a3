//! Any bytes as `config.json`: parsing and every shared key coli reads never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = coli_core::fuzzing::config(data);
});
