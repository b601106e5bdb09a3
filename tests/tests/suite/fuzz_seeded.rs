//! Stable runs of the cargo-fuzz targets whose parsers live in coli-models: GGUF import
//! (`coli_models::gguf_import::fuzzing::import`, into a temp directory) and the
//! `.coli_usage` history (`coli_models::experts::usage::parse`). Each runs the committed corpus
//! (`fuzz/seeds/<target>/`) and a fixed number of seeded mutations through the same
//! function the fuzz target calls; a panic fails the test. (The `.coli_analysis.json`
//! target goes through coli-plan: its stable run is `coli-plan/tests/suite/fuzz_seeded.rs`.)
//!
//! `cargo test --release -p coli-tests --test suite fuzz_seeded -- --ignored` rewrites the seeds.

use coli_core::fuzzing::{mutate, Rng};
use coli_models::experts::usage;
use coli_models::gguf_import::fuzzing::{import, TinyLlama};

fn seeds(target: &str) -> Vec<(&'static str, Vec<u8>)> {
    match target {
        "gguf_import" => vec![
            ("seed-tiny-llama", TinyLlama::default().bytes()),
            (
                "seed-tiny-llama-mha",
                TinyLlama {
                    kv_heads: 2,
                    ..TinyLlama::default()
                }
                .bytes(),
            ),
        ],
        "usage_sidecar" => vec![(
            "seed-usage",
            b"coli-usage 1\n0 3 17\n0 7 2\n1 0 99\n12 255 18446744073709551615\n".to_vec(),
        )],
        other => panic!("no seeds for {other}"),
    }
}

#[test]
#[ignore = "rewrites fuzz/seeds"]
fn write_seed_corpus() {
    for target in ["gguf_import", "usage_sidecar"] {
        let dir = coli_core::fuzzing::seed_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds(target) {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

#[test]
fn committed_seeds_match_their_makers() {
    for target in ["gguf_import", "usage_sidecar"] {
        for (name, bytes) in seeds(target) {
            let committed = std::fs::read(coli_core::fuzzing::seed_dir(target).join(name))
                .unwrap_or_else(|e| panic!("{target}/{name}: {e} (run write_seed_corpus)"));
            assert_eq!(committed, bytes, "{target}/{name} differs from its maker");
        }
    }
}

#[test]
fn gguf_import_seeded() {
    // Successful imports fsync four files each: on tmpfs where there is one, so the run's
    // time is the parsers', not the disk's.
    let tmp = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let mut rng = Rng::new(12);
    let seeds = coli_core::fuzzing::seed_corpus("gguf_import");
    for s in &seeds {
        // Each seed imports (checked by hand: the entry point only says no panic).
        let src = tmp.path().join("seed.gguf");
        std::fs::write(&src, s).unwrap();
        let out = tmp.path().join("seed-out");
        coli_models::gguf_import::import_gguf(&src, &out, |_, _| {}).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
        import(s, tmp.path());
        // Successful imports fsync four files each; most mutants fail at the header.
        for _ in 0..1500 {
            let m = mutate(&mut rng, s);
            import(&m, tmp.path());
        }
    }
}

/// The usage target's body (the same as `fuzz/fuzz_targets/usage_sidecar.rs`).
fn usage_entry(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let Some(u) = usage::parse(text) else {
        return false;
    };
    let again = usage::parse(&usage::render(&u)).expect("a rendered history parses");
    let nonzero: usage::Usage = u.into_iter().filter(|&(_, n)| n > 0).collect();
    assert_eq!(again, nonzero);
    true
}

#[test]
fn usage_sidecar_seeded() {
    let mut rng = Rng::new(13);
    let mut accepted = 0;
    for s in coli_core::fuzzing::seed_corpus("usage_sidecar") {
        assert!(usage_entry(&s));
        for _ in 0..20_000 {
            accepted += usage_entry(&mutate(&mut rng, &s)) as usize;
        }
    }
    // Enough mutants parse that the accepting path is exercised, not only the header check.
    assert!(accepted > 1000, "{accepted} mutants accepted");
}
