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

/// The bytes a matcher must write next, checked against the grammar's text by hand: a
/// literal is forced up to a choice, a class of more than one character, completion or
/// `max`; a character is never cut in half; nothing is forced inside a split character.
#[test]
fn forced_bytes_are_exactly_the_literal_up_to_the_first_choice() {
    let c = g(r#"root ::= "abc" [xy] "d""#);
    let m = c.matcher();
    assert_eq!(m.forced_bytes(10), b"abc");
    assert_eq!(m.forced_bytes(2), b"ab");
    assert_eq!(m.forced_bytes(0), b"");
    let mut m = c.matcher();
    assert!(m.accept_bytes(b"abcx"));
    assert_eq!(m.forced_bytes(10), b"d");
    assert!(m.accept_bytes(b"d"));
    assert_eq!(m.forced_bytes(10), b"", "complete with nothing after");

    // A shared prefix of two alternatives is forced; the choice after it is not.
    assert_eq!(g(r#"root ::= "ab" | "ac""#).matcher().forced_bytes(8), b"a");
    // A range of three characters is a choice even when it starts the text.
    assert_eq!(g(r#"root ::= [a-c] "d""#).matcher().forced_bytes(8), b"");
    // Text that is already complete may end here: ending is a choice.
    let c = g(r#"root ::= "a" "b"?"#);
    let mut m = c.matcher();
    assert!(m.accept_bytes(b"a"));
    assert_eq!(m.forced_bytes(8), b"");

    // "é" is two bytes: a budget of one byte forces nothing, two force it whole.
    let c = g(r#"root ::= "éz""#);
    let m = c.matcher();
    assert_eq!(m.forced_bytes(1), b"");
    assert_eq!(m.forced_bytes(2), "é".as_bytes());
    assert_eq!(m.forced_bytes(3), "éz".as_bytes());
    let mut m = c.matcher();
    assert!(m.accept_bytes(&"é".as_bytes()[..1]));
    assert_eq!(m.forced_bytes(8), b"", "inside a split character");
    // Forcing fills the shared automaton's caches only: fresh matchers still take the text.
    assert!(Matcher::matches(&c, "éz"));
    let mut m3 = c.matcher();
    assert!(m3.accept_bytes("éz".as_bytes()) && m3.is_complete());
}

/// `state()` is the parse stacks and the pending bytes: equal for the same text, different
/// for different text, the first byte of a split character pending, an empty stack once
/// the text is complete.
#[test]
fn state_shows_the_stacks_and_the_pending_bytes() {
    let c = g(r#"root ::= "a" ("b" | "é")"#);
    let fresh = c.matcher();
    let (stacks, pending) = fresh.state();
    assert!(!stacks.is_empty() && stacks.iter().all(|s| !s.is_empty()));
    assert!(pending.is_empty());

    let mut a1 = c.matcher();
    let mut a2 = c.matcher();
    assert!(a1.accept_bytes(b"a") && a2.accept_bytes(b"a"));
    assert_eq!(a1.state(), a2.state());
    assert_ne!(a1.state(), fresh.state());

    assert!(a1.accept_bytes(&"é".as_bytes()[..1]));
    assert_eq!(a1.state().1, &"é".as_bytes()[..1]);
    assert_ne!(a1.state(), a2.state());

    assert!(a2.accept_bytes(b"b"));
    let (stacks, pending) = a2.state();
    assert!(pending.is_empty());
    assert!(stacks.iter().any(Vec::is_empty), "complete: an empty stack");
}

/// The automaton's size counts what was built (this pins the implementation's counting, a
/// diagnostic: a change of what is precomputed changes the numbers): the start state only, until characters are
/// stepped; then one state per new parse position, a state's whole ASCII row of 128
/// transitions at its first ASCII step (the row is filled at once), one byte transition
/// into `é`'s first byte (a checked unfinished character), and one map entry for `é`.
#[test]
fn the_automaton_size_counts_states_transitions_and_split_characters() {
    let c = g(r#"root ::= "aéb""#);
    assert_eq!(c.automaton_size(), (1, 0, 0));
    let mut m = c.matcher();
    assert!(m.accept_bytes(b"a"));
    assert_eq!(c.automaton_size(), (2, 128, 0));
    assert!(m.accept_bytes(&"é".as_bytes()[..1]));
    assert_eq!(c.automaton_size(), (2, 129, 1));
    assert!(m.accept_bytes(&"é".as_bytes()[1..]));
    assert_eq!(c.automaton_size(), (3, 130, 1));
    // The same text again walks what was built: nothing new.
    let mut m = c.matcher();
    assert!(m.accept_bytes("aé".as_bytes()));
    assert_eq!(c.automaton_size(), (3, 130, 1));
}

/// A grammar compiled from a JSON Schema carries the schema and its notes; one written in
/// GBNF carries none.
#[test]
fn a_schema_grammar_carries_its_schema() {
    let text = r#"{"type":"object","properties":{"n":{"type":"integer"}},"x-vendor":1}"#;
    let c = Compiled::new(&crate::schema::compile_schema(text).unwrap());
    let info = c.schema().expect("compiled from a schema");
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(info.schema(), &v);
    assert_eq!(info.warnings().len(), 1);
    assert_eq!(info.warnings()[0].keyword, "x-vendor");
    assert!(g(r#"root ::= "a""#).schema().is_none());
}

/// A wide grammar (2,100 alternatives, each through a rule of its own: twice as many
/// frames as stacks when the start state expands) is not cut short: every alternative's
/// text is accepted, the first and the last alike, and nothing else is.
#[test]
fn thousands_of_alternatives_through_rules_are_all_kept() {
    let word = |i: usize| {
        let l = |k: usize| char::from(b'a' + (k % 26) as u8);
        format!("{}{}{}", l(i / 676), l(i / 26), l(i))
    };
    let n = 2100;
    let mut src = String::from("root ::= ");
    src.push_str(
        &(0..n)
            .map(|i| format!("r{i}"))
            .collect::<Vec<_>>()
            .join(" | "),
    );
    for i in 0..n {
        src.push_str(&format!("\nr{i} ::= \"{}\"", word(i)));
    }
    let c = g(&src);
    for i in [0, 1, n / 2, n - 2, n - 1] {
        assert!(
            Matcher::matches(&c, &word(i)),
            "alternative {i}: {}",
            word(i)
        );
    }
    assert!(
        !Matcher::matches(&c, &word(n)),
        "{} is not an alternative",
        word(n)
    );
}

/// Two characters sharing a lead byte lead to different places (the continuation byte
/// decides), in one shared automaton whichever is stepped first.
#[test]
fn characters_with_the_same_lead_byte_are_told_apart() {
    // "é" is C3 A9 and "ü" C3 BC.
    let c = g(r#"root ::= "é" "1" | "ü" "2""#);
    assert!(Matcher::matches(&c, "é1"));
    assert!(Matcher::matches(&c, "ü2"));
    assert!(!Matcher::matches(&c, "ü1"));
    assert!(!Matcher::matches(&c, "é2"));
    let c = g(r#"root ::= "é" "1" | "ü" "2""#);
    assert!(Matcher::matches(&c, "ü2"));
    assert!(Matcher::matches(&c, "é1"));
    // U+0080, the first character past ASCII (C2 80), and U+007F, the last of it.
    let c = g(r#"root ::= [\u0080] "a" | [\x7F] "b""#);
    assert!(Matcher::matches(&c, "\u{80}a"));
    assert!(Matcher::matches(&c, "\u{7f}b"));
    assert!(!Matcher::matches(&c, "\u{80}b"));
    assert!(!Matcher::matches(&c, "\u{81}a"));
    // A continuation byte where a character starts is refused, 0x80 the first of them.
    for b in [0x80u8, 0x81, 0xBF] {
        assert!(!c.matcher().accept_bytes(&[b]), "{b:#x}");
    }
}

/// Nesting is bounded: a stack deeper than `MAX_STACK` frames is dropped, so text nested
/// well past it is refused (and does not exhaust memory), while nesting well within it is
/// accepted.
#[test]
fn nesting_past_the_stack_bound_is_refused() {
    let c = g(r#"root ::= "(" root ")" | "x""#);
    let nested = |k: usize| format!("{}x{}", "(".repeat(k), ")".repeat(k));
    assert!(Matcher::matches(&c, &nested(MAX_STACK - 100)));
    assert!(!Matcher::matches(&c, &nested(MAX_STACK + 100)));
}

/// `accept_char` advances by the character's UTF-8 bytes, or refuses and leaves the
/// matcher as it was; `is_dead_end` is true only once nothing more may follow.
#[test]
fn characters_advance_and_dead_ends_are_only_at_the_end() {
    let c = g(r#"root ::= "é" [0-9]"#);
    let mut m = c.matcher();
    assert!(!m.is_dead_end());
    assert!(!m.accept_char('e'));
    assert!(m.accept_char('é'));
    assert!(!m.is_dead_end() && !m.is_complete());
    assert!(!m.accept_char('x'));
    assert!(m.accept_char('7'));
    assert!(m.is_complete() && m.is_dead_end());
    assert!(!m.accept_char('7'));
}

/// States of hundreds of stacks: 150 alternatives that each take letters, then a dash,
/// then a suffix of their own (so every state holds 150 copies of the same letter class
/// under different continuations, and then 150 suffix tops), and 90 alternatives that
/// each start with a different character (more distinct ASCII sets than the grouping
/// takes). Every text agrees with a recognizer written by hand.
#[test]
fn states_of_hundreds_of_stacks_step_as_each_stack_would() {
    let suffix = |i: usize| {
        let l = |k: usize| char::from(b'a' + (k % 26) as u8);
        format!("{}{}", l(i / 26), l(i))
    };
    let n = 150;
    let mut src = String::from("root ::= ");
    src.push_str(
        &(0..n)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" | "),
    );
    src.push_str(" | pairs");
    for i in 0..n {
        src.push_str(&format!("\nw{i} ::= [a-z]+ \"-\" \"{}\"", suffix(i)));
    }
    // 88 first characters (90 from `!` on, without `"` and `\`), each with its own second
    // one: `!` then `0`, `#` then `2`...
    let firsts: Vec<(char, char)> = (0..90u8)
        .map(|i| (char::from(b'!' + i), char::from(b'0' + i % 10)))
        .filter(|&(a, _)| a != '"' && a != '\\')
        .collect();
    src.push_str("\npairs ::= ");
    src.push_str(
        &firsts
            .iter()
            .map(|(a, b)| format!("\"{a}\" \"{b}\""))
            .collect::<Vec<_>>()
            .join(" | "),
    );
    let c = g(&src);
    let reference = |t: &str| {
        if let Some((letters, rest)) = t.split_once('-') {
            if !letters.is_empty()
                && letters.bytes().all(|b| b.is_ascii_lowercase())
                && (0..n).any(|i| suffix(i) == rest)
            {
                return true;
            }
        }
        let cs: Vec<char> = t.chars().collect();
        cs.len() == 2 && firsts.contains(&(cs[0], cs[1]))
    };
    let mut texts: Vec<String> = Vec::new();
    for i in (0..n).step_by(7).chain([n - 1]) {
        for letters in ["a", "xyz", "q"] {
            texts.push(format!("{letters}-{}", suffix(i)));
        }
    }
    texts.extend(["-aa", "a-", "a-zz", "ab-f", "A-aa", "a-aaa", "aa", "a--aa"].map(String::from));
    for &(a, b) in &firsts {
        texts.push(format!("{a}{b}"));
        texts.push(format!(
            "{a}{}",
            if b == '9' {
                '0'
            } else {
                char::from(b as u8 + 1)
            }
        ));
        texts.push(a.to_string());
    }
    let mut accepted = 0;
    for t in &texts {
        let want = reference(t);
        accepted += want as usize;
        assert_eq!(Matcher::matches(&c, t), want, "{t:?}");
    }
    // Both kinds of text occur.
    assert!(accepted > 100 && accepted < texts.len() - 100, "{accepted}");
}

/// An automaton kept for reuse comes back as a new one: after masks and matches built
/// states, frames, relative stacks and caches, emptying it leaves nothing a new automaton
/// lacks (its debug form, every table and map, equals a default one's).
#[test]
fn an_emptied_automaton_equals_a_new_one() {
    let schema = r#"{"type":"object","properties":{"a":{"type":"integer"},"bc":{"type":"string"},"e":{"enum":["é","ü"]}},
        "required":["a"],"additionalProperties":{"type":"number"}}"#;
    let c = Compiled::new(&crate::compile_schema(schema).unwrap());
    let vocab: Vec<Vec<u8>> = [
        "{\"",
        "a",
        "bc",
        "\":",
        "1",
        ",",
        "}",
        "\"x\\u00e9",
        "é",
        "2.5",
    ]
    .iter()
    .map(|t| t.as_bytes().to_vec())
    .collect();
    let trie = crate::TokenTrie::new(&vocab);
    let mut mask = crate::TokenMask::default();
    let mut m = c.matcher();
    for piece in ["{\"", "a", "\":", "1", ",", "\"x\\u00e9", "\":", "2.5", "}"] {
        trie.mask(&m, &mut mask);
        assert!(m.accept_bytes(piece.as_bytes()), "{piece}");
    }
    assert!(Matcher::matches(&c, r#"{"bc":"é","a":3,"e":"ü"}"#));
    let mut d = std::mem::take(&mut *c.dfa.lock().unwrap());
    assert!(
        d.states.len() > 5 && !d.rel_steps.is_empty() && !d.chars.is_empty(),
        "the automaton was used"
    );
    d.empty();
    assert_eq!(format!("{d:?}"), format!("{:?}", Dfa::default()));
}

#[test]
fn an_emptied_automaton_keeps_little_room_in_its_maps() {
    // A spare automaton's maps grown for a large grammar would spread the next, small
    // automaton's entries over megabytes (BENCHMARKS.md, issue 17).
    let mut d = Dfa::default();
    for i in 0..20_000u32 {
        d.frame((i, 0, 0), NIL);
        d.index.insert(i as u64, vec![i]);
    }
    assert!(d.frame_index.capacity() >= 20_000 && d.index.capacity() >= 20_000);
    d.empty();
    for (name, room) in [
        ("frame_index", d.frame_index.capacity()),
        ("index", d.index.capacity()),
    ] {
        assert!(room < 2 * SPARE_MAP_ROOM, "{name} kept room for {room}");
    }
}

/// `std::str::from_utf8`'s judgement of one to four bytes as the start of a text: the
/// reference of [`utf8_start`].
fn std_utf8_start(b: &[u8]) -> stepper::Utf8 {
    use stepper::Utf8;
    match std::str::from_utf8(b) {
        Ok(s) if s.chars().count() == 1 => Utf8::Whole,
        Err(e) if e.error_len().is_none() && e.valid_up_to() == 0 => Utf8::Begun,
        _ => Utf8::Invalid,
    }
}

#[test]
fn utf8_starts_are_judged_as_the_standard_library_does() {
    // Every sequence of one to three bytes; four bytes with the last two at the edges of
    // the continuation range and beyond.
    let mut b = [0u8; 4];
    for x in 0..=255u8 {
        b[0] = x;
        assert_eq!(
            stepper::utf8_start(&b[..1]),
            std_utf8_start(&b[..1]),
            "{x:02x}"
        );
        for y in 0..=255u8 {
            b[1] = y;
            assert_eq!(stepper::utf8_start(&b[..2]), std_utf8_start(&b[..2]));
            for z in 0..=255u8 {
                b[2] = z;
                assert_eq!(stepper::utf8_start(&b[..3]), std_utf8_start(&b[..3]));
            }
            for z in [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF] {
                b[2] = z;
                for w in [0x00, 0x7F, 0x80, 0xBF, 0xC0, 0xFF] {
                    b[3] = w;
                    assert_eq!(stepper::utf8_start(&b), std_utf8_start(&b), "{b:02x?}");
                }
            }
        }
    }
}
