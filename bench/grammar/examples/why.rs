//! Why coli-grammar refuses a corpus instance: `why CORPUS.jsonl NAME` prints, for each
//! valid instance of schema NAME that coli refuses, the byte where the grammar stops or
//! the validator's complaint. `why CORPUS.jsonl NAME masks` prints instead the cold mask
//! times over the first valid instance, slowest first, with the text before each.
use coli_grammar::{compile_schema, Compiled, Matcher, TokenMask, TokenTrie};
use std::io::BufRead;
use std::time::Instant;

fn masks(c: &Compiled, text: &str) {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).unwrap();
    let vocab = coli_models::TextTokenizer::load(&dir)
        .unwrap()
        .token_bytes();
    let trie = TokenTrie::new(&vocab);
    let mut mask = TokenMask::default();
    let mut m = c.matcher();
    let mut rows = Vec::new();
    let mut done = String::new();
    for t in trie.greedy_tokens(text.as_bytes()) {
        let t0 = Instant::now();
        trie.mask(&m, &mut mask);
        rows.push((t0.elapsed().as_secs_f64() * 1e6, mask.count(), done.clone()));
        m.accept_bytes(&vocab[t as usize]);
        done.push_str(&String::from_utf8_lossy(&vocab[t as usize]));
    }
    // Warm again at every position: the shortcut against the full walk.
    if std::env::var_os("WHY_WARM").is_some() {
        let mut m = c.matcher();
        let mut all = TokenMask::default();
        for (i, t) in trie.greedy_tokens(text.as_bytes()).into_iter().enumerate() {
            let t0 = Instant::now();
            trie.mask(&m, &mut mask);
            let a = t0.elapsed().as_secs_f64() * 1e6;
            let t0 = Instant::now();
            trie.mask_walking_all(&m, &mut all);
            let b = t0.elapsed().as_secs_f64() * 1e6;
            if std::env::var("WHY_LOOP")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                == Some(i)
            {
                let t0 = Instant::now();
                for _ in 0..500 {
                    trie.mask(&m, &mut mask);
                }
                println!(
                    "loop at {i}: {:.0} us per mask",
                    t0.elapsed().as_secs_f64() * 1e6 / 500.0
                );
            }
            if a > 200.0 {
                println!(
                    "warm {i}: mask {a:.0} us, walking all {b:.0} us, {} allowed",
                    mask.count()
                );
            }
            m.accept_bytes(&vocab[t as usize]);
        }
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (us, n, before) in rows.iter().take(12) {
        let tail: String = before
            .chars()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        println!("{us:9.1} us {n:6} allowed  ...{tail}");
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let f = std::io::BufReader::new(std::fs::File::open(&a[1]).unwrap());
    for line in f.lines() {
        let row: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if row["name"] != a[2].as_str() {
            continue;
        }
        if a.get(3).is_some_and(|m| m == "compile") {
            let text = row["schema"].to_string();
            let t0 = Instant::now();
            let gbnf = coli_grammar::schema_to_gbnf(&row["schema"]).unwrap();
            let t1 = Instant::now();
            if let Some(f) = std::env::var_os("WHY_DUMP") {
                std::fs::write(f, &gbnf).unwrap();
            }
            let parsed = coli_grammar::parse(&gbnf).unwrap();
            let t2 = Instant::now();
            let g = compile_schema(&text).unwrap();
            let t3 = Instant::now();
            let _c = Compiled::new(&g);
            let t4 = Instant::now();
            let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
            println!(
                "convert {:.1} ms ({} bytes, {} rules), parse {:.1} ms, compile_schema {:.1} ms, Compiled::new {:.1} ms",
                ms(t0, t1),
                gbnf.len(),
                parsed.rules.len(),
                ms(t1, t2),
                ms(t2, t3),
                ms(t3, t4)
            );
            return;
        }
        let g = compile_schema(&row["schema"].to_string()).unwrap();
        let c = Compiled::new(&g);
        if a.get(3).is_some_and(|m| m == "masks") {
            masks(&c, &row["valid"][0].to_string());
            return;
        }
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
