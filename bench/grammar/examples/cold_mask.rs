//! One cold mask of the real-world corpus, timed alone: `cold_mask CORPUS.jsonl NAME POS
//! [RUNS]` takes schema NAME's valid instances one after another (as `realworld` counts
//! its masks) to the one holding token POS and, RUNS times (default 21), builds
//! a fresh automaton, takes the masks before tokens `0..POS` as `realworld` does
//! (untimed), then times the mask before token POS. Prints the median and range, and the
//! states the automaton has before and after that mask. With `ONLY=1` the masks before POS
//! are left out (the tokens are accepted without them), to time the position from an
//! emptier automaton. With `FLUSH=1` a 64 MiB buffer is written before each timed mask,
//! so its data comes from memory, as in `realworld` where llguidance's masks run between.
//! A profiler's target: see [`timed_mask`].
use coli_grammar::{compile_schema, Compiled, TokenMask, TokenTrie};
use coli_grammar_bench::demo_vocab;
use std::io::BufRead;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: cold_mask CORPUS.jsonl NAME POS [RUNS]";
    let (path, name) = (args.get(1).expect(usage), args.get(2).expect(usage));
    let pos: usize = args
        .get(3)
        .expect(usage)
        .parse()
        .expect("POS: a token index");
    let runs: usize = args
        .get(4)
        .map_or(21, |r| r.parse().expect("RUNS: a count"));
    let only = std::env::var("ONLY").is_ok();
    let flush = std::env::var("FLUSH").is_ok();
    let mut junk = vec![0u64; if flush { 8 << 20 } else { 0 }];
    let file = std::io::BufReader::new(std::fs::File::open(path).expect("corpus file"));
    let row: serde_json::Value = file
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(&l.expect("a line")).expect("JSON"))
        .find(|r| r["name"] == name.as_str())
        .expect("no schema of that name in the corpus");
    let g = compile_schema(&row["schema"].to_string()).expect("coli compiles the schema");
    let (vocab, _) = demo_vocab();
    let trie = TokenTrie::new(&vocab);
    // POS counts over the valid instances one after another, as `realworld` lists them.
    let (mut seq, mut pos) = (Vec::new(), pos);
    for v in row["valid"].as_array().expect("valid instances") {
        seq = trie.greedy_tokens(v.to_string().as_bytes());
        if pos < seq.len() {
            break;
        }
        pos -= seq.len();
    }
    assert!(pos < seq.len(), "the instances have fewer tokens");
    let mut mask = TokenMask::default();
    let (mut times, mut sizes) = (Vec::new(), (0, 0));
    for run in 0..runs {
        let c = Compiled::new(&g);
        let mut m = c.matcher();
        for &tok in &seq[..pos] {
            if !only {
                trie.mask(&m, &mut mask);
            }
            assert!(
                m.accept_bytes(&vocab[tok as usize]),
                "the instance is refused"
            );
        }
        if flush {
            // Out of the caches, as after llguidance's masks in `realworld`.
            junk.iter_mut().for_each(|x| *x = x.wrapping_add(1));
        }
        let before = c.automaton_size().0;
        let t0 = Instant::now();
        if run + 1 == runs {
            timed_mask(&trie, &m, &mut mask);
        } else {
            trie.mask(&m, &mut mask);
        }
        times.push(t0.elapsed().as_secs_f64() * 1e6);
        sizes = (before, c.automaton_size().0);
    }
    let before: Vec<u8> = seq[pos.saturating_sub(8)..pos]
        .iter()
        .flat_map(|&t| vocab[t as usize].clone())
        .collect();
    let shown = String::from_utf8_lossy(&before);
    times.sort_by(f64::total_cmp);
    println!(
        "{name} mask {pos} (after ...{shown}): median {:.1} us, range {:.1}-{:.1}, {} allowed, states {} -> {}",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        mask.count(),
        sizes.0,
        sizes.1
    );
}

/// The last run's timed mask, apart so a profiler can collect it alone (after the runs
/// before it, as in `realworld`, the automaton is a spare one)
/// (`valgrind --tool=callgrind --toggle-collect=cold_mask::timed_mask`).
#[inline(never)]
fn timed_mask(trie: &TokenTrie, m: &coli_grammar::Matcher, mask: &mut TokenMask) {
    trie.mask(m, mask);
}
