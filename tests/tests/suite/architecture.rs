//! ARCHITECTURE.md stays true: every path it names in backquotes exists, and the crates it
//! lists are the workspace's. And the synthetic DeepSeek-V3 benchmark model loads and runs.

use std::path::Path;

#[test]
fn every_path_architecture_md_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut checked = 0;
    let mut missing = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        // Odd pieces are inside backquotes; paths have a slash or a known extension.
        let looks_like_path = span.contains('/') && !span.contains(' ') && !span.contains("::");
        if i % 2 == 0 || !looks_like_path || span.starts_with("../") {
            continue;
        }
        // `arch/gqa.rs` is written relative to coli-models/src after the first mention.
        let candidates = [root.join(span), root.join("coli-models/src").join(span)];
        checked += 1;
        if !candidates.iter().any(|p| p.exists()) {
            missing.push(span.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names missing paths: {missing:?}"
    );
    assert!(
        checked >= 20,
        "only {checked} paths found: the check would prove little"
    );
    for krate in [
        "coli-core",
        "coli-kernels",
        "coli-grammar",
        "coli-models",
        "coli-plan",
        "coli-cli",
        "xtask",
        "tests",
    ] {
        assert!(root.join(krate).join("Cargo.toml").is_file(), "{krate}");
        assert!(
            text.contains(&format!("`{krate}`")),
            "{krate} not described"
        );
    }
}

/// The synthetic DeepSeek-V3 writer (the benchmark model's, here tiny) makes a checkpoint
/// coli loads whole, MTP layer included, and generates from with finite logits; drafting
/// by its MTP layer keeps the greedy tokens.
#[test]
fn synthetic_deepseek_v3_with_mtp_loads_and_generates() {
    use coli_models::sampling::argmax;
    use coli_models::{Sampler, SamplingParams, Session};
    use coli_tests::synthetic::{write_deepseek_v3, DeepseekSpec};

    let tmp = tempfile::tempdir().unwrap();
    let spec = DeepseekSpec::tiny();
    let mut reported = Vec::new();
    write_deepseek_v3(tmp.path(), &spec, |d, n| reported.push((d, n))).unwrap();
    assert_eq!(reported.last(), Some(&(spec.layers + 1, spec.layers + 1)));
    let model = coli_models::load(tmp.path()).unwrap();
    assert!(model.mtp.is_some(), "MTP layer not loaded");
    assert!(model.info.notes.is_empty(), "{:?}", model.info.notes);
    assert_eq!(model.info.n_layers, spec.layers);
    assert_eq!(model.layers.len(), spec.layers);

    let (prompt, n) = ([3u32, 17, 42, 5], 8);
    let mut s = Session::new(&model, prompt.len() + n);
    let mut logits = s.forward(&prompt, false).unwrap().to_vec();
    let mut greedy = Vec::new();
    for _ in 0..n {
        assert_eq!(logits.len(), spec.vocab);
        assert!(logits.iter().all(|x| x.is_finite()), "non-finite logits");
        let t = argmax(&logits);
        greedy.push(t);
        if greedy.len() < n {
            logits = s.forward(&[t], false).unwrap().to_vec();
        }
    }

    let mut s = Session::new(&model, prompt.len() + n);
    assert!(s.enable_mtp());
    let mut sampler = Sampler::new(SamplingParams::default());
    let g = s.generate(&prompt, n, &mut sampler, &[], |_| {}).unwrap();
    assert_eq!(g.generated_ids, greedy);
    assert!(g.stats.draft_forwards > 0, "no MTP draft was verified");
}
