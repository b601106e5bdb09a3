//! ARCHITECTURE.md stays true: every path it names in backquotes exists, and the crates it
//! lists are the workspace's.

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
