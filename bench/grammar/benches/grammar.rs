//! coli-grammar against llguidance on the schema corpus (coli-grammar/corpus):
//! compile time per schema, and mask time per token while feeding each schema's first
//! valid instance, over the demo model's 49k-token vocabulary and a 151k one (the demo
//! vocabulary grown with merged pairs of its tokens, Qwen-sized).
//!
//! `cargo bench --manifest-path bench/grammar/Cargo.toml` (needs the demo model: `coli run`
//! once). Mask benchmarks feed fresh matchers ("cold": the grammar's automaton starts
//! empty, as for a new request) and, for coli, matchers of an already used grammar
//! ("warm": a cached schema seen before).

use std::hint::black_box;
use std::time::{Duration, Instant};

use coli_grammar::{compile_schema, Compiled, Grammar, TokenTrie};
use coli_grammar_bench::{demo_vocab, grown, llg_factory, llg_matcher};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::Value;

struct Case {
    name: String,
    schema: Value,
    grammar: Grammar,
    text: String,
}

fn corpus() -> Vec<Case> {
    coli_grammar::corpus::corpus()
        .unwrap()
        .into_iter()
        .map(|c| Case {
            grammar: compile_schema(&c.schema.to_string()).unwrap(),
            text: serde_json::to_string(&c.valid[0]).unwrap(),
            name: c.name,
            schema: c.schema,
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let cases = corpus();
    let (demo, eos) = demo_vocab();
    let big = grown(&demo, 151_000);
    let mut g = c.benchmark_group("grammar");
    g.sample_size(10).measurement_time(Duration::from_secs(8));

    // Compile: schema text -> ready matcher.
    let texts: Vec<String> = cases.iter().map(|c| c.schema.to_string()).collect();
    g.bench_function("compile/coli (all schemas)", |b| {
        b.iter(|| {
            for t in &texts {
                let c = Compiled::new(&compile_schema(t).unwrap());
                black_box(c.matcher().is_complete());
            }
        })
    });
    let f49 = llg_factory(&demo, eos);
    let llg_ok: Vec<bool> = cases
        .iter()
        .map(|c| llg_matcher(&f49, &c.schema).is_some())
        .collect();
    eprintln!(
        "llguidance compiles {} of {} schemas",
        llg_ok.iter().filter(|x| **x).count(),
        cases.len()
    );
    g.bench_function("compile/llguidance (its schemas)", |b| {
        b.iter(|| {
            for (c, ok) in cases.iter().zip(&llg_ok) {
                if *ok {
                    black_box(llg_matcher(&f49, &c.schema));
                }
            }
        })
    });
    // Per-schema compile times (median of 21), for the slowest.
    let mut per: Vec<(f64, &str)> = cases
        .iter()
        .map(|c| {
            let t = c.schema.to_string();
            let mut v: Vec<f64> = (0..21)
                .map(|_| {
                    let t0 = Instant::now();
                    black_box(Compiled::new(&compile_schema(&t).unwrap()));
                    t0.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            v.sort_by(f64::total_cmp);
            (v[10], c.name.as_str())
        })
        .collect();
    per.sort_by(|a, b| b.0.total_cmp(&a.0));
    eprintln!(
        "coli compile per schema: median {:.3} ms, slowest {:.3} ms ({})",
        per[per.len() / 2].0,
        per[0].0,
        per[0].1
    );

    for (label, vocab) in [("49k", &demo), ("151k", &big)] {
        let trie = TokenTrie::new(vocab);
        let seqs: Vec<Vec<u32>> = cases
            .iter()
            .map(|c| trie.greedy_tokens(c.text.as_bytes()))
            .collect();
        for (c, s) in cases.iter().zip(&seqs) {
            let n: usize = s.iter().map(|&t| vocab[t as usize].len()).sum();
            assert_eq!(n, c.text.len(), "{}: the instance tokenizes fully", c.name);
        }
        let total: usize = seqs.iter().map(|s| s.len() + 1).sum();
        eprintln!("{label}: {total} masks per pass over the corpus");
        let run = |compiled: &[Compiled]| {
            let mut allowed = coli_grammar::TokenMask::default();
            for (c, s) in compiled.iter().zip(&seqs) {
                let mut m = c.matcher();
                for &t in s {
                    trie.mask(&m, &mut allowed);
                    assert!(allowed.is_allowed(t));
                    assert!(m.accept_bytes(&vocab[t as usize]));
                }
                trie.mask(&m, &mut allowed);
                assert!(m.is_complete());
            }
        };
        g.bench_function(format!("mask {label}/coli cold (corpus pass)"), |b| {
            b.iter_batched(
                || {
                    cases
                        .iter()
                        .map(|c| Compiled::new(&c.grammar))
                        .collect::<Vec<_>>()
                },
                |compiled| run(&compiled),
                BatchSize::PerIteration,
            )
        });
        let warm: Vec<Compiled> = cases.iter().map(|c| Compiled::new(&c.grammar)).collect();
        run(&warm);
        g.bench_function(format!("mask {label}/coli warm (corpus pass)"), |b| {
            b.iter(|| run(&warm))
        });
        let f = llg_factory(vocab, eos);
        let llg_total: usize = seqs
            .iter()
            .zip(&llg_ok)
            .filter(|(_, ok)| **ok)
            .map(|(s, _)| s.len() + 1)
            .sum();
        eprintln!("{label}: llguidance {llg_total} masks per pass (its schemas)");
        g.bench_function(format!("mask {label}/llguidance (its schemas pass)"), |b| {
            b.iter_batched(
                || {
                    cases
                        .iter()
                        .zip(&llg_ok)
                        .filter(|(_, ok)| **ok)
                        .map(|(c, _)| llg_matcher(&f, &c.schema).unwrap())
                        .collect::<Vec<_>>()
                },
                |mut ms| {
                    for ((m, s), _) in ms
                        .iter_mut()
                        .zip(
                            seqs.iter()
                                .zip(&llg_ok)
                                .filter(|(_, ok)| **ok)
                                .map(|(s, _)| s),
                        )
                        .zip(0..)
                    {
                        for &t in s {
                            let mask = m.compute_mask().unwrap();
                            assert!(mask.is_allowed(t));
                            m.consume_token(t).unwrap();
                        }
                        black_box(m.compute_mask_or_eos().unwrap());
                    }
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(grammar, benches);
criterion_main!(grammar);
