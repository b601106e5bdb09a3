//! Any bytes as a `.coli_usage` routing history (its parser lives in coli-models): parsing
//! never panics, and what parses renders and parses back to the same counts.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(u) = coli_models::experts::usage::parse(text) {
        let again = coli_models::experts::usage::parse(&coli_models::experts::usage::render(&u))
            .expect("rendered history parses");
        let nonzero: coli_models::experts::usage::Usage = u.into_iter().filter(|&(_, n)| n > 0).collect();
        assert_eq!(again, nonzero);
    }
});
