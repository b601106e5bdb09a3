//! The stable run of the `analysis_sidecar` cargo-fuzz target
//! (`fuzz/fuzz_targets/analysis_sidecar.rs`): the committed corpus, the sidecar a real
//! analysis writes, and a fixed number of seeded mutations of each, written as the
//! `.coli_analysis.json` of a valid one-shard Llama directory. Whatever the sidecar holds,
//! `analyze` answers, and unless it took the sidecar as a hit, its answer equals a fresh
//! scan. A panic or a wrong answer fails the test.

use std::path::Path;

use coli_core::fuzzing::{mutate, Rng};
use coli_plan::analyze::{analyze, analyze_uncached, CacheOutcome, SIDECAR};

/// The fuzz target's directory: a one-layer Llama config and a shard of one F32 tensor.
fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type":"llama","num_hidden_layers":1,"hidden_size":4}"#,
    )
    .unwrap();
    let header = r#"{"model.norm.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    std::fs::write(
        dir.path().join("model.safetensors"),
        coli_core::fuzzing::safetensors_file(header, 16),
    )
    .unwrap();
    dir
}

/// The target's body; says whether the sidecar was taken as a hit.
fn check(dir: &Path, data: &[u8]) -> bool {
    std::fs::write(dir.join(SIDECAR), data).unwrap();
    let (a, outcome) = analyze(dir).expect("a valid directory analyzes whatever its sidecar holds");
    let hit = matches!(outcome, CacheOutcome::Hit);
    if !hit {
        assert_eq!(a, analyze_uncached(dir).unwrap());
    }
    hit
}

#[test]
fn analysis_sidecar_seeded() {
    let dir = model_dir();
    // A sidecar of this very directory, as analyze writes it: a hit, so its mutants reach
    // the parser's deeper checks (signature, then the analysis itself).
    let _ = std::fs::remove_file(dir.path().join(SIDECAR));
    assert_eq!(analyze(dir.path()).unwrap().1, CacheOutcome::Stored);
    let own = std::fs::read(dir.path().join(SIDECAR)).unwrap();
    assert!(
        check(dir.path(), &own),
        "the directory's own sidecar is a hit"
    );

    let mut seeds = coli_core::fuzzing::seed_corpus("analysis_sidecar");
    seeds.push(own);
    let mut rng = Rng::new(14);
    let mut hits = 0;
    for s in &seeds {
        check(dir.path(), s);
        for _ in 0..2_000 {
            hits += check(dir.path(), &mutate(&mut rng, s)) as usize;
        }
    }
    // Some mutants of the real sidecar still parse and match (a digit of a field the
    // signature does not hold): the accepting path is exercised. (The real sidecar holds
    // the temp directory's path and times, so its mutants differ from run to run.)
    assert!(hits > 0, "no mutant of a real sidecar was taken as a hit");
}
