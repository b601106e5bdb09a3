//! The GBNF parser's unit tests.

use super::*;
use proptest::prelude::*;

#[test]
fn parses_the_llama_cpp_dialect() {
    let g = parse(
        r#"
# JSON-ish
root   ::= "{" ws pair ("," ws pair)* "}"  # trailing comment
pair   ::= key ":" ws num
key    ::= [a-zA-Z_] [a-zA-Z0-9_\-]{0,15}
num    ::= "-"? [0-9]{1,3} ("." [0-9]+)?
ws     ::= [ \t\n]*
any    ::= [^"\\\x00-\x1F] | "\u00e9" | .
multi  ::=
  "a"
  | "b" (
      "c" |
      "d"
    )
"#,
    )
    .unwrap();
    assert_eq!(g.rules[g.root].name, "root");
    assert_eq!(g.rules.len(), 7);
    let key = g.rules.iter().find(|r| r.name == "key").unwrap();
    assert_eq!(
        key.expr,
        Expr::Seq(vec![
            Expr::Class {
                negated: false,
                ranges: vec![('a', 'z'), ('A', 'Z'), ('_', '_')]
            },
            Expr::Repeat {
                expr: Box::new(Expr::Class {
                    negated: false,
                    ranges: vec![('a', 'z'), ('A', 'Z'), ('0', '9'), ('_', '_'), ('-', '-')]
                }),
                min: 0,
                max: Some(15)
            }
        ])
    );
    let any = g.rules.iter().find(|r| r.name == "any").unwrap();
    let Expr::Alt(v) = &any.expr else { panic!() };
    assert_eq!(v[1], Expr::Literal(vec!['é']));
    assert_eq!(v[2], Expr::Any);
}

#[test]
fn errors_name_the_rule_and_the_place() {
    let e = parse("root ::= a b\na ::= \"x\"").unwrap_err();
    assert_eq!((e.line, e.column, e.rule.as_deref()), (1, 12, Some("b")));
    assert!(e.msg.contains("undefined"));
    let e = parse("root ::= \"a\"\nroot ::= \"b\"").unwrap_err();
    assert_eq!((e.line, e.rule.as_deref()), (2, Some("root")));
    assert!(e.msg.contains("duplicate"), "{e}");
    assert!(parse("   # only a comment\n")
        .unwrap_err()
        .msg
        .contains("empty grammar"));
    assert!(parse("a ::= \"x\"")
        .unwrap_err()
        .msg
        .contains("no rule named root"));
    let e = parse("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]").unwrap_err();
    assert_eq!(e.rule.as_deref(), Some("expr"));
    assert!(e.msg.contains("left recursion"), "{e}");
    // Indirect, through a nullable prefix.
    let e = parse("root ::= a\na ::= \"x\"? b\nb ::= a \"y\"").unwrap_err();
    assert!(e.msg.contains("left recursion"), "{e}");
    // Right recursion is fine.
    parse("root ::= \"(\" root \")\" | \"\"").unwrap();
    for (src, needle) in [
        ("root ::= \"abc", "unterminated string"),
        ("root ::= [abc", "unterminated character class"),
        ("root ::= [z-a]", "backwards"),
        ("root ::= \"a\"{3,2}", "n < m"),
        ("root ::= \"a\"{99999}", "repetition bound"),
        ("root ::= \"\\q\"", "unknown escape"),
        ("root ::= (\"a\"", "expected ')'"),
        ("root := \"a\"", "expected ::="),
        ("root ::= \"\\uD800\"", "not a character"),
    ] {
        let e = parse(src).unwrap_err();
        assert!(e.to_string().contains(needle), "{src}: {e}");
    }
    // Deep nesting is an error, not a stack overflow.
    let deep = format!(
        "root ::= {}\"a\"{}",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    assert!(parse(&deep).unwrap_err().msg.contains("nested deeper"));
}

fn arb_expr(n_rules: usize) -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        "[a-z\\n\\r\\t\\x01\\x7f\"\\\\é\\]^-]{0,4}"
            .prop_map(|s| Expr::Literal(s.chars().collect())),
        (
            any::<bool>(),
            proptest::collection::vec((0x01u32..0x7f, 0u32..5), 1..3)
        )
            .prop_map(|(negated, r)| Expr::Class {
                negated,
                ranges: r
                    .into_iter()
                    .map(|(a, d)| (
                        char::from_u32(a).unwrap(),
                        char::from_u32((a + d).min(0x7f)).unwrap()
                    ))
                    .collect()
            }),
        Just(Expr::Any),
        (0..n_rules).prop_map(Expr::Ref),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 2..4).prop_map(Expr::Seq),
            proptest::collection::vec(inner.clone(), 2..4).prop_map(Expr::Alt),
            (inner, 0u32..4, proptest::option::of(0u32..3)).prop_map(|(e, min, extra)| {
                Expr::Repeat {
                    expr: Box::new(e),
                    min,
                    max: extra.map(|x| min + x),
                }
            }),
        ]
    })
}

proptest! {
    /// Any text: an error or a grammar, never a panic.
    #[test]
    fn never_panics(src in "(?s).{0,120}", tail in "[a-z ]{0,10}") {
        let _ = parse(&src);
        let _ = parse(&format!("root ::= {src}\n{tail}"));
    }

    /// A grammar written back as GBNF parses to the same grammar (when it is valid).
    #[test]
    fn round_trips(exprs in proptest::collection::vec(arb_expr(3), 3)) {
        let rules: Vec<Rule> = ["root", "r1", "r2"].iter().zip(exprs).map(|(n, e)| Rule { name: n.to_string(), expr: e }).collect();
        let g = Grammar { rules, root: 0, schema: None };
        let text = g.to_gbnf();
        match parse(&text) {
            Ok(back) => prop_assert_eq!(back, g),
            Err(e) => prop_assert!(e.msg.contains("left recursion") || e.msg.contains("undefined"), "{}\n{}", text, e),
        }
    }
}
