//! Objects: members in any order, each declared property at most once (tracked in the
//! grammar up to a size), required ones present, additional and pattern members.

use super::visit::empty;
use super::{err, lit, pointer_child, Conv, SchemaError, MAX_TRACKED_ALL, MAX_TRACKED_REQUIRED};
use serde_json::{Map, Value};

impl Conv<'_> {
    pub(crate) fn object(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
    ) -> Result<String, SchemaError> {
        let ws = self.prim("ws");
        let mut props = match o.get("properties") {
            None => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => return err(path, "properties", "must be an object"),
        };
        let patterns = match o.get("patternProperties") {
            None => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => return err(path, "patternProperties", "must be an object"),
        };
        // The schema of members not declared (None: not allowed).
        let additional: Option<Value> = match o.get("additionalProperties") {
            Some(Value::Bool(false)) => None,
            None if self.options.closed_objects => None,
            None => Some(Value::Bool(true)),
            Some(s) => Some(s.clone()),
        };
        let mut required: Vec<String> = Vec::new();
        if let Some(r) = o.get("required") {
            let Some(r) = r.as_array() else {
                return err(path, "required", "must be an array of names");
            };
            for n in r {
                let Some(n) = n.as_str() else {
                    return err(path, "required", "must be an array of names");
                };
                if required.iter().any(|x| x == n) {
                    continue;
                }
                if !props.contains_key(n) {
                    // Required but undeclared: an additional (or pattern) member by that name.
                    let s = if !patterns.is_empty() {
                        Value::Bool(true)
                    } else {
                        match &additional {
                            Some(s) => s.clone(),
                            None => {
                                return empty(
                                    path,
                                    "required",
                                    &format!("{n:?} is required but no such member is allowed"),
                                )
                            }
                        }
                    };
                    props.insert(n.to_string(), s);
                }
                required.push(n.to_string());
            }
        }
        // Each declared member: "name" ws ":" ws value ws.
        let mut kvs = Vec::new();
        for (name, s) in &props {
            let p = pointer_child(&pointer_child(path, "properties"), name);
            let v = match self.visit(s, &p) {
                Ok(v) => Some(v),
                // A member whose schema accepts nothing may only be absent.
                Err(e) if e.msg.starts_with(super::visit::EMPTY) => {
                    if required.contains(name) {
                        return Err(e);
                    }
                    None
                }
                Err(e) => return Err(e),
            };
            kvs.push((name.clone(), v.map(|v| format!("{ws} \":\" {ws} {v} {ws}"))));
        }
        let other = self.other_members(o, path, &props, &patterns, additional.as_ref())?;
        // Tracked members: every one for small objects, else the required ones (some).
        let declared: Vec<(String, String)> = kvs
            .into_iter()
            .filter_map(|(n, kv)| kv.map(|kv| (n, kv)))
            .collect();
        let (tracked, untracked): (Vec<_>, Vec<_>) = if declared.len() <= MAX_TRACKED_ALL {
            (declared, Vec::new())
        } else {
            let mut t = Vec::new();
            let mut u = Vec::new();
            for d in declared {
                if required.contains(&d.0) && t.len() < MAX_TRACKED_REQUIRED {
                    t.push(d);
                } else {
                    u.push(d);
                }
            }
            (t, u)
        };
        if !untracked.is_empty() {
            self.relax(
                path,
                "properties",
                format!("more than {MAX_TRACKED_ALL} properties: members beyond the tracked required ones may repeat in the grammar; the finished text is validated"),
            );
        }
        if required.iter().any(|r| !tracked.iter().any(|t| &t.0 == r)) {
            self.relax(
                path,
                "required",
                format!("more than {MAX_TRACKED_REQUIRED} required members: the grammar tracks the first {MAX_TRACKED_REQUIRED}; the finished text is validated"),
            );
        }
        let mut others: Vec<String> = Vec::new();
        if !untracked.is_empty() {
            others.push(self.names_factored(path, untracked));
        }
        others.extend(other);
        let other = match others.len() {
            0 => None,
            1 => others.pop(),
            _ => Some(self.add_rule(&format!("{path}-other"), others.join(" | "))),
        };
        let must: u32 = tracked
            .iter()
            .enumerate()
            .filter(|(_, t)| required.contains(&t.0))
            .fold(0, |m, (i, _)| m | 1 << i);
        let kv_rules: Vec<String> = tracked
            .iter()
            .map(|(n, rest)| {
                let key = lit(&Value::String(n.clone()).to_string());
                self.add_rule(&format!("{path}-{n}-kv"), format!("{key} {rest}"))
            })
            .collect();
        let first = self.members(path, &kv_rules, other.as_deref(), must);
        let body = format!("\"{{\" {ws} {first} \"}}\"");
        Ok(self.add_rule(&format!("{path}-object"), body))
    }

    /// The members of an object: `kv[i]` each at most once (those in `must` required) and
    /// `other` any number of times, in any order, comma-separated.
    fn members(&mut self, path: &str, kv: &[String], other: Option<&str>, must: u32) -> String {
        let ws = self.prim("ws");
        let n = kv.len();
        if n == 0 {
            return match other {
                Some(x) => format!("( {x} ( \",\" {ws} {x} )* )?"),
                None => String::new(),
            };
        }
        // after[s]: what may follow once the members in set `s` (and any others) are in.
        let names: Vec<String> = (0..1u32 << n)
            .map(|s| self.fresh_name(&format!("{path}-after-{s}")))
            .collect();
        for s in 0..1u32 << n {
            let mut alts = Vec::new();
            if let Some(x) = other {
                alts.push(format!("\",\" {ws} {x} {}", names[s as usize]));
            }
            for (i, k) in kv.iter().enumerate() {
                if s & 1 << i == 0 {
                    alts.push(format!("\",\" {ws} {k} {}", names[(s | 1 << i) as usize]));
                }
            }
            if s & must == must {
                alts.push("\"\"".to_string());
            }
            self.push_rule(names[s as usize].clone(), alts.join(" | "));
        }
        let mut first = Vec::new();
        if let Some(x) = other {
            first.push(format!("{x} {}", names[0]));
        }
        for (i, k) in kv.iter().enumerate() {
            first.push(format!("{k} {}", names[1 << i]));
        }
        if must == 0 {
            first.push("\"\"".to_string());
        }
        format!("( {} )", first.join(" | "))
    }

    /// The members `"name" rest` of `members` as alternatives factored by the names'
    /// common prefixes (a radix tree of the JSON-quoted names, one rule per branching):
    /// the same language as one alternative per member, but a key's states hold one stack
    /// per next character instead of one per name that could still follow. Large objects
    /// (GitHub's repository has some 90 members) made 100-stack states at every key.
    fn names_factored(&mut self, path: &str, members: Vec<(String, String)>) -> String {
        // The quoted names, sorted: the members of a subtree are then a range, and the
        // common prefix of a range is that of its first and last. No quoted name is a
        // prefix of another (only the last quote is unescaped), so every range of two or
        // more branches before the end of each name.
        let mut entries: Vec<(Vec<char>, String)> = members
            .into_iter()
            .map(|(n, rest)| (Value::String(n).to_string().chars().collect(), rest))
            .collect();
        entries.sort_unstable();
        let text = |e: &(Vec<char>, String), from: usize, to: usize| -> String {
            lit(&e.0[from..to].iter().collect::<String>())
        };
        // (rule to write, its range of entries, characters already read); the root's
        // alternatives are returned instead of written.
        let mut work = vec![(None, 0, entries.len(), 0)];
        let mut root = String::new();
        while let Some((rule, lo, hi, at)) = work.pop() {
            let mut alts = Vec::new();
            let mut g = lo;
            while g < hi {
                let c = entries[g].0[at];
                let end = (g..hi).find(|&i| entries[i].0[at] != c).unwrap_or(hi);
                let e = &entries[g];
                if end - g == 1 {
                    alts.push(format!("{} {}", text(e, at, e.0.len()), e.1));
                } else {
                    let last = &entries[end - 1].0;
                    let common = (at..)
                        .take_while(|&i| e.0.get(i).is_some_and(|x| last.get(i) == Some(x)))
                        .count();
                    let name = self.fresh_name(&format!("{path}-names"));
                    alts.push(format!("{} {name}", text(e, at, at + common)));
                    work.push((Some(name), g, end, at + common));
                }
                g = end;
            }
            let body = alts.join(" | ");
            match rule {
                Some(name) => self.push_rule(name, body),
                None => root = body,
            }
        }
        root
    }

    /// The member rule for names not declared: additional properties, pattern properties
    /// (relaxed: a name matching a pattern gets the union of the schemas that may apply).
    fn other_members(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        props: &Map<String, Value>,
        patterns: &Map<String, Value>,
        additional: Option<&Value>,
    ) -> Result<Option<String>, SchemaError> {
        let ws = self.prim("ws");
        let _ = o;
        if patterns.is_empty() {
            let Some(a) = additional else {
                return Ok(None);
            };
            let v = match self.visit(a, &pointer_child(path, "additionalProperties")) {
                Ok(v) => v,
                Err(e) if e.msg.starts_with(super::visit::EMPTY) => return Ok(None),
                Err(e) => return Err(e),
            };
            let key = self.key_not_in(props.keys().map(String::as_str).collect());
            return Ok(Some(self.add_rule(
                &format!("{path}-additional-kv"),
                format!("\"\\\"\" {key} \"\\\"\" {ws} \":\" {ws} {v} {ws}"),
            )));
        }
        self.relax(
            path,
            "patternProperties",
            "a member name may match several patterns (or none): the grammar gives it any of their schemas, the finished text is validated",
        );
        let mut values = Vec::new();
        let mut keys = Vec::new();
        for (pat, s) in patterns {
            let p = pointer_child(&pointer_child(path, "patternProperties"), pat);
            match self.visit(s, &p) {
                Ok(v) => values.push(v),
                Err(e) if e.msg.starts_with(super::visit::EMPTY) => continue,
                Err(e) => return Err(e),
            }
            match crate::regex::pattern_to_gbnf(pat) {
                Ok(k) => keys.push(k),
                Err(_) => keys.push(format!("{}*", self.prim("kchar"))),
            }
        }
        let key = if let Some(a) = additional {
            if let Ok(v) = self.visit(a, &pointer_child(path, "additionalProperties")) {
                values.push(v);
            }
            self.key_not_in(props.keys().map(String::as_str).collect())
        } else {
            if keys.is_empty() {
                return Ok(None);
            }
            self.add_rule(&format!("{path}-pattern-key"), keys.join(" | "))
        };
        if values.is_empty() {
            return Ok(None);
        }
        values.dedup();
        let v = format!("( {} )", values.join(" | "));
        Ok(Some(self.add_rule(
            &format!("{path}-pattern-kv"),
            format!("\"\\\"\" {key} \"\\\"\" {ws} \":\" {ws} {v} {ws}"),
        )))
    }

    /// A rule for JSON string content that is none of `names`.
    ///
    /// The names are walked in their plain spelling. Once the key leaves every name (a
    /// character no name has at that place), the rest is any string content, escapes
    /// included. An escape met while still inside a name is taken only when it spells a
    /// character that no name contains (so the key cannot be a name): control characters
    /// and the short escapes in the usual case, and `\u` escapes of non-ASCII characters
    /// when every name is ASCII. Escapes of characters the names use are refused there (a
    /// spelling restriction: `\u0061` for `a`).
    fn key_not_in(&mut self, names: Vec<&str>) -> String {
        // One rule per set of names: objects of one shape repeat across a schema.
        let mut memo: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        memo.sort_unstable();
        memo.dedup();
        if let Some(rule) = self.key_rules.get(&memo) {
            return rule.clone();
        }
        let rule = self.key_not_in_new(names);
        self.key_rules.insert(memo, rule.clone());
        rule
    }

    fn key_not_in_new(&mut self, names: Vec<&str>) -> String {
        let char_ = self.prim("char");
        let esc = self.safe_escapes(&names);
        // A trie of the names.
        struct Node {
            end: bool,
            kids: Vec<(char, usize)>,
        }
        let mut nodes = vec![Node {
            end: false,
            kids: Vec::new(),
        }];
        for n in &names {
            let mut at = 0;
            for c in n.chars() {
                at = match nodes[at].kids.iter().find(|k| k.0 == c) {
                    Some(k) => k.1,
                    None => {
                        nodes.push(Node {
                            end: false,
                            kids: Vec::new(),
                        });
                        let new = nodes.len() - 1;
                        nodes[at].kids.push((c, new));
                        new
                    }
                };
            }
            nodes[at].end = true;
        }
        // A node's rule after its children's (a child comes later in `nodes`), each through
        // `shared_rule`: nodes with the same subtree (suffixes such as `_url` after many
        // names, the leaves) get one rule, so the rules are the trie's minimal automaton.
        let mut rule_of = vec![String::new(); nodes.len()];
        for (i, node) in nodes.iter_mut().enumerate().rev() {
            let mut alts = Vec::new();
            if !node.end {
                alts.push("\"\"".to_string());
            }
            let mut excluded: Vec<(u32, u32)> = vec![(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)];
            node.kids.sort_unstable();
            for (c, kid) in &node.kids {
                excluded.push((*c as u32, *c as u32));
                alts.push(format!("{} {}", lit(&c.to_string()), rule_of[*kid]));
            }
            let allowed = crate::regex::complement(&crate::regex::norm(excluded));
            alts.push(format!("{} {char_}*", crate::regex::class(&allowed)));
            if let Some(e) = &esc {
                alts.push(format!("{e} {char_}*"));
            }
            rule_of[i] = self.shared_rule("key-not-declared", alts.join(" | "));
        }
        rule_of.swap_remove(0)
    }

    /// A rule for the escapes (inside a JSON string) whose character is in none of
    /// `names`, or `None` when there is none. Every escape is one alternative after a
    /// shared backslash: the key's states then hold one stack waiting for the escape, not
    /// one per kind of escape.
    fn safe_escapes(&mut self, names: &[&str]) -> Option<String> {
        let used = |c: char| names.iter().any(|n| n.contains(c));
        let mut short: Vec<(u32, u32)> = Vec::new();
        for (c, letter) in [
            ('"', '"'),
            ('\\', '\\'),
            ('/', '/'),
            ('\u{8}', 'b'),
            ('\u{c}', 'f'),
            ('\n', 'n'),
            ('\r', 'r'),
            ('\t', 't'),
        ] {
            if !used(c) {
                short.push((letter as u32, letter as u32));
            }
        }
        let mut alts = Vec::new();
        if !short.is_empty() {
            alts.push(crate::regex::class(&crate::regex::norm(short)));
        }
        const HEX: &str = "[0-9a-fA-F]";
        let mut u = Vec::new();
        if !names.iter().any(|n| n.chars().any(|c| c < ' ')) {
            u.push(format!("\"00\" [01] {HEX}"));
        }
        if names.iter().all(|n| n.is_ascii()) {
            u.push(format!("\"00\" [89a-fA-F] {HEX}"));
            u.push(format!("\"0\" [1-9a-fA-F] {HEX}{{2}}"));
            u.push(format!("[1-9a-cA-Ce-fE-F] {HEX}{{3}}"));
            u.push(format!("[dD] [0-7] {HEX}{{2}}"));
            u.push(format!(
                "[dD] [89abAB] {HEX}{{2}} {} [dD] [c-fC-F] {HEX}{{2}}",
                lit(r"\u")
            ));
        }
        if !u.is_empty() {
            alts.push(format!("\"u\" ( {} )", u.join(" | ")));
        }
        if alts.is_empty() {
            return None;
        }
        let body = format!("{} ( {} )", lit(r"\"), alts.join(" | "));
        Some(self.shared_rule("key-escape", body))
    }
}
