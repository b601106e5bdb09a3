//! The regular-expression subset of JSON Schema's `pattern`, translated to GBNF over the
//! *JSON encoding* of a string's characters.
//!
//! Supported: literals, escapes (`\d \D \w \W \s \S \t \n \r \f \v \0 \xHH \uHHHH \u{H..}`
//! and escaped punctuation), classes `[...]` with ranges, negation and the class escapes,
//! `.`, groups `(...)`, `(?:...)`, `(?<name>...)`, alternation, the quantifiers `? * +
//! {m} {m,} {m,n}` (lazy forms match the same language), `^` at the start and `$` at the
//! end of a top-level alternative. Lookaround, backreferences, word boundaries and
//! Unicode property escapes are errors: a pattern is never silently weakened.

/// A parsed pattern.
#[derive(Clone, Debug, PartialEq)]
enum Re {
    /// One character out of these sorted, disjoint inclusive code point ranges.
    Set(Vec<(u32, u32)>),
    Seq(Vec<Re>),
    Alt(Vec<Re>),
    Repeat(Box<Re>, u32, Option<u32>),
}

/// Largest repetition count accepted in a pattern.
const MAX_COUNT: u32 = 1000;

struct P<'a> {
    c: &'a [char],
    i: usize,
    depth: usize,
}

