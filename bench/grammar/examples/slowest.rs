//! Lists the slowest mask positions over the corpus (warm), to see which states cost.
use coli_grammar::{compile_schema, Compiled, TokenMask, TokenTrie};
use std::time::Instant;
fn main() {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).unwrap();
    let tok = coli_models::TextTokenizer::load(&dir).unwrap();
    let vocab = tok.token_bytes();
    let trie = TokenTrie::new(&vocab);
    let mut rows = Vec::new();
    let (mut states, mut partial, mut trans, mut cold_us) = (0, 0, 0, 0.0);
    let mut mask = TokenMask::default();
    for entry in coli_grammar::corpus::corpus().unwrap() {
        let c = Compiled::new(&compile_schema(&entry.schema.to_string()).unwrap());
        let text = serde_json::to_string(&entry.valid[0]).unwrap();
        let seq = trie.greedy_tokens(text.as_bytes());
        for round in 0..2 {
            let mut m = c.matcher();
            let mut done = String::new();
            for &t in &seq {
                let t0 = Instant::now();
                trie.mask(&m, &mut mask);
                let us = t0.elapsed().as_secs_f64() * 1e6;
                if round == 0 {
                    cold_us += us;
                }
                if round == 1 {
                    rows.push((us, mask.count(), entry.name.clone(), done.clone()));
                }
                m.accept_bytes(&vocab[t as usize]);
                done.push_str(&String::from_utf8_lossy(&vocab[t as usize]));
            }
            if round == 0 {
                let (a, b, p) = c.automaton_size();
                states += a;
                partial += p;
                trans += b;
            }
        }
    }
    let total: f64 = rows.iter().map(|r| r.0).sum();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "{} masks, mean {:.1} us warm, {:.1} us cold; cold pass built {states} states {trans} transitions, {partial} unfinished characters checked",
        rows.len(),
        total / rows.len() as f64,
        cold_us / rows.len() as f64
    );
    for r in rows.iter().take(25) {
        let tail: String =
            r.3.chars()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
        println!("{:8.1} us {:6} allowed  {}  ...{}", r.0, r.1, r.2, tail);
    }
}
