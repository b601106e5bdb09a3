//! Cold masks at the start of a key of a large open object: `open_keys [NAMES]` builds an
//! object schema with NAMES declared properties (GitHub-like names, any other key allowed),
//! and times the first mask of each key position with a fresh grammar, slowest first.
//! These were the slowest masks of the real-world corpus (BENCHMARKS.md, issue 17).
use coli_grammar::{compile_schema, Compiled, TokenMask, TokenTrie};
use std::time::Instant;

const WORDS: &[&str] = &[
    "id",
    "node",
    "url",
    "html",
    "name",
    "full",
    "owner",
    "private",
    "description",
    "fork",
    "created",
    "updated",
    "pushed",
    "git",
    "ssh",
    "clone",
    "svn",
    "homepage",
    "size",
    "stargazers",
    "watchers",
    "language",
    "has",
    "issues",
    "projects",
    "downloads",
    "wiki",
    "pages",
    "forks",
    "mirror",
    "archived",
    "disabled",
    "open",
    "license",
    "topics",
    "visibility",
    "default",
    "branch",
    "permissions",
    "allow",
    "merge",
    "commit",
    "squash",
];

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(40, |a| a.parse().expect("NAMES: a count"));
    let names: Vec<String> = (0..n)
        .map(|i| {
            let a = WORDS[i % WORDS.len()];
            let b = WORDS[(i * 7 + 3) % WORDS.len()];
            match i % 3 {
                0 => a.to_string(),
                1 => format!("{a}_{b}"),
                _ => format!("{a}_{b}_url"),
            }
        })
        .collect();
    let props: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|k| (k.clone(), serde_json::json!({"type": "string"})))
        .collect();
    // SCHEMA=FILE: that schema instead (with KEYSTART, its first key's mask after `{"`).
    let schema = match std::env::var("SCHEMA") {
        Ok(f) => std::fs::read_to_string(f).expect("SCHEMA file"),
        Err(_) => serde_json::json!({"type": "object", "properties": props}).to_string(),
    };
    let instance: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .step_by(5)
        .map(|k| (k.clone(), serde_json::json!("x")))
        .collect();
    let text = serde_json::to_string(&instance).unwrap();
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).unwrap();
    let vocab = coli_models::TextTokenizer::load(&dir)
        .unwrap()
        .token_bytes();
    let trie = TokenTrie::new(&vocab);
    let t0 = Instant::now();
    let grammar = compile_schema(&schema).unwrap();
    let compile_us = t0.elapsed().as_secs_f64() * 1e6;
    let seq = trie.greedy_tokens(text.as_bytes());
    if let Ok(r) = std::env::var("KEYSTART") {
        // Only the first key's cold mask, r times (for a profiler).
        let mut mask = TokenMask::default();
        let mut us = Vec::new();
        let mut sizes = (0, 0, 0);
        for _ in 0..r.parse::<usize>().expect("KEYSTART") {
            let c = Compiled::new(&grammar);
            let mut m = c.matcher();
            m.accept_bytes(b"{\"");
            let t0 = Instant::now();
            trie.mask(&m, &mut mask);
            us.push(t0.elapsed().as_secs_f64() * 1e6);
            sizes = c.automaton_size();
        }
        println!("automaton after the mask (states, transitions, unfinished): {sizes:?}");
        us.sort_by(f64::total_cmp);
        println!("cold key start: median {:.1} us", us[us.len() / 2]);
        return;
    }
    let mut mask = TokenMask::default();
    let mut rows = Vec::new();
    // Each position cold: a fresh automaton, fed up to it, then one timed mask (all of it
    // ROUNDS times over, for a profiler).
    let rounds: usize = std::env::var("ROUNDS").map_or(1, |r| r.parse().expect("ROUNDS"));
    for upto in (0..rounds).flat_map(|_| 0..seq.len()) {
        let c = Compiled::new(&grammar);
        let mut m = c.matcher();
        let mut done = String::new();
        for &t in &seq[..upto] {
            m.accept_bytes(&vocab[t as usize]);
            done.push_str(&String::from_utf8_lossy(&vocab[t as usize]));
        }
        let t0 = Instant::now();
        trie.mask(&m, &mut mask);
        rows.push((t0.elapsed().as_secs_f64() * 1e6, mask.count(), done));
    }
    let mut times: Vec<f64> = rows.iter().map(|r| r.0).collect();
    times.sort_by(f64::total_cmp);
    println!(
        "{n} names, compile {compile_us:.0} us, {} cold masks: median {:.1} us, max {:.1} us",
        times.len(),
        times[times.len() / 2],
        times[times.len() - 1]
    );
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    for r in rows.iter().take(8) {
        let tail: String =
            r.2.chars()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
        println!("{:8.1} us {:6} allowed  ...{}", r.0, r.1, tail);
    }
}
