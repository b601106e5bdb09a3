//! The schema corpus kept with the crate's sources (`coli-grammar/corpus`): realistic
//! JSON Schemas, each with valid and invalid instances, read by tests and benchmarks.

use serde_json::Value;
use std::path::PathBuf;

/// One schema of the corpus.
#[derive(Clone, Debug)]
pub struct CorpusSchema {
    /// File stem, e.g. `03-order`.
    pub name: String,
    /// The JSON Schema.
    pub schema: Value,
    /// Instances the schema accepts.
    pub valid: Vec<Value>,
    /// Instances it rejects.
    pub invalid: Vec<Value>,
    /// Valid instances as exact text (spellings a re-serialisation would lose).
    pub valid_texts: Vec<String>,
}

/// The corpus directory in this crate's sources.
pub fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// The corpus of real-world-shaped schemas (`coli-grammar/corpus-realworld`: Kubernetes,
/// SchemaStore, OpenAPI, function calling…), whose grammars may be relaxed.
pub fn realworld_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus-realworld")
}

/// Every schema of the corpus, in file-name order.
pub fn corpus() -> Result<Vec<CorpusSchema>, String> {
    corpus_in(&corpus_dir())
}

/// Every schema of a corpus directory, in file-name order.
pub fn corpus_in(dir: &std::path::Path) -> Result<Vec<CorpusSchema>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let v: Value =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            let list = |k: &str| v[k].as_array().cloned().unwrap_or_default();
            Ok(CorpusSchema {
                name: p
                    .file_stem()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                schema: v["schema"].clone(),
                valid: list("valid"),
                invalid: list("invalid"),
                valid_texts: list("valid_texts")
                    .iter()
                    .filter_map(|t| t.as_str().map(str::to_string))
                    .collect(),
            })
        })
        .collect()
}

/// A test vocabulary for `texts`: every byte, every substring of up to 6 characters of
/// each text, a few multi-byte and partial-UTF-8 tokens, and one empty (special) token.
pub fn vocab_from(texts: &[String]) -> Vec<Vec<u8>> {
    let mut set = std::collections::BTreeSet::new();
    for b in 0..=255u8 {
        set.insert(vec![b]);
    }
    for t in texts {
        let chars: Vec<char> = t.chars().collect();
        for i in 0..chars.len() {
            for n in 1..=6.min(chars.len() - i) {
                set.insert(chars[i..i + n].iter().collect::<String>().into_bytes());
            }
        }
    }
    for s in ["é", "太郎", "\u{1F600}", "a\u{e9}", " \"", "\":", "\\n"] {
        set.insert(s.as_bytes().to_vec());
    }
    set.insert(vec![0xC3]);
    set.insert(vec![0xA9, b'"']);
    let mut v: Vec<Vec<u8>> = set.into_iter().collect();
    v.push(Vec::new()); // a special token
    v
}
