//! Any text as a GBNF grammar: parsing never panics; a grammar that parses compiles, its
//! printed form parses back to a grammar printed the same, and a matcher runs over the input bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(g) = coli_grammar::parse(text) {
        // Printing is a fixed point (an empty sequence and an empty literal print alike).
        let printed = g.to_gbnf();
        let again = coli_grammar::parse(&printed).expect("a printed grammar parses");
        assert_eq!(again.to_gbnf(), printed);
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
