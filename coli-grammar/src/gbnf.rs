//! GBNF, the grammar language of llama.cpp.
//!
//! ```text
//! root   ::= "{" ws pair ("," ws pair)* "}"   # a comment
//! pair   ::= [a-z]+ ":" ws [0-9]{1,3}
//! ws     ::= [ \t\n]*
//! ```
//!
//! A grammar is rules `name ::= alternatives`; `root` is the start. Alternatives are
//! separated by `|`, a sequence is items side by side. Items: string literals with escapes
//! (`\n \r \t \\ \" \xHH \uXXXX \UXXXXXXXX`), character classes `[...]` with ranges, `^`
//! negation and the same escapes, `.` (any character), rule names, `( ... )` groups, each
//! optionally followed by `?`, `*`, `+`, `{m}`, `{m,}` or `{m,n}`. A newline ends a rule
//! except inside parentheses, right after `::=` or after a `|`. Errors carry the line and
//! column and name the rule.

use std::collections::HashMap;

/// A grammar expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// Items one after the other (empty: matches nothing, i.e. the empty string).
    Seq(Vec<Expr>),
    /// One of the alternatives.
    Alt(Vec<Expr>),
    /// These characters, in order.
    Literal(Vec<char>),
    /// One character in (or, negated, not in) the inclusive ranges.
    Class {
        /// `[^...]`.
        negated: bool,
        /// Inclusive code point ranges.
        ranges: Vec<(char, char)>,
    },
    /// Any one character (`.`).
    Any,
    /// Another rule, by index.
    Ref(usize),
    /// `min` to `max` (unbounded when `None`) repetitions.
    Repeat {
        /// The repeated expression.
        expr: Box<Expr>,
        /// Fewest.
        min: u32,
        /// Most.
        max: Option<u32>,
    },
}

/// One rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its name.
    pub name: String,
    /// Its expression.
    pub expr: Expr,
}

/// A parsed, validated grammar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grammar {
    /// Rules in definition order.
    pub rules: Vec<Rule>,
    /// Index of `root`.
    pub root: usize,
    /// For a grammar converted from a JSON Schema: the schema, what was ignored or relaxed,
    /// and the validator of finished text when the grammar is relaxed.
    pub schema: Option<std::sync::Arc<crate::schema::SchemaInfo>>,
}

/// What is wrong with a grammar, and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("grammar line {line}, column {column}{}: {msg}", rule.as_ref().map(|r| format!(" (rule \"{r}\")")).unwrap_or_default())]
pub struct GrammarError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (characters).
    pub column: usize,
    /// The rule being defined or referred to, when there is one.
    pub rule: Option<String>,
    /// What is wrong.
    pub msg: String,
}

/// Largest repetition bound accepted in `{m,n}`.
pub const MAX_REPEAT: u32 = 10_000;

mod show;
pub use show::show;

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    /// Rule names in order of first mention, with where they were first referred to.
    names: HashMap<String, usize>,
    order: Vec<(String, (usize, usize))>,
    defined: Vec<Option<(Expr, (usize, usize))>>,
    current: Option<String>,
    /// The last rule name read.
    word: String,
    depth: usize,
    /// Position of the first character of each line.
    line_starts: Vec<usize>,
    _src: &'a str,
}

