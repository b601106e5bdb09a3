//! The first mask of a schema's first key, each time with a fresh automaton (the cold masks
//! at the start of a key were the tail of issue 17):
//! `cargo run --release -p coli-grammar --example cold_key -- tokenizer.json schema.json [N] [instance.json]`.
//! With an instance: every position of it, each with a fresh automaton (`SEQ=1`: one
//! automaton for the whole instance, as a generation uses it; `UPTO=K`: positions up to K
//! only), and the N slowest masks with the states each built. Without one: the median and
//! maximum of N runs of the first key's mask and the automaton's size after it.
//! `data/tracked-keys.*.json`: an object whose keys change continuation after each
//! tracked member.
use coli_grammar::{compile_schema, Compiled, TokenMask, TokenTrie};
use std::time::Instant;

#[path = "shared/vocab.rs"]
mod vocab;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(tok), Some(schema)) = (args.next(), args.next()) else {
        eprintln!("usage: cold_key tokenizer.json schema.json [runs] [instance.json]");
        std::process::exit(2);
    };
    let runs: usize = args
        .next()
        .map_or(20, |r| r.parse().expect("runs: a count"));
    let instance = args.next();
    let vocab = vocab::load_vocab(&tok);
    let trie = TokenTrie::new(&vocab);
    let grammar = compile_schema(&std::fs::read_to_string(schema).unwrap()).unwrap();
    let mut mask = TokenMask::default();
    if let Some(path) = instance {
        // Every position of an instance, each with a fresh automaton: the slowest masks.
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let text = v.to_string();
        let seq = trie.greedy_tokens(text.as_bytes());
        let mut rows = Vec::new();
        // SEQ=1: one automaton for the whole instance, as a generation uses it (a mask
        // before each token), instead of a fresh one per position.
        let seq_mode = std::env::var("SEQ").is_ok();
        let shared = Compiled::new(&grammar);
        // AT=K: only position K, `runs` times (for a profiler).
        let positions: Vec<usize> = match std::env::var("AT") {
            Ok(k) => vec![k.parse().expect("AT: a token index"); runs],
            // UPTO=K: positions 0..=K only (with SEQ=1, the automaton as at position K).
            Err(_) => match std::env::var("UPTO") {
                Ok(k) => (0..=k.parse().expect("UPTO: a token index")).collect(),
                Err(_) => (0..seq.len()).collect(),
            },
        };
        for upto in positions {
            let fresh;
            let c = if seq_mode {
                &shared
            } else {
                fresh = Compiled::new(&grammar);
                &fresh
            };
            let mut m = c.matcher();
            let mut done = Vec::new();
            for &t in &seq[..upto] {
                assert!(
                    m.accept_bytes(&vocab[t as usize]),
                    "the instance is refused"
                );
                done.extend_from_slice(&vocab[t as usize]);
            }
            let before = c.automaton_size();
            let t0 = Instant::now();
            trie.mask(&m, &mut mask);
            let us = t0.elapsed().as_secs_f64() * 1e6;
            let tail = String::from_utf8_lossy(&done[done.len().saturating_sub(40)..]).to_string();
            let after = c.automaton_size();
            let states = format!(
                "{} -> {} ({} -> {} unfinished)",
                before.0, after.0, before.2, after.2
            );
            rows.push((us, upto, states, m.state().0.len(), tail));
        }
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (us, at, states, stacks, tail) in rows.iter().take(runs) {
            println!("{us:8.1} us  token {at:4}  states {states:12}  {stacks:4} stacks  ...{tail}");
        }
        return;
    }
    let mut us = Vec::new();
    let mut sizes = (0, 0, 0);
    let mut stacks = 0;
    for _ in 0..runs {
        let c = Compiled::new(&grammar);
        let mut m = c.matcher();
        assert!(m.accept_bytes(b"{\""), "the schema takes no object");
        stacks = m.state().0.len();
        let t0 = Instant::now();
        trie.mask(&m, &mut mask);
        us.push(t0.elapsed().as_secs_f64() * 1e6);
        sizes = c.automaton_size();
    }
    us.sort_by(f64::total_cmp);
    println!(
        "cold first key: median {:.1} us, max {:.1} us; {} tokens allowed; {stacks} stacks at the \
         key; automaton (states, transitions, unfinished) {sizes:?}",
        us[us.len() / 2],
        us[us.len() - 1],
        mask.count()
    );
}
