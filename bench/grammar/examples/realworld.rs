//! coli-grammar and llguidance on one real-world corpus file (JSON lines of
//! `{name, schema, valid, invalid}`, as `realworld/build_corpus.py` writes them), through
//! each library's public API as a user would call it:
//!
//! - compile: coli `compile_schema` (+ `Compiled::new`), llguidance
//!   `TopLevelGrammar::from_json_schema` + `create_parser`; both timed;
//! - instances: each instance's compact JSON; coli `Matcher::matches`, llguidance the
//!   instance's tokens (greedy over the demo vocabulary) consumed and then accepting;
//! - masks (schemas both compile, valid instances): a fresh grammar (cold) per instance,
//!   a mask before every token, timed (`REPEAT=K`: each instance K times, each position's
//!   fastest kept).
//!
//! One JSON line per schema on stdout, flushed, so a crash names its schema; `compare.py`
//! runs this and sums the lines. Usage: `realworld CORPUS.jsonl [--skip N]`.

use std::io::{BufRead, Write};
use std::time::Instant;

use coli_grammar::{compile_schema, Compiled, Matcher, TokenMask, TokenTrie};
use coli_grammar_bench::{demo_vocab, llg_factory, llg_matcher};
use serde_json::{json, Value};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: realworld CORPUS.jsonl [--skip N]");
    let skip: usize = args
        .iter()
        .position(|a| a == "--skip")
        .map(|i| args[i + 1].parse().expect("--skip N"))
        .unwrap_or(0);
    let repeat: usize = std::env::var("REPEAT").map_or(1, |r| r.parse().expect("REPEAT: a count"));
    let (vocab, eos) = demo_vocab();
    let trie = TokenTrie::new(&vocab);
    let factory = llg_factory(&vocab, eos);
    let file = std::io::BufReader::new(std::fs::File::open(path).expect("corpus file"));
    let mut out = std::io::stdout().lock();
    let mut mask = TokenMask::default();
    for (i, line) in file.lines().enumerate().skip(skip) {
        let row: Value = serde_json::from_str(&line.unwrap()).expect("corpus line");
        let schema = &row["schema"];
        let texts = |k: &str| -> Vec<String> {
            row[k]
                .as_array()
                .map(|a| a.iter().map(|v| v.to_string()).collect())
                .unwrap_or_default()
        };
        let (mut valid, mut invalid) = (texts("valid"), texts("invalid"));
        // Labels are re-checked by the jsonschema crate (draft from `$schema`, else
        // 2020-12, formats checked): the Python labeller skips formats it has no checker
        // for. Instances the two disagree on are left out and counted.
        let relabelled = match coli_grammar::schema::jsonschema_validator(schema, None, true) {
            Ok(v) => {
                let n = valid.len() + invalid.len();
                let ok = |t: &String| v.is_valid(&serde_json::from_str::<Value>(t).unwrap());
                valid.retain(ok);
                invalid.retain(|t| !ok(t));
                n - valid.len() - invalid.len()
            }
            Err(_) => 0,
        };
        // coli
        let t0 = Instant::now();
        let coli = compile_schema(&schema.to_string()).map(|g| (Compiled::new(&g), g));
        let coli_us = t0.elapsed().as_secs_f64() * 1e6;
        let coli_err = coli.as_ref().err().map(|e| e.to_string());
        let coli_warnings = coli.as_ref().map(|(c, _)| c.warnings().len()).unwrap_or(0);
        // llguidance
        let t0 = Instant::now();
        let llg = llg_matcher(&factory, schema);
        let llg_us = t0.elapsed().as_secs_f64() * 1e6;
        let coli_accepts = |ts: &[String]| -> Vec<bool> {
            match &coli {
                Ok((c, _)) => ts.iter().map(|t| Matcher::matches(c, t)).collect(),
                Err(_) => vec![],
            }
        };
        let llg_accepts = |ts: &[String]| -> Vec<bool> {
            if llg.is_none() {
                return vec![];
            }
            ts.iter()
                .map(|t| {
                    let Some(mut m) = llg_matcher(&factory, schema) else {
                        return false;
                    };
                    let seq = trie.greedy_tokens(t.as_bytes());
                    matches!(m.try_consume_tokens(&seq), Ok(n) if n == seq.len())
                        && m.is_accepting().unwrap_or(false)
                })
                .collect()
        };
        let (cv, ci) = (coli_accepts(&valid), coli_accepts(&invalid));
        let (lv, li) = (llg_accepts(&valid), llg_accepts(&invalid));
        // masks, cold, on the valid instances both accept; with REPEAT=K each instance's
        // masks are taken K times, each time with a fresh grammar, and each position keeps
        // its fastest (a noisy machine's interruptions left out, for both libraries alike)
        let (mut coli_mask, mut llg_mask): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
        if let (Ok((_, g)), Some(_)) = (&coli, &llg) {
            for (k, t) in valid.iter().enumerate() {
                if !(cv[k] && lv[k]) {
                    continue;
                }
                let seq = trie.greedy_tokens(t.as_bytes());
                let (mut cm, mut lm) = (vec![f64::MAX; seq.len()], vec![f64::MAX; seq.len()]);
                let mut l_len = seq.len();
                for _ in 0..repeat {
                    let c = Compiled::new(g);
                    let mut m = c.matcher();
                    for (j, &tok) in seq.iter().enumerate() {
                        let t0 = Instant::now();
                        trie.mask(&m, &mut mask);
                        cm[j] = cm[j].min(t0.elapsed().as_secs_f64() * 1e6);
                        m.accept_bytes(&vocab[tok as usize]);
                    }
                    let mut l = llg_matcher(&factory, schema).expect("compiled before");
                    for (j, &tok) in seq.iter().enumerate() {
                        let t0 = Instant::now();
                        let ok = l.compute_mask().map(|mk| mk.is_allowed(tok));
                        lm[j] = lm[j].min(t0.elapsed().as_secs_f64() * 1e6);
                        if !matches!(ok, Ok(true)) || l.consume_token(tok).is_err() {
                            l_len = l_len.min(j + 1);
                            break;
                        }
                    }
                }
                coli_mask.extend(cm);
                llg_mask.extend(&lm[..l_len]);
            }
        }
        let r = json!({
            "i": i,
            "name": row["name"],
            "coli_ok": coli.is_ok(),
            "coli_err": coli_err,
            "coli_warnings": coli_warnings,
            "relabelled": relabelled,
            "coli_us": coli_us,
            "llg_ok": llg.is_some(),
            "llg_us": llg_us,
            "coli_valid": cv,
            "coli_invalid": ci,
            "llg_valid": lv,
            "llg_invalid": li,
            "coli_mask_us": coli_mask,
            "llg_mask_us": llg_mask,
        });
        writeln!(out, "{r}").unwrap();
        out.flush().unwrap();
    }
}
