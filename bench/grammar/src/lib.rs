//! Shared helpers of the grammar benchmarks: the demo vocabulary, a grown one, and
//! llguidance set up over a vocabulary.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher as LlgMatcher, ParserFactory};
use serde_json::Value;
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};

/// The demo vocabulary's bytes, and (eos id).
pub fn demo_vocab() -> (Vec<Vec<u8>>, u32) {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tok = coli_models::TextTokenizer::load(&dir).unwrap();
    (tok.token_bytes(), tok.eos_id().unwrap())
}

/// The demo vocabulary grown to `n` tokens with concatenations of pairs of its tokens
/// (deterministic), as BPE merges would add.
pub fn grown(base: &[Vec<u8>], n: usize) -> Vec<Vec<u8>> {
    let mut out = base.to_vec();
    let mut seen: std::collections::HashSet<Vec<u8>> = base.iter().cloned().collect();
    let words: Vec<&Vec<u8>> = base.iter().filter(|b| !b.is_empty()).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let a = words[(x % words.len() as u64) as usize];
        let b = words[((x >> 32) % words.len() as u64) as usize];
        let mut w = a.clone();
        w.extend_from_slice(b);
        if w.len() <= 16 && seen.insert(w.clone()) {
            out.push(w);
        }
    }
    out
}

/// llguidance's parser factory over the vocabulary `bytes` (empty tokens become
/// specials).
pub fn llg_factory(bytes: &[Vec<u8>], eos: u32) -> Arc<ParserFactory> {
    let words: Vec<Vec<u8>> = bytes
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if b.is_empty() {
                format!("\u{FF}<special_{i}>").into_bytes()
            } else {
                b.clone()
            }
        })
        .collect();
    let trie = TokTrie::from(&TokRxInfo::new(words.len() as u32, eos), &words);
    let env = Arc::new(ApproximateTokEnv::new(trie));
    let mut f = ParserFactory::new_simple(&(env as toktrie::TokEnv)).unwrap();
    f.quiet();
    Arc::new(f)
}

/// An llguidance matcher for `schema`, or `None` when llguidance refuses it.
pub fn llg_matcher(f: &ParserFactory, schema: &Value) -> Option<LlgMatcher> {
    let p = f
        .create_parser(TopLevelGrammar::from_json_schema(schema.clone()))
        .ok()?;
    Some(LlgMatcher::new(Ok(p)))
}
