//! Times the compile of a JSON Schema file, by stage (schema to grammar, automaton
//! rules): `cargo run --release -p coli-grammar --example compile_time -- FILE [RUNS]`.
use coli_grammar::{compile_schema, Compiled};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: compile_time FILE [RUNS]");
    let runs: usize = args.next().map_or(5, |r| r.parse().expect("RUNS: a count"));
    let text = std::fs::read_to_string(&path).expect("readable file");
    for _ in 0..runs {
        let t0 = Instant::now();
        let g = match compile_schema(&text) {
            Ok(g) => g,
            Err(e) => {
                println!(
                    "refused after {:.1} ms: {e}",
                    t0.elapsed().as_secs_f64() * 1e3
                );
                continue;
            }
        };
        let t1 = Instant::now();
        let c = Compiled::new(&g);
        let t2 = Instant::now();
        println!(
            "schema to grammar {:.1} ms, automaton rules {:.1} ms ({} rules, {} warnings)",
            (t1 - t0).as_secs_f64() * 1e3,
            (t2 - t1).as_secs_f64() * 1e3,
            g.rules.len(),
            c.warnings().len()
        );
    }
}
