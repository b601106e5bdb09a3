//! Any text as a JSON Schema: conversion never panics, and every grammar it produces parses
//! (conversion errors name the keyword, even an empty one).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match coli_grammar::compile_schema(text) {
        Ok(g) => {
            let c = coli_grammar::Compiled::new(&g);
            let _ = c.matcher().forced_bytes(64);
        }
        Err(e) => assert!(e.to_string().contains(&format!("{:?}", e.keyword))),
    }
});
