//! Any bytes as the `.coli_analysis.json` sidecar of a valid one-shard Llama directory
//! (its reader is private to coli-plan, so this goes through the public `analyze`): a
//! corrupt sidecar is ignored, never a panic or an error, and unless it was taken as a
//! hit the analysis equals a fresh scan.
#![no_main]
use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();

fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type":"llama","num_hidden_layers":1,"hidden_size":4}"#,
    )
    .expect("write config");
    let header = r#"{"model.norm.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend([0u8; 16]);
    std::fs::write(dir.path().join("model.safetensors"), bytes).expect("write shard");
    dir
}

fn check(dir: &Path, data: &[u8]) {
    std::fs::write(dir.join(coli_plan::analyze::SIDECAR), data).expect("write sidecar");
    let (a, outcome) =
        coli_plan::analyze(dir).expect("a valid directory analyzes whatever its sidecar holds");
    if !matches!(outcome, coli_plan::CacheOutcome::Hit) {
        assert_eq!(a, coli_plan::analyze_uncached(dir).expect("scan"));
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = DIR.get_or_init(model_dir);
    check(dir.path(), data);
});
