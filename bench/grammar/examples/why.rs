//! Why coli-grammar refuses a corpus instance: `why CORPUS.jsonl NAME` prints, for each
//! valid instance of schema NAME that coli refuses, the byte where the grammar stops or
//! the validator's complaint.
use coli_grammar::{compile_schema, Compiled, Matcher};
use std::io::BufRead;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let f = std::io::BufReader::new(std::fs::File::open(&a[1]).unwrap());
    for line in f.lines() {
        let row: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if row["name"] != a[2].as_str() {
            continue;
        }
        let g = compile_schema(&row["schema"].to_string()).unwrap();
        let c = Compiled::new(&g);
        for (k, key) in ["valid", "invalid"].iter().enumerate() {
            for v in row[*key].as_array().unwrap() {
                let t = v.to_string();
                if Matcher::matches(&c, &t) == (k == 0) {
                    continue;
                }
                let mut m = c.matcher();
                let mut at = None;
                for (i, b) in t.bytes().enumerate() {
                    if !m.accept_bytes(&[b]) {
                        at = Some(i);
                        break;
                    }
                }
                match at {
                    Some(i) => println!(
                        "{key}: grammar stops at byte {i}: ...{}[[{}]]",
                        &t[i.saturating_sub(120)..i],
                        &t[i..(i + 40).min(t.len())]
                    ),
                    None => println!(
                        "{key}: grammar complete={} check={:?}\n  {}",
                        m.is_complete(),
                        c.check_complete(&t),
                        &t[..t.len().min(300)]
                    ),
                }
            }
        }
    }
}
