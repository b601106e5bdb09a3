//! Any text as a GBNF grammar: parsing never panics; a grammar that parses compiles, its
//! printed form parses back to the same grammar, and a matcher runs over the input bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(g) = coli_grammar::parse(text) {
        assert_eq!(coli_grammar::parse(&g.to_gbnf()).as_ref(), Ok(&g));
        let c = coli_grammar::Compiled::new(&g);
        let mut m = c.matcher();
        for &b in data.iter().take(256) {
            if !m.accept_bytes(&[b]) {
                break;
            }
        }
        let _ = m.forced_bytes(64);
    }
});