pub(crate) fn norm(mut v: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    v.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(l) if a <= l.1.saturating_add(1) => l.1 = l.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

pub(crate) fn complement(v: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut next = 0u32;
    for &(a, b) in v {
        if a > next {
            out.push((next, a - 1));
        }
        next = b + 1;
    }
    if next <= 0x10FFFF {
        out.push((next, 0x10FFFF));
    }
    out
}

const DIGIT: &[(u32, u32)] = &[(0x30, 0x39)];
const WORD: &[(u32, u32)] = &[(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)];
const SPACE: &[(u32, u32)] = &[
    (0x09, 0x0D),
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
];
/// What `.` matches: everything but line terminators.
const LINE_TERMINATORS: &[(u32, u32)] = &[(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)];

impl P<'_> {
    fn peek(&self) -> Option<char> {
        self.c.get(self.i).copied()
    }
    fn err<T>(&self, msg: impl Into<String>) -> Result<T, String> {
        Err(format!("{} (at character {})", msg.into(), self.i))
    }

    fn alt(&mut self, top: bool) -> Result<Re, String> {
        let mut alts = vec![self.seq(top)?];
        while self.peek() == Some('|') {
            self.i += 1;
            alts.push(self.seq(top)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            Re::Alt(alts)
        })
    }

    /// A sequence; at the top level `^`/`$` anchor it (unanchored ends match anything).
    fn seq(&mut self, top: bool) -> Result<Re, String> {
        let mut items = Vec::new();
        let mut anchored_start = false;
        let mut anchored_end = false;
        if top && self.peek() == Some('^') {
            self.i += 1;
            anchored_start = true;
        }
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            if c == '$' {
                self.i += 1;
                if top && matches!(self.peek(), None | Some('|')) {
                    anchored_end = true;
                    break;
                }
                return self.err("'$' is supported only at the end of the pattern");
            }
            let atom = self.atom()?;
            items.push(self.quantified(atom)?);
        }
        if top {
            let any = Re::Repeat(Box::new(Re::Set(vec![(0, 0x10FFFF)])), 0, None);
            if !anchored_start {
                items.insert(0, any.clone());
            }
            if !anchored_end {
                items.push(any);
            }
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one")
        } else {
            Re::Seq(items)
        })
    }

    fn number(&mut self) -> Option<u32> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let s: String = self.c[start..self.i].iter().collect();
        s.parse().ok()
    }

    fn quantified(&mut self, atom: Re) -> Result<Re, String> {
        let (min, max) = match self.peek() {
            Some('*') => {
                self.i += 1;
                (0, None)
            }
            Some('+') => {
                self.i += 1;
                (1, None)
            }
            Some('?') => {
                self.i += 1;
                (0, Some(1))
            }
            Some('{') => {
                let save = self.i;
                self.i += 1;
                let Some(m) = self.number() else {
                    self.i = save;
                    return Ok(atom);
                };
                let max = if self.peek() == Some(',') {
                    self.i += 1;
                    if self.peek() == Some('}') {
                        None
                    } else {
                        match self.number() {
                            Some(n) => Some(n),
                            None => return self.err("malformed {m,n} quantifier"),
                        }
                    }
                } else {
                    Some(m)
                };
                if self.peek() != Some('}') {
                    return self.err("malformed {m,n} quantifier");
                }
                self.i += 1;
                if max.is_some_and(|n| n < m) {
                    return self.err("quantifier {m,n} with n < m");
                }
                if m > MAX_COUNT || max.is_some_and(|n| n > MAX_COUNT) {
                    return self.err(format!("repetition count above {MAX_COUNT}"));
                }
                (m, max)
            }
            _ => return Ok(atom),
        };
        if self.peek() == Some('?') {
            self.i += 1; // lazy: same language
        }
        if matches!(self.peek(), Some('*' | '+' | '?')) {
            return self.err("nested quantifier");
        }
        Ok(Re::Repeat(Box::new(atom), min, max))
    }

    fn atom(&mut self) -> Result<Re, String> {
        let c = self.peek().expect("caller checked");
        self.i += 1;
        match c {
            '(' => {
                if self.peek() == Some('?') {
                    let rest: String = self.c[self.i..].iter().take(3).collect();
                    if rest.starts_with("?:") {
                        self.i += 2;
                    } else if rest.starts_with("?<")
                        && !rest.starts_with("?<=")
                        && !rest.starts_with("?<!")
                    {
                        while self.peek().is_some_and(|c| c != '>') {
                            self.i += 1;
                        }
                        if self.peek() != Some('>') {
                            return self.err("unterminated group name");
                        }
                        self.i += 1;
                    } else {
                        return self.err("lookaround and other (?...) groups are not supported");
                    }
                }
                self.depth += 1;
                if self.depth > 100 {
                    return self.err("groups nested too deeply");
                }
                let inner = self.alt(false)?;
                self.depth -= 1;
                if self.peek() != Some(')') {
                    return self.err("missing ')'");
                }
                self.i += 1;
                Ok(inner)
            }
            ')' => self.err("unmatched ')'"),
            '[' => self.class(),
            '.' => Ok(Re::Set(complement(LINE_TERMINATORS))),
            '\\' => match self.escape(false)? {
                Esc::Set(v) => Ok(Re::Set(v)),
                Esc::Char(c) => Ok(Re::Set(vec![(c, c)])),
            },
            '*' | '+' | '?' => self.err("quantifier with nothing to repeat"),
            '^' => self.err("'^' is supported only at the start of the pattern"),
            c => Ok(Re::Set(vec![(c as u32, c as u32)])),
        }
    }

    fn hex(&mut self, n: usize) -> Result<u32, String> {
        let s: String = self
            .c
            .get(self.i..self.i + n)
            .unwrap_or(&[])
            .iter()
            .collect();
        if s.len() != n {
            return self.err("truncated hex escape");
        }
        let v = u32::from_str_radix(&s, 16).or_else(|_| self.err("bad hex escape"))?;
        self.i += n;
        Ok(v)
    }

    fn escape(&mut self, in_class: bool) -> Result<Esc, String> {
        let Some(c) = self.peek() else {
            return self.err("pattern ends with '\\'");
        };
        self.i += 1;
        Ok(match c {
            'd' => Esc::Set(DIGIT.to_vec()),
            'D' => Esc::Set(complement(DIGIT)),
            'w' => Esc::Set(WORD.to_vec()),
            'W' => Esc::Set(complement(WORD)),
            's' => Esc::Set(SPACE.to_vec()),
            'S' => Esc::Set(complement(SPACE)),
            't' => Esc::Char(9),
            'n' => Esc::Char(10),
            'v' => Esc::Char(11),
            'f' => Esc::Char(12),
            'r' => Esc::Char(13),
            '0' => Esc::Char(0),
            'b' if in_class => Esc::Char(8),
            'x' => Esc::Char(self.hex(2)?),
            'u' if self.peek() == Some('{') => {
                self.i += 1;
                let start = self.i;
                while self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                    self.i += 1;
                }
                let s: String = self.c[start..self.i].iter().collect();
                if self.peek() != Some('}') || s.is_empty() || s.len() > 6 {
                    return self.err("bad \\u{...} escape");
                }
                self.i += 1;
                Esc::Char(u32::from_str_radix(&s, 16).expect("hex digits"))
            }
            'u' => Esc::Char(self.hex(4)?),
            'b' | 'B' => return self.err("word boundaries (\\b, \\B) are not supported"),
            'p' | 'P' => return self.err("Unicode property escapes are not supported"),
            '1'..='9' => return self.err("backreferences are not supported"),
            'k' => return self.err("named backreferences are not supported"),
            c if c.is_ascii_alphanumeric() => {
                return self.err(format!("unknown escape \\{c}"));
            }
            c => Esc::Char(c as u32),
        })
    }

    fn class(&mut self) -> Result<Re, String> {
        let negated = self.peek() == Some('^');
        if negated {
            self.i += 1;
        }
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let Some(c) = self.peek() else {
                return self.err("missing ']'");
            };
            if c == ']' && !first {
                self.i += 1;
                break;
            }
            first = false;
            self.i += 1;
            let lo = if c == '\\' {
                match self.escape(true)? {
                    Esc::Set(v) => {
                        ranges.extend(v);
                        continue;
                    }
                    Esc::Char(c) => c,
                }
            } else {
                c as u32
            };
            if self.peek() == Some('-') && self.c.get(self.i + 1).is_some_and(|&n| n != ']') {
                self.i += 1;
                let c = self.peek().expect("checked");
                self.i += 1;
                let hi = if c == '\\' {
                    match self.escape(true)? {
                        Esc::Char(c) => c,
                        Esc::Set(_) => return self.err("class escape as a range bound"),
                    }
                } else {
                    c as u32
                };
                if hi < lo {
                    return self.err("range out of order in character class");
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        let set = norm(ranges);
        Ok(Re::Set(if negated { complement(&set) } else { set }))
    }
}

enum Esc {
    Set(Vec<(u32, u32)>),
    Char(u32),
}

/// GBNF for one character of `set`, as it appears inside a JSON string: `"` and `\` are
/// escaped, control characters use their JSON escapes; surrogates cannot occur.
pub(crate) fn json_set(set: &[(u32, u32)]) -> String {
    let special = norm(vec![
        (0, 0x1F),
        (0x22, 0x22),
        (0x5C, 0x5C),
        (0xD800, 0xDFFF),
    ]);
    // The plain part: set minus the specials.
    let allowed_plain: Vec<(u32, u32)> = {
        let keep = complement(&special);
        let mut out = Vec::new();
        for &(a, b) in set {
            for &(x, y) in &keep {
                let (lo, hi) = (a.max(x), b.min(y));
                if lo <= hi {
                    out.push((lo, hi));
                }
            }
        }
        out
    };
    let has = |c: u32| set.iter().any(|&(a, b)| a <= c && c <= b);
    let mut alts = Vec::new();
    if !allowed_plain.is_empty() {
        alts.push(class(&allowed_plain));
    }
    if has(0x22) {
        alts.push(r#""\\\"""#.to_string());
    }
    if has(0x5C) {
        alts.push(r#""\\\\""#.to_string());
    }
    if has(0x2F) {
        alts.push(r#""\\/""#.to_string());
    }
    let controls: Vec<u32> = (0..0x20).filter(|&c| has(c)).collect();
    if controls.len() == 0x20 {
        alts.push(r#""\\" [bfnrt]"#.to_string());
        alts.push(r#""\\u00" [01] [0-9a-fA-F]"#.to_string());
    } else {
        for c in controls {
            let short = match c {
                8 => Some('b'),
                9 => Some('t'),
                10 => Some('n'),
                12 => Some('f'),
                13 => Some('r'),
                _ => None,
            };
            if let Some(s) = short {
                alts.push(format!(r#""\\{s}""#));
            }
            alts.push(format!(
                r#""\\u00{}" [{}{}]"#,
                c >> 4,
                hexd(c & 15),
                hexd(c & 15).to_ascii_uppercase()
            ));
        }
    }
    match alts.len() {
        0 => "[^\\x00-\\U0010FFFF]".into(), // unreachable for non-empty sets
        1 => alts.pop().expect("one"),
        _ => format!("({})", alts.join(" | ")),
    }
}

fn hexd(n: u32) -> char {
    char::from_digit(n, 16).expect("nibble")
}

/// A GBNF character class of non-special code points (no surrogates).
pub(crate) fn class(ranges: &[(u32, u32)]) -> String {
    let ranges = ranges
        .iter()
        .filter_map(|&(a, b)| {
            // Surrogates are not characters.
            let a = char::from_u32(a).unwrap_or('\u{E000}');
            let b = char::from_u32(b).unwrap_or('\u{D7FF}');
            (a <= b).then_some((a, b))
        })
        .collect();
    crate::gbnf::show(
        &crate::gbnf::Expr::Class {
            negated: false,
            ranges,
        },
        &[],
    )
}

fn emit(re: &Re) -> String {
    match re {
        Re::Set(v) => json_set(v),
        Re::Seq(v) if v.is_empty() => "\"\"".into(),
        Re::Seq(v) => format!("({})", v.iter().map(emit).collect::<Vec<_>>().join(" ")),
        Re::Alt(v) => format!("({})", v.iter().map(emit).collect::<Vec<_>>().join(" | ")),
        Re::Repeat(x, min, max) => {
            let inner = emit(x);
            match (min, max) {
                (0, None) => format!("({inner})*"),
                (1, None) => format!("({inner})+"),
                (0, Some(1)) => format!("({inner})?"),
                (m, None) => format!("({inner}){{{m},}}"),
                (m, Some(n)) if m == n => format!("({inner}){{{m}}}"),
                (m, Some(n)) => format!("({inner}){{{m},{n}}}"),
            }
        }
    }
}

/// GBNF matching the JSON-encoded content (between the quotes) of exactly the strings
/// the pattern matches somewhere (JSON Schema patterns are unanchored unless `^`/`$`).
pub fn pattern_to_gbnf(pattern: &str) -> Result<String, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut p = P {
        c: &chars,
        i: 0,
        depth: 0,
    };
    let re = p.alt(true)?;
    if p.i != chars.len() {
        return p.err("unmatched ')'");
    }
    Ok(emit(&re))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse, Compiled, Matcher};

    fn accepts(pattern: &str, json_content: &str) -> bool {
        let g = format!(
            "root ::= \"\\\"\" {} \"\\\"\"\n",
            pattern_to_gbnf(pattern).unwrap()
        );
        let c = Compiled::new(&parse(&g).unwrap_or_else(|e| panic!("{g}: {e}")));
        Matcher::matches(&c, &format!("\"{json_content}\""))
    }

    #[test]
    fn anchors_classes_quantifiers_and_json_escapes() {
        assert!(accepts("^[A-Z]{2}-\\d{3}$", "AB-123"));
        assert!(!accepts("^[A-Z]{2}-\\d{3}$", "AB-1234"));
        assert!(accepts("\\d{3}", "x123y"), "unanchored matches anywhere");
        assert!(!accepts("\\d{3}", "x12y"));
        assert!(accepts("^(foo|ba(r|z))+$", "foobazbar"));
        assert!(!accepts("^(foo|ba(r|z))+$", "fooba"));
        assert!(
            accepts("^a\"b\\\\c$", "a\\\"b\\\\c"),
            "quote and backslash escaped"
        );
        assert!(
            accepts("^[^a]$", "\\n"),
            "negated class takes a newline as \\n"
        );
        assert!(!accepts("^.$", "\\n"), "dot excludes line terminators");
        assert!(accepts("^\\w+@\\w+\\.com$", "me@x.com"));
        assert!(accepts("^(?:ab)?c{2,}$", "ccc"));
        assert!(accepts("^é[α-ω]$", "éβ"));
        assert!(accepts("^x*?$", ""));
    }

    #[test]
    fn unsupported_constructs_are_errors() {
        for bad in [
            "(?=a)", "(?!a)", "(?<=a)b", "(a)\\1", "\\bword", "\\p{L}", "a**", "(a", "a)", "[a",
            "*a", "a{3,2}", "x^", "$x", "[z-a]",
        ] {
            assert!(pattern_to_gbnf(bad).is_err(), "{bad}");
        }
    }
}