/// Deepest nesting of parentheses accepted (the parser recurses per level).
pub const MAX_DEPTH: usize = 200;

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl<'a> Parser<'a> {
    /// Line and column (1-based, in characters) of position `pos`: a binary search over
    /// the line starts, so positions of many rules cost no rescans of the text.
    fn at(&self, pos: usize) -> (usize, usize) {
        let pos = pos.min(self.chars.len());
        let line = self.line_starts.partition_point(|&s| s <= pos);
        (line, pos - self.line_starts[line - 1] + 1)
    }

    fn err(&self, pos: usize, msg: impl Into<String>) -> GrammarError {
        let (line, column) = self.at(pos);
        GrammarError {
            line,
            column,
            rule: self.current.clone(),
            msg: msg.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    /// Skips spaces, tabs, comments and (when `newlines`) line breaks.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    /// Reads a rule name into `self.word` (one buffer for every name: a grammar of
    /// thousands of rules refers to them tens of thousands of times).
    fn name(&mut self) -> Result<(), GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err(start, "expected a rule name"));
        }
        self.word.clear();
        self.word.extend(&self.chars[start..self.pos]);
        Ok(())
    }

    /// [`Parser::rule_index`] of the name just read.
    fn word_index(&mut self, pos: usize) -> usize {
        let word = std::mem::take(&mut self.word);
        let i = self.rule_index(&word, pos);
        self.word = word;
        i
    }

    fn rule_index(&mut self, name: &str, pos: usize) -> usize {
        if let Some(&i) = self.names.get(name) {
            return i;
        }
        let i = self.order.len();
        self.names.insert(name.to_string(), i);
        self.order.push((name.to_string(), self.at(pos)));
        self.defined.push(None);
        i
    }

    fn grammar(&mut self) -> Result<(), GrammarError> {
        self.space(true);
        if self.peek().is_none() {
            return Err(self.err(self.pos, "empty grammar: no rules"));
        }
        while self.peek().is_some() {
            let start = self.pos;
            self.name()?;
            self.current = Some(self.word.clone());
            self.space(false);
            if !self.chars[self.pos..].starts_with(&[':', ':', '=']) {
                return Err(self.err(self.pos, "expected ::= after the rule name"));
            }
            self.pos += 3;
            self.space(true);
            let expr = self.alternatives(false)?;
            let name = self.current.clone().expect("the rule being read");
            let i = self.rule_index(&name, start);
            if let Some((_, (l, _))) = &self.defined[i] {
                return Err(self.err(start, format!("duplicate rule: first defined on line {l}")));
            }
            self.defined[i] = Some((expr, self.at(start)));
            // The rule ends at a newline (or the end).
            self.space(false);
            match self.peek() {
                None => {}
                Some('\n') | Some('\r') => self.space(true),
                Some(c) => return Err(self.err(self.pos, format!("unexpected '{c}'"))),
            }
            self.current = None;
        }
        Ok(())
    }

    fn alternatives(&mut self, nested: bool) -> Result<Expr, GrammarError> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            // A `|` continues the rule, also at the start of the next line.
            let save = self.pos;
            self.space(true);
            if self.peek() != Some('|') {
                self.pos = save;
                break;
            }
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            Expr::Alt(alts)
        })
    }

    fn sequence(&mut self, nested: bool) -> Result<Expr, GrammarError> {
        let mut items = Vec::new();
        loop {
            self.space(nested);
            let start = self.pos;
            let item = match self.peek() {
                Some('"') => {
                    self.pos += 1;
                    let mut lit = Vec::new();
                    loop {
                        match self.peek() {
                            None | Some('\n') => {
                                return Err(self.err(start, "unterminated string literal"))
                            }
                            Some('"') => {
                                self.pos += 1;
                                break;
                            }
                            Some('\\') => lit.push(self.escape()?),
                            Some(c) => {
                                self.pos += 1;
                                lit.push(c);
                            }
                        }
                    }
                    Expr::Literal(lit)
                }
                Some('[') => self.class()?,
                Some('.') => {
                    self.pos += 1;
                    Expr::Any
                }
                Some('(') => {
                    if self.depth >= MAX_DEPTH {
                        return Err(
                            self.err(start, format!("parentheses nested deeper than {MAX_DEPTH}"))
                        );
                    }
                    self.pos += 1;
                    self.space(true);
                    self.depth += 1;
                    let inner = self.alternatives(true)?;
                    self.depth -= 1;
                    self.space(true);
                    if self.peek() != Some(')') {
                        return Err(self.err(self.pos, "expected ')'"));
                    }
                    self.pos += 1;
                    inner
                }
                Some(c) if is_name_char(c) => {
                    // A name followed by ::= starts the next rule: this sequence is over.
                    let save = self.pos;
                    self.name()?;
                    let mut probe = self.pos;
                    while matches!(self.chars.get(probe), Some(' ' | '\t')) {
                        probe += 1;
                    }
                    if self.chars[probe..].starts_with(&[':', ':', '=']) {
                        self.pos = save;
                        break;
                    }
                    Expr::Ref(self.word_index(save))
                }
                _ => break,
            };
            let item = self.postfix(item)?;
            items.push(item);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one")
        } else {
            Expr::Seq(items)
        })
    }

    fn number(&mut self) -> Result<u32, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let s: String = self.chars[start..self.pos].iter().collect();
        match s.parse::<u32>() {
            Ok(n) if n <= MAX_REPEAT => Ok(n),
            Ok(_) => Err(self.err(start, format!("repetition bound above {MAX_REPEAT}"))),
            Err(_) => Err(self.err(start, "expected a number")),
        }
    }

    fn postfix(&mut self, item: Expr) -> Result<Expr, GrammarError> {
        let rep = |expr: Expr, min, max| Expr::Repeat {
            expr: Box::new(expr),
            min,
            max,
        };
        let mut item = item;
        loop {
            item = match self.peek() {
                Some('*') => rep(item, 0, None),
                Some('+') => rep(item, 1, None),
                Some('?') => rep(item, 0, Some(1)),
                Some('{') => {
                    let start = self.pos;
                    self.pos += 1;
                    self.space(false);
                    let min = self.number()?;
                    self.space(false);
                    let max = match self.peek() {
                        Some('}') => Some(min),
                        Some(',') => {
                            self.pos += 1;
                            self.space(false);
                            if self.peek() == Some('}') {
                                None
                            } else {
                                Some(self.number()?)
                            }
                        }
                        _ => return Err(self.err(self.pos, "expected ',' or '}' in {m,n}")),
                    };
                    self.space(false);
                    if self.peek() != Some('}') {
                        return Err(self.err(self.pos, "expected '}'"));
                    }
                    if max.is_some_and(|m| m < min) {
                        return Err(self.err(start, "repetition {m,n} with n < m"));
                    }
                    // `pos` is advanced past '}' below.
                    rep(item, min, max)
                }
                _ => return Ok(item),
            };
            self.pos += 1;
        }
    }

    fn hex(&mut self, digits: usize) -> Result<char, GrammarError> {
        let start = self.pos;
        let s: String = self.chars[self.pos..].iter().take(digits).collect();
        if s.len() != digits || !s.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(self.err(start, format!("expected {digits} hex digits")));
        }
        self.pos += digits;
        let v = u32::from_str_radix(&s, 16).expect("hex digits");
        char::from_u32(v).ok_or_else(|| self.err(start, format!("U+{v:X} is not a character")))
    }

    /// An escape at `pos` (a backslash).
    fn escape(&mut self) -> Result<char, GrammarError> {
        let start = self.pos;
        self.pos += 1;
        let c = self
            .peek()
            .ok_or_else(|| self.err(start, "escape at the end of the grammar"))?;
        self.pos += 1;
        Ok(match c {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            '\\' | '"' | '[' | ']' | '-' | '^' => c,
            'x' => self.hex(2)?,
            'u' => self.hex(4)?,
            'U' => self.hex(8)?,
            other => return Err(self.err(start, format!("unknown escape \\{other}"))),
        })
    }

    fn class(&mut self) -> Result<Expr, GrammarError> {
        let start = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            let c = match self.peek() {
                None | Some('\n') => return Err(self.err(start, "unterminated character class")),
                Some(']') => {
                    self.pos += 1;
                    break;
                }
                Some('\\') => self.escape()?,
                Some(c) => {
                    self.pos += 1;
                    c
                }
            };
            let hi = if self.peek() == Some('-') && self.chars.get(self.pos + 1) != Some(&']') {
                self.pos += 1;
                match self.peek() {
                    Some('\\') => self.escape()?,
                    Some(h) => {
                        self.pos += 1;
                        h
                    }
                    None => return Err(self.err(start, "unterminated character class")),
                }
            } else {
                c
            };
            if hi < c {
                return Err(self.err(start, format!("range {c}-{hi} is backwards")));
            }
            ranges.push((c, hi));
        }
        if ranges.is_empty() && !negated {
            return Err(self.err(start, "empty character class matches nothing"));
        }
        Ok(Expr::Class { negated, ranges })
    }
}

