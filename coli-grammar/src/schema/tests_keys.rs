//! The rules of an object's keys (declared names factored by their prefixes, the keys
//! outside them as a trie): the language, against set membership, and the sharing of the
//! trie's nodes.
use super::tests::{accepts, compiled};
use super::*;
use crate::Matcher;
use serde_json::json;

/// An open object whose declared members are integers and whose other members are
/// strings: `{"k": 1}` must match exactly when `k` is declared, `{"k": "s"}` exactly
/// when it is not.
fn object_of(names: &[String]) -> Value {
    let props: serde_json::Map<String, Value> = names
        .iter()
        .map(|n| (n.clone(), json!({"type": "integer"})))
        .collect();
    json!({"type": "object", "properties": props, "additionalProperties": {"type": "string"}})
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Names over three letters and a quote (so they share prefixes and suffixes, and
    /// some are spelled with an escape), keys over the same letters and one non-ASCII one.
    /// Up to five names are tracked one by one; more are the alternatives of one rule,
    /// factored by their prefixes.
    #[test]
    fn undeclared_keys_are_exactly_the_names_not_declared(
        names in proptest::collection::vec("[ab_\"]{1,5}", 1..14),
        keys in proptest::collection::vec("[ab_é]{0,6}", 1..12),
    ) {
        let c = compiled(&object_of(&names));
        for k in names.iter().chain(&keys) {
            let declared = names.contains(k);
            let int = format!("{{{}:1}}", Value::from(k.as_str()));
            let string = format!("{{{}:\"s\"}}", Value::from(k.as_str()));
            proptest::prop_assert_eq!(Matcher::matches(&c, &int), declared, "{}", int);
            proptest::prop_assert_eq!(Matcher::matches(&c, &string), !declared, "{}", string);
        }
    }
}

#[test]
fn names_that_share_a_suffix_share_its_rules() {
    // The trie of `a_url`, `b_url`, `c_url` has 16 nodes. Its minimal automaton has 6:
    // the root, one state after any of the letters, then `_`, `u`, `r`, `l`.
    let names: Vec<String> = ["a_url", "b_url", "c_url"].map(String::from).to_vec();
    let gbnf = schema_to_gbnf(&object_of(&names)).unwrap();
    let rules = gbnf
        .lines()
        .filter(|l| l.split("::=").next().unwrap().contains("key-not-declared"))
        .count();
    assert_eq!(rules, 6, "{gbnf}");
    assert!(accepts(
        object_of(&names),
        r#"{"d_url":"s","a_ur":"s","a_url":1}"#
    ));
    assert!(!accepts(object_of(&names), r#"{"c_url":"s"}"#));
}

#[test]
fn many_declared_names_are_one_stack_per_next_character() {
    // Eight names (past the five tracked one by one), four first letters, no other
    // members: after the opening quote, one stack per letter instead of one per name.
    let props: serde_json::Map<String, Value> = ["aa", "ab", "ac", "ba", "bb", "ca", "cb", "d"]
        .iter()
        .map(|n| (n.to_string(), json!({"type": "integer"})))
        .collect();
    let s = json!({"type": "object", "properties": props, "additionalProperties": false});
    let c = compiled(&s);
    let mut m = c.matcher();
    assert!(m.accept_bytes(b"{\""));
    assert_eq!(m.state().0.len(), 4, "{:?}", m.state());
    for (k, declared) in [
        ("aa", true),
        ("cb", true),
        ("d", true),
        ("c", false),
        ("dd", false),
    ] {
        let text = format!("{{\"{k}\":1}}");
        assert_eq!(Matcher::matches(&c, &text), declared, "{text}");
    }
}
