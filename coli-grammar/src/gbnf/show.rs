//! Grammars written back as GBNF text.

use super::{Expr, Grammar, Rule};

/// Writes `e` back as GBNF (used by tests and the JSON Schema converter).
pub fn show(e: &Expr, rules: &[Rule]) -> String {
    /// Appends `c` as GBNF spells it in a literal or (`in_class`) a class, without an
    /// allocation per character (literals of every key's name are written this way).
    fn esc(out: &mut String, c: char, in_class: bool) {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            '"' if !in_class => out.push_str("\\\""),
            ']' | '-' | '^' if in_class => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02X}", c as u32));
            }
            c => out.push(c),
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
        Expr::Literal(l) => {
            let mut out = String::with_capacity(l.len() + 2);
            out.push('"');
            l.iter().for_each(|&c| esc(&mut out, c, false));
            out.push('"');
            out
        }
        Expr::Class { negated, ranges } => {
            let mut out = String::from(if *negated { "[^" } else { "[" });
            for &(a, b) in ranges {
                esc(&mut out, a, true);
                if a != b {
                    out.push('-');
                    esc(&mut out, b, true);
                }
            }
            out.push(']');
            out
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
