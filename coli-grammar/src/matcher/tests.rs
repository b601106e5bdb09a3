//! The matcher's unit tests.

use super::*;

proptest::proptest! {
    /// The ASCII set of a character class, built from its ranges, says what `accepts`
    /// says of each ASCII character, negated or not.
    #[test]
    fn ascii_sets_agree_with_accepts(
        spans in proptest::collection::vec((0u32..300, 0u32..40), 0..8),
        negated: bool,
    ) {
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        let mut sorted = spans.clone();
        sorted.sort_unstable();
        for (a, len) in sorted {
            let b = a + len;
            match ranges.last_mut() {
                Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
                _ => ranges.push((a, b)),
            }
        }
        let e = Elem::Chars { negated, ranges };
        let set = e.ascii_set();
        for c in 0..128u32 {
            proptest::prop_assert_eq!(set >> c & 1 == 1, e.accepts(c), "{:?} at {}", e, c);
        }
    }
}
use crate::gbnf::parse;

fn g(src: &str) -> Compiled {
    Compiled::new(&parse(src).unwrap())
}

#[test]
fn accepts_exactly_the_language() {
    let c = g(r#"
root ::= "{" ws pair ("," ws pair)* ws "}"
pair ::= key ":" ws num
key  ::= [a-z] [a-z0-9_]{0,3}
num  ::= "-"? [0-9]{1,3}
ws   ::= [ ]*
"#);
    for ok in ["{a:1}", "{ ab_1: -12,  c:999}", "{a:1,b:2 }"] {
        assert!(Matcher::matches(&c, ok), "{ok}");
    }
    for bad in [
        "",
        "{",
        "{a:}",
        "{abcde:1}",
        "{a:1234}",
        "{a:1,}",
        "{A:1}",
        "{a:1}x",
    ] {
        assert!(!Matcher::matches(&c, bad), "{bad}");
    }
    // Prefixes are alive but not complete; a wrong byte is refused without moving.
    let mut m = c.matcher();
    assert!(m.accept_bytes(b"{ab:"));
    assert!(!m.is_complete());
    assert!(!m.accept_bytes(b"x"));
    assert!(m.accept_bytes(b"7}"));
    assert!(m.is_complete() && m.is_dead_end());
}

#[test]
fn utf8_characters_may_be_split_across_calls() {
    let c = g(r#"root ::= "é" [^a]+ "\u00e9""#);
    let text = "éüé".as_bytes();
    let mut m = c.matcher();
    for b in text {
        assert!(m.accept_bytes(&[*b]));
    }
    assert!(m.is_complete());
    let mut m = c.matcher();
    assert!(!m.accept_bytes(&[0xFF]), "invalid UTF-8 is refused");
    // Half of a character the grammar cannot take is refused at once: "é" is C3 A9;
    // E2 starts U+2000..U+2FFF, none of which is "é"; E0 starts U+0800..U+0FFF (not
    // U+0000: the shortest-form rule), none of which is "é" either.
    assert!(!m.accept_bytes(&[0xE2]));
    assert!(!m.accept_bytes(&[0xE0]));
    assert!(!g(r#"root ::= "{""#).matcher().accept_bytes(&[0xE0]));
    assert!(m.accept_bytes(&[0xC3]));
    let g2 = g(r#"root ::= [^à-ÿ] "x""#);
    // C3 starts U+00C0..U+00FF: with U+00E0..U+00FF excluded, U+00C0..U+00DF remain.
    assert!(g2.matcher().accept_bytes(&[0xC3]));
    let g3 = g(r#"root ::= [^À-ÿ] "x""#);
    assert!(!g3.matcher().accept_bytes(&[0xC3]));
    assert!(g3.matcher().accept_bytes(&[0xC4]));
    assert!(!Matcher::matches(&c, "éaé"));
}

/// `(a | bc)* d?` recognized by hand: the reference for the property test.
fn reference(t: &str) -> bool {
    let b = t.as_bytes();
    let mut i = 0;
    loop {
        match b.get(i) {
            Some(b'a') => i += 1,
            Some(b'b') if b.get(i + 1) == Some(&b'c') => i += 2,
            _ => break,
        }
    }
    if b.get(i) == Some(&b'd') {
        i += 1;
    }
    i == b.len()
}

proptest::proptest! {
    /// The matcher agrees with a hand-written recognizer on any string over the
    /// alphabet, fed whole or byte by byte.
    #[test]
    fn agrees_with_a_reference_recognizer(t in "[abcd]{0,12}") {
        let c = g(r#"root ::= ("a" | "b" "c")* "d"?"#);
        proptest::prop_assert_eq!(Matcher::matches(&c, &t), reference(&t));
        let mut m = c.matcher();
        let mut alive = true;
        for b in t.bytes() {
            alive = alive && m.accept_bytes(&[b]);
        }
        proptest::prop_assert_eq!(alive && m.is_complete(), reference(&t));
    }
}

#[test]
fn the_automaton_starts_afresh_past_its_bound_and_matchers_carry_on() {
    // Every digit is a new state (a counter): 2 x 10000 states pass the bound once.
    let c = g(r#"root ::= [0-9]{0,10000} "x" [0-9]{0,10000}"#);
    let mut m = c.matcher();
    let mut other = c.matcher();
    assert!(other.accept_bytes(b"12"));
    for _ in 0..10000 {
        assert!(m.accept_bytes(b"7"));
    }
    assert!(!m.accept_bytes(b"7"), "the 10001st digit");
    assert!(m.accept_bytes(b"x"));
    for _ in 0..10000 {
        assert!(m.accept_bytes(b"3"));
    }
    assert!(m.is_complete() && !m.accept_bytes(b"3"));
    // A matcher from before the restart is found again from its own stacks.
    assert!(other.accept_bytes(b"x9"));
    assert!(other.is_complete());
    let mut mask = crate::TokenMask::default();
    crate::TokenTrie::new(&[b"1".to_vec(), b"x".to_vec()]).mask(&other, &mut mask);
    assert!(mask.is_allowed(0) && !mask.is_allowed(1));
}

#[test]
fn repetitions_of_bodies_that_can_be_empty_terminate() {
    // Found by the fuzzer: `x{0}*` and `(y?)*` once expanded for ever.
    let c = g(r#"root ::= " -w"{0}* "a""#);
    assert!(Matcher::matches(&c, "a") && !Matcher::matches(&c, " -wa"));
    let c = g(r#"root ::= ("b"? "c"?)* "d""#);
    for (t, want) in [
        ("d", true),
        ("bcbd", true),
        ("ccd", true),
        ("bd", true),
        ("bdd", false),
    ] {
        assert_eq!(Matcher::matches(&c, t), want, "{t}");
    }
}

#[test]
fn bounded_and_unbounded_repetitions() {
    let c = g(r#"root ::= "a"{2,4} ("b" | "c")* "d"{3}"#);
    for (t, want) in [
        ("aaddd", true),
        ("aaaabcbcddd", true),
        ("addd", false),
        ("aaaaaddd", false),
        ("aadd", false),
    ] {
        assert_eq!(Matcher::matches(&c, t), want, "{t}");
    }
}
