//! Grammars written back as GBNF text.

use super::{Expr, Grammar, Rule};

/// Writes `e` back as GBNF (used by tests and the JSON Schema converter).
pub fn show(e: &Expr, rules: &[Rule]) -> String {
    fn esc(c: char, in_class: bool) -> String {
        match c {
            '\n' => "\\n".into(),
            '\r' => "\\r".into(),
            '\t' => "\\t".into(),
            '\\' => "\\\\".into(),
            '"' if !in_class => "\\\"".into(),
            ']' | '-' | '^' if in_class => format!("\\{c}"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => format!("\\x{:02X}", c as u32),
            c => c.to_string(),
        }
    }
    match e {
        Expr::Seq(v) if v.is_empty() => "\"\"".into(),
        Expr::Seq(v) => v
            .iter()
            .map(|x| match x {
                Expr::Alt(_) | Expr::Seq(_) => format!("({})", show(x, rules)),
                _ => show(x, rules),
            })
            .collect::<Vec<_>>()
            .join(" "),
        Expr::Alt(v) => v
            .iter()
            .map(|x| match x {
                Expr::Alt(_) => format!("({})", show(x, rules)),
                _ => show(x, rules),
            })
            .collect::<Vec<_>>()
            .join(" | "),
        Expr::Literal(l) => format!(
            "\"{}\"",
            l.iter().map(|&c| esc(c, false)).collect::<String>()
        ),
        Expr::Class { negated, ranges } => {
            let body: String = ranges
                .iter()
                .map(|&(a, b)| {
                    if a == b {
                        esc(a, true)
                    } else {
                        format!("{}-{}", esc(a, true), esc(b, true))
                    }
                })
                .collect();
            format!("[{}{body}]", if *negated { "^" } else { "" })
        }
        Expr::Any => ".".into(),
        Expr::Ref(i) => rules[*i].name.clone(),
        Expr::Repeat { expr, min, max } => {
            let inner = match **expr {
                Expr::Seq(_) | Expr::Alt(_) | Expr::Repeat { .. } => {
                    format!("({})", show(expr, rules))
                }
                _ => show(expr, rules),
            };
            match (min, max) {
                (0, None) => format!("{inner}*"),
                (1, None) => format!("{inner}+"),
                (0, Some(1)) => format!("{inner}?"),
                (m, None) => format!("{inner}{{{m},}}"),
                (m, Some(n)) if m == n => format!("{inner}{{{m}}}"),
                (m, Some(n)) => format!("{inner}{{{m},{n}}}"),
            }
        }
    }
}

impl Grammar {
    /// The grammar as GBNF text (parses back to the same grammar).
    pub fn to_gbnf(&self) -> String {
        self.rules
            .iter()
            .map(|r| format!("{} ::= {}\n", r.name, show(&r.expr, &self.rules)))
            .collect()
    }
}
