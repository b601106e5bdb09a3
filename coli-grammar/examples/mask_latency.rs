//! Compile time and mask latency over the corpora with a real byte-level BPE vocabulary:
//! `cargo run --release -p coli-grammar --example mask_latency -- path/to/tokenizer.json`.
//! Each schema's first valid instance is cut into tokens greedily and a mask is computed
//! before every token, cold (fresh automaton) and warm (second pass).
use coli_grammar::{compile_schema, Compiled, TokenMask, TokenTrie};
use std::time::Instant;

#[path = "shared/vocab.rs"]
mod vocab;

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn main() {
    let path = std::env::args().nth(1).expect("tokenizer.json");
    let vocab = vocab::load_vocab(&path);
    let trie = TokenTrie::new(&vocab);
    let mut mask = TokenMask::default();
    let dirs = [
        coli_grammar::corpus::corpus_dir(),
        coli_grammar::corpus::corpus_dir().with_file_name("corpus-realworld"),
    ];
    for dir in dirs {
        let Ok(entries) = coli_grammar::corpus::corpus_in(&dir) else {
            continue;
        };
        let (mut cold, mut warm, mut compile) = (Vec::new(), Vec::new(), Vec::new());
        for e in &entries {
            let t0 = Instant::now();
            let c = Compiled::new(&compile_schema(&e.schema.to_string()).unwrap());
            compile.push(t0.elapsed().as_secs_f64() * 1e3);
            let text = serde_json::to_string(&e.valid[0]).unwrap();
            let seq = trie.greedy_tokens(text.as_bytes());
            for round in 0..2 {
                let mut m = c.matcher();
                let mut done = 0;
                for &tk in &seq {
                    let t0 = Instant::now();
                    trie.mask(&m, &mut mask);
                    let us = t0.elapsed().as_secs_f64() * 1e6;
                    [&mut cold, &mut warm][round].push(us);
                    if round == 1 && us > 300.0 && std::env::var("SLOW").is_ok() {
                        let (st, _, _) = c.automaton_size();
                        println!(
                            "slow {us:.0} us {} states {st} stacks {} after {:?}",
                            e.name,
                            m.state().0.len(),
                            &text[..text.len().min(done)]
                        );
                    }
                    assert!(m.accept_bytes(&vocab[tk as usize]), "{}", e.name);
                    done += vocab[tk as usize].len();
                }
            }
        }
        compile.sort_by(f64::total_cmp);
        println!(
            "{}: {} schemas, compile mean {:.2} ms max {:.2} ms",
            dir.display(),
            entries.len(),
            compile.iter().sum::<f64>() / compile.len() as f64,
            compile.last().unwrap()
        );
        for (label, v) in [("cold", &mut cold), ("warm", &mut warm)] {
            v.sort_by(f64::total_cmp);
            println!(
                "  {label}: {} masks, mean {:.1} us, p50 {:.1}, p99 {:.1}, p99.9 {:.1}, max {:.1}",
                v.len(),
                v.iter().sum::<f64>() / v.len() as f64,
                pct(v, 0.5),
                pct(v, 0.99),
                pct(v, 0.999),
                v.last().unwrap()
            );
        }
    }
}