/// Whether `e` can match the empty string, given which rules can.
fn nullable(e: &Expr, rules: &[bool]) -> bool {
    match e {
        Expr::Seq(v) => v.iter().all(|x| nullable(x, rules)),
        Expr::Alt(v) => v.iter().any(|x| nullable(x, rules)),
        Expr::Literal(l) => l.is_empty(),
        Expr::Class { .. } | Expr::Any => false,
        Expr::Ref(i) => rules[*i],
        Expr::Repeat { expr, min, .. } => *min == 0 || nullable(expr, rules),
    }
}

/// Rules that can be reached at the left edge of `e` (before any character is consumed).
fn left_refs(e: &Expr, rules: &[bool], out: &mut Vec<usize>) {
    match e {
        Expr::Seq(v) => {
            for x in v {
                left_refs(x, rules, out);
                if !nullable(x, rules) {
                    break;
                }
            }
        }
        Expr::Alt(v) => v.iter().for_each(|x| left_refs(x, rules, out)),
        Expr::Ref(i) => out.push(*i),
        Expr::Repeat { expr, .. } => left_refs(expr, rules, out),
        Expr::Literal(_) | Expr::Class { .. } | Expr::Any => {}
    }
}

/// Parses and validates a GBNF grammar.
pub fn parse(src: &str) -> Result<Grammar, GrammarError> {
    let chars: Vec<char> = src.chars().collect();
    let line_starts = std::iter::once(0)
        .chain(
            chars
                .iter()
                .enumerate()
                .filter(|(_, &c)| c == '\n')
                .map(|(i, _)| i + 1),
        )
        .collect();
    let mut p = Parser {
        chars,
        line_starts,
        pos: 0,
        names: HashMap::new(),
        order: Vec::new(),
        defined: Vec::new(),
        current: None,
        word: String::new(),
        depth: 0,
        _src: src,
    };
    p.grammar()?;
    // Rules in definition order; references renumbered to match.
    let mut def_order: Vec<usize> = (0..p.order.len()).collect();
    def_order.sort_by_key(|&i| p.defined[i].as_ref().map(|d| d.1));
    let mut new_index = vec![0usize; p.order.len()];
    for (new, &old) in def_order.iter().enumerate() {
        new_index[old] = new;
    }
    fn renumber(e: &mut Expr, map: &[usize]) {
        match e {
            Expr::Seq(v) | Expr::Alt(v) => v.iter_mut().for_each(|x| renumber(x, map)),
            Expr::Ref(i) => *i = map[*i],
            Expr::Repeat { expr, .. } => renumber(expr, map),
            Expr::Literal(_) | Expr::Class { .. } | Expr::Any => {}
        }
    }
    let mut rules = Vec::with_capacity(p.order.len());
    for (i, (name, (line, column))) in p.order.iter().enumerate() {
        match &p.defined[i] {
            Some(_) => {}
            None => {
                return Err(GrammarError {
                    line: *line,
                    column: *column,
                    rule: Some(name.clone()),
                    msg: "undefined rule".into(),
                })
            }
        }
    }
    let defined_at: Vec<(usize, usize)> = def_order
        .iter()
        .map(|&old| p.defined[old].as_ref().expect("checked").1)
        .collect();
    // Each rule's expression moved out (each is taken once: `def_order` is a permutation).
    for &old in &def_order {
        let (mut expr, _) = p.defined[old].take().expect("checked above");
        renumber(&mut expr, &new_index);
        rules.push(Rule {
            name: std::mem::take(&mut p.order[old].0),
            expr,
        });
    }
    let root = new_index[*p.names.get("root").ok_or_else(|| GrammarError {
        line: 1,
        column: 1,
        rule: None,
        msg: "no rule named root".into(),
    })?];
    // Nullable rules (fixpoint), then cycles through left edges: a rule that can reach
    // itself without consuming a character would never terminate in a top-down matcher.
    // A worklist: a rule is checked again only when a rule it refers to became nullable,
    // so a long chain of rules costs linear time, not a pass per link.
    fn refs(e: &Expr, out: &mut Vec<usize>) {
        match e {
            Expr::Seq(v) | Expr::Alt(v) => v.iter().for_each(|x| refs(x, out)),
            Expr::Ref(i) => out.push(*i),
            Expr::Repeat { expr, .. } => refs(expr, out),
            Expr::Literal(_) | Expr::Class { .. } | Expr::Any => {}
        }
    }
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); rules.len()];
    for (i, r) in rules.iter().enumerate() {
        let mut v = Vec::new();
        refs(&r.expr, &mut v);
        v.sort_unstable();
        v.dedup();
        for j in v {
            users[j].push(i);
        }
    }
    let mut null = vec![false; rules.len()];
    let mut todo: Vec<usize> = (0..rules.len()).rev().collect();
    while let Some(i) = todo.pop() {
        if !null[i] && nullable(&rules[i].expr, &null) {
            null[i] = true;
            todo.extend(&users[i]);
        }
    }
    let edges: Vec<Vec<usize>> = rules
        .iter()
        .map(|r| {
            let mut v = Vec::new();
            left_refs(&r.expr, &null, &mut v);
            v
        })
        .collect();
    // 0 unvisited, 1 on the stack, 2 done. Depth-first with an explicit stack: a chain
    // of many rules must not recurse on the thread's stack.
    let mut state = vec![0u8; rules.len()];
    fn visit(start: usize, edges: &[Vec<usize>], state: &mut [u8]) -> Option<usize> {
        let mut stack = vec![(start, 0usize)];
        state[start] = 1;
        while let Some((i, k)) = stack.last_mut() {
            let i = *i;
            match edges[i].get(*k) {
                Some(&j) => {
                    *k += 1;
                    match state[j] {
                        1 => return Some(j),
                        0 => {
                            state[j] = 1;
                            stack.push((j, 0));
                        }
                        _ => {}
                    }
                }
                None => {
                    state[i] = 2;
                    stack.pop();
                }
            }
        }
        None
    }
    for i in 0..rules.len() {
        if state[i] == 0 {
            if let Some(j) = visit(i, &edges, &mut state) {
                let (line, column) = defined_at[j];
                return Err(GrammarError {
                    line,
                    column,
                    rule: Some(rules[j].name.clone()),
                    msg: "left recursion: the rule can reach itself without consuming input".into(),
                });
            }
        }
    }
    Ok(Grammar {
        rules,
        root,
        schema: None,
    })
}

#[cfg(test)]
mod tests;
