//! The compile cache: grammars and JSON Schemas keyed on their exact text. A text seen
//! before skips schema conversion, parsing, validation and compilation; its matcher starts
//! from the compiled start state, which equals a fresh compile's (tested).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::gbnf::{parse, GrammarError};
use crate::matcher::Compiled;
use crate::schema::{compile_schema, compile_schema_with, SchemaError, SchemaOptions};

/// Kind-tagged source text → (compiled grammar, last use), and the use counter.
type Entries = (HashMap<String, (Arc<Compiled>, u64)>, u64);

/// Compiled grammars by source text (bounded: the least recently used leaves past `capacity`).
#[derive(Debug)]
pub struct GrammarCache {
    entries: Mutex<Entries>,
    capacity: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl GrammarCache {
    /// A cache holding up to `capacity` grammars.
    pub fn new(capacity: usize) -> GrammarCache {
        GrammarCache {
            entries: Mutex::new((HashMap::new(), 0)),
            capacity: capacity.max(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The compiled GBNF grammar `text`, compiled now if this text is new.
    pub fn get(&self, text: &str) -> Result<Arc<Compiled>, GrammarError> {
        self.get_or(format!("gbnf\0{text}"), || Ok(Compiled::new(&parse(text)?)))
    }

    /// The compiled grammar of the JSON Schema `text`, converted and compiled now if this
    /// text is new.
    pub fn get_schema(&self, text: &str) -> Result<Arc<Compiled>, SchemaError> {
        self.get_or(format!("schema\0{text}"), || {
            Ok(Compiled::new(&compile_schema(text)?))
        })
    }

    /// [`GrammarCache::get_schema`] with conversion options (kept apart per options).
    pub fn get_schema_with(
        &self,
        text: &str,
        options: SchemaOptions,
    ) -> Result<Arc<Compiled>, SchemaError> {
        let key = format!(
            "schema\0{}{}\0{text}",
            options.closed_objects as u8, options.bounded_space as u8
        );
        self.get_or(key, || {
            Ok(Compiled::new(&compile_schema_with(text, options)?))
        })
    }

    fn get_or<E>(
        &self,
        key: String,
        compile: impl FnOnce() -> Result<Compiled, E>,
    ) -> Result<Arc<Compiled>, E> {
        {
            let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            let (map, tick) = &mut *guard;
            *tick += 1;
            let now = *tick;
            if let Some((c, used)) = map.get_mut(&key) {
                *used = now;
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(c.clone());
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let compiled = Arc::new(compile()?);
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (map, tick) = &mut *guard;
        if map.len() >= self.capacity {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, u))| *u)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(key, (compiled.clone(), *tick));
        Ok(compiled)
    }

    /// Lookups answered from the cache.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Lookups that compiled (successfully or not).
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// Grammars held.
    pub fn len(&self) -> usize {
        self.entries.lock().expect("grammar cache").0.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_grammar_starts_where_a_fresh_compile_does() {
        let cache = GrammarCache::new(2);
        let text = "root ::= \"a\" [0-9]{1,3} | \"b\"+\n";
        let a = cache.get(text).unwrap();
        let b = cache.get(text).unwrap();
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second lookup must not compile again"
        );
        let fresh = Compiled::new(&parse(text).unwrap());
        // Used, then reset: the cached grammar's new matcher equals a fresh one, and both
        // accept and refuse the same inputs from there.
        let mut used = a.matcher();
        assert!(used.accept_bytes(b"a12"));
        let (reset, new) = (b.matcher(), fresh.matcher());
        assert_eq!(reset.state(), new.state());
        for t in ["a1", "a123", "a1234", "bbb", "ab", ""] {
            let (mut x, mut y) = (b.matcher(), fresh.matcher());
            assert_eq!(
                x.accept_bytes(t.as_bytes()) && x.is_complete(),
                y.accept_bytes(t.as_bytes()) && y.is_complete(),
                "{t}"
            );
        }
        // Bounded, errors not cached.
        cache.get("root ::= \"x\"").unwrap();
        cache.get("root ::= \"y\"").unwrap();
        assert_eq!(cache.len(), 2);
        assert!(cache.get("root ::= nope").is_err());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_cached_schema_skips_conversion_and_starts_fresh() {
        let cache = GrammarCache::new(4);
        let text = r#"{"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}, "required": ["n"]}"#;
        let a = cache.get_schema(text).unwrap();
        let mut used = a.matcher();
        assert!(used.accept_bytes(b"{\"n\": 7"));
        let b = cache.get_schema(text).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "the same text is not converted again");
        let fresh = Compiled::new(&compile_schema(text).unwrap());
        assert_eq!(b.matcher().state(), fresh.matcher().state());
        // The same text as GBNF is another entry (and not a valid grammar).
        assert!(cache.get(text).is_err());
        assert!(cache
            .get_schema(r#"{"type": "integer", "minimum": 5, "maximum": 4}"#)
            .is_err());
        assert_eq!(cache.len(), 1);
    }
}
