//! Helpers shared by coli-plan's tests.

use std::path::{Path, PathBuf};

/// A committed oracle fixture.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// A fixture's model files (no sidecars) in a temp dir.
pub fn copy(name: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        if !e.file_name().to_string_lossy().starts_with('.') {
            std::fs::copy(e.path(), t.path().join(e.file_name())).unwrap();
        }
    }
    t
}
