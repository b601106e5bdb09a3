//! `coli doctor`: read-only readiness checks of a model directory. Each check has an id, a
//! status (ok / warning / error) and a one-line summary. The quick checks look at config,
//! family, tokenizer, shards, free disk, RAM and whether sidecars can be written; `deep`
//! adds every header's validation, shard numbering, the index against the headers, and the
//! family's required tensors with their shapes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

use crate::analyze::{analyze, analyze_uncached, Analysis};

/// Outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but worth knowing.
    Warning,
    /// Will not run (or not as asked).
    Error,
}

/// One check's result.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// Stable identifier (`config`, `family`, `tokenizer`, `shards`, `disk`, `ram`,
    /// `writable`; deep: `headers`, `numbering`, `index`, `tensors`).
    pub id: &'static str,
    /// Outcome.
    pub status: Status,
    /// One line.
    pub summary: String,
}

fn check(id: &'static str, status: Status, summary: impl Into<String>) -> Check {
    Check {
        id,
        status,
        summary: summary.into(),
    }
}

/// Free bytes on the filesystem holding `dir`.
pub fn free_disk(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the struct for a valid NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0)
        .then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Runs the checks. `ram` is the RAM budget (default: MemAvailable).
pub fn run(dir: &Path, deep: bool, ram: Option<u64>) -> Vec<Check> {
    use Status::*;
    let mut out = Vec::new();
    let gb = |b: u64| format!("{:.2} GB", b as f64 / 1e9);
    // Config and family.
    // A GGUF (a file, or the one in a directory without config.json): its config is its
    // metadata, its weight files its parts.
    let gguf = coli_core::model_dir::model_gguf(dir);
    let is_gguf = matches!(gguf, Result::Ok(Some(_)));
    let config = match gguf.and_then(|_| coli_core::ModelDir::config_only(dir)) {
        Result::Ok(md) => {
            let c = md.config;
            out.push(check("config", Ok, format!("{} parses", c.path.display())));
            Some(c)
        }
        Err(e) => {
            out.push(check("config", Error, e.to_string()));
            None
        }
    };
    let family = config.as_ref().map(|c| {
        c.model_type()
            .map_err(|e| e.to_string())
            .and_then(|t| coli_models::families::lookup(t).map_err(|e| e.to_string()))
    });
    match &family {
        Some(Result::Ok(f)) => out.push(check(
            "family",
            Ok,
            format!("{} ({})", f.display_name, f.model_types.join(", ")),
        )),
        Some(Err(e)) => out.push(check("family", Error, e.clone())),
        None => out.push(check(
            "family",
            Error,
            "no config.json to read model_type from",
        )),
    }
    out.push(if is_gguf {
        match coli_models::tokenizer::TextTokenizer::load_if_present(dir) {
            Result::Ok(Some(_)) => check(
                "tokenizer",
                Ok,
                "tokenizer loads (metadata or tokenizer.json beside)",
            ),
            Result::Ok(None) => check(
                "tokenizer",
                Warning,
                "no tokenizer.ggml.tokens and no tokenizer.json beside: only --prompt-ids works",
            ),
            Err(e) => check("tokenizer", Error, e.to_string()),
        }
    } else if dir.join("tokenizer.json").is_file() {
        check("tokenizer", Ok, "tokenizer.json present")
    } else {
        check(
            "tokenizer",
            Warning,
            "no tokenizer.json: only --prompt-ids works, not --prompt or --chat",
        )
    });
    // Shards present (names resolved, files exist).
    let shards = if is_gguf {
        coli_core::model_files(dir)
    } else {
        coli_core::shard_paths(dir)
    };
    let what = if is_gguf { "GGUF part" } else { "shard file" };
    match &shards {
        Result::Ok(s) => out.push(check("shards", Ok, format!("{} {what}(s) found", s.len()))),
        Err(e) => out.push(check("shards", Error, e.to_string())),
    }
    match free_disk(dir) {
        Some(b) if b < 1 << 30 => out.push(check(
            "disk",
            Warning,
            format!("{} free (sidecars and conversions need room)", gb(b)),
        )),
        Some(b) => out.push(check("disk", Ok, format!("{} free", gb(b)))),
        None => out.push(check("disk", Warning, "free space unknown")),
    }
    // RAM: what must stay resident vs the budget.
    let analysis: Option<Analysis> = if shards.is_ok() && matches!(family, Some(Result::Ok(_))) {
        analyze(dir).ok().map(|(a, _)| a)
    } else {
        None
    };
    let budget = ram.or_else(coli_models::experts::available_memory);
    match (&analysis, budget) {
        (Some(a), Some(b)) => {
            let resident = a.resident_bytes();
            let all = resident + a.expert_bytes;
            out.push(if resident > b {
                check(
                    "ram",
                    Error,
                    format!(
                        "dense part {} exceeds the RAM budget {}",
                        gb(resident),
                        gb(b)
                    ),
                )
            } else if all > b {
                check(
                    "ram",
                    Warning,
                    format!(
                        "dense {} fits in {}; experts ({}) will be streamed from disk",
                        gb(resident),
                        gb(b),
                        gb(a.expert_bytes)
                    ),
                )
            } else {
                check(
                    "ram",
                    Ok,
                    format!("the whole model ({}) fits in {}", gb(all), gb(b)),
                )
            });
        }
        (None, _) => out.push(check(
            "ram",
            Warning,
            "not assessed: the model could not be analyzed",
        )),
        (_, None) => out.push(check(
            "ram",
            Warning,
            "not assessed: available memory unknown",
        )),
    }
    out.push(writable(dir));
    if !deep {
        return out;
    }
    // Deep: every header.
    match analyze_uncached(dir) {
        Result::Ok(a) => out.push(check(
            "headers",
            Ok,
            format!(
                "{} tensors in {} shard headers, all valid",
                a.tensor_count,
                a.shards.len()
            ),
        )),
        Err(e) => out.push(check("headers", Error, e.to_string())),
    }
    if is_gguf {
        out.push(gguf_numbering(dir));
    } else {
        out.push(numbering(dir));
        out.push(index_agrees(dir));
    }
    out.push(match coli_core::ModelDir::open(dir) {
        Result::Ok(md) => match family {
            Some(Result::Ok(f)) => match (f.load)(&md) {
                Result::Ok(_) => check(
                    "tensors",
                    Ok,
                    format!(
                        "every tensor {} needs is present with its shape",
                        f.display_name
                    ),
                ),
                Err(e) => check("tensors", Error, e.to_string()),
            },
            _ => check("tensors", Error, "unknown family"),
        },
        Err(e) => check("tensors", Error, e.to_string()),
    });
    out
}

/// Whether sidecars can be written: create and remove a temp file.
fn writable(dir: &Path) -> Check {
    let probe = coli_core::write::temp_path_for(&coli_core::sidecar_path(dir, ".coli_doctor"));
    match std::fs::File::create(&probe) {
        Result::Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            check(
                "writable",
                Status::Ok,
                "sidecars (.coli_analysis.json, .coli_usage) can be written",
            )
        }
        Err(e) => check(
            "writable",
            Status::Warning,
            format!("read-only for coli ({e}): runs work uncached, no routing history"),
        ),
    }
}

/// `model-0000i-of-0000N.safetensors` names: one N, indices 1..=N without gaps.
fn numbering(dir: &Path) -> Check {
    let names: Vec<String> = match std::fs::read_dir(dir) {
        Result::Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors"))
            .collect(),
        Err(e) => return check("numbering", Status::Error, e.to_string()),
    };
    let mut totals = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for n in &names {
        let parsed = n
            .strip_prefix("model-")
            .and_then(|r| r.strip_suffix(".safetensors"))
            .and_then(|r| r.split_once("-of-"))
            .and_then(|(i, t)| Some((i.parse::<usize>().ok()?, t.parse::<usize>().ok()?)));
        match parsed {
            Some((i, t)) => {
                seen.insert(i);
                totals.insert(t);
            }
            None if names.len() == 1 => {
                return check("numbering", Status::Ok, format!("single file {n}"))
            }
            None => {
                return check(
                    "numbering",
                    Status::Warning,
                    format!("{n} does not follow model-0000i-of-0000N.safetensors"),
                )
            }
        }
    }
    match totals.iter().next() {
        None => check("numbering", Status::Error, "no shard files"),
        Some(_) if totals.len() > 1 => check(
            "numbering",
            Status::Error,
            format!("shards disagree on their total: {totals:?}"),
        ),
        Some(&t) => {
            let missing: Vec<usize> = (1..=t).filter(|i| !seen.contains(i)).collect();
            if missing.is_empty() && seen.len() == t {
                check(
                    "numbering",
                    Status::Ok,
                    format!("shards 1..{t} all present"),
                )
            } else {
                check(
                    "numbering",
                    Status::Error,
                    format!("of {t} shards, missing numbers {missing:?}"),
                )
            }
        }
    }
}

/// A GGUF's parts: every `{stem}-0000k-of-0000N.gguf` present, each parsing (offsets,
/// sizes, alignment: a truncated or corrupt part is named with its first bad tensor), and
/// saying its own number (`split.no`) and the count (`split.count`).
fn gguf_numbering(dir: &Path) -> Check {
    let first = match coli_core::model_dir::model_gguf(dir) {
        Result::Ok(Some(f)) => f,
        Result::Ok(None) => return check("numbering", Status::Error, "no GGUF"),
        Err(e) => return check("numbering", Status::Error, e.to_string()),
    };
    let parts = match coli_core::model_dir::gguf_part_paths(&first) {
        Result::Ok(p) => p,
        Err(e) => return check("numbering", Status::Error, e.to_string()),
    };
    let n = parts.len();
    for (k, p) in parts.iter().enumerate() {
        let f = match coli_core::gguf::GgufFile::open(p) {
            Result::Ok(f) => f,
            Err(e) => return check("numbering", Status::Error, e.to_string()),
        };
        let key = |k: &str| {
            f.metadata
                .get(k)
                .and_then(coli_core::gguf::GgufValue::as_u64)
        };
        let (no, count) = (key("split.no"), key("split.count"));
        let bad_no = no.is_some_and(|x| x as usize != k) || (n > 1 && no.is_none());
        let bad_count = count.is_some_and(|c| c as usize != n && !(n == 1 && c <= 1));
        if bad_no || bad_count {
            return check(
                "numbering",
                Status::Error,
                format!(
                    "{}: split.no = {no:?}, split.count = {count:?}; expected {k} of {n}",
                    p.display()
                ),
            );
        }
    }
    check(
        "numbering",
        Status::Ok,
        if n == 1 {
            "a single GGUF file, valid".to_string()
        } else {
            format!("GGUF parts 1..{n} all present and valid, each numbered")
        },
    )
}

/// The index's weight map against the shards' headers.
fn index_agrees(dir: &Path) -> Check {
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return check("index", Status::Ok, "no index (single file)");
    }
    let map: BTreeMap<String, String> = match std::fs::read(&index)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).map_err(|e| e.to_string()))
        .and_then(|v| {
            serde_json::from_value(v["weight_map"].clone()).map_err(|e| format!("weight_map: {e}"))
        }) {
        Result::Ok(m) => m,
        Err(e) => return check("index", Status::Error, format!("{}: {e}", index.display())),
    };
    let mut by_file: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (name, file) in &map {
        by_file
            .entry(file.as_str())
            .or_default()
            .insert(name.as_str());
    }
    let mut problems = Vec::new();
    for (file, names) in &by_file {
        let path = dir.join(file);
        let bytes = match std::fs::File::open(&path).and_then(|f| {
            use std::os::unix::fs::FileExt;
            let len = f.metadata()?.len();
            let mut p = [0u8; 8];
            f.read_exact_at(&mut p, 0)?;
            let n = u64::from_le_bytes(p).min(len.saturating_sub(8)) as usize;
            let mut h = vec![0u8; n];
            f.read_exact_at(&mut h, 8)?;
            std::io::Result::Ok((h, len))
        }) {
            Result::Ok(b) => b,
            Err(e) => {
                problems.push(format!("{file}: {e}"));
                continue;
            }
        };
        let header = match coli_core::safetensors_header::parse_header(&bytes.0, bytes.1) {
            Result::Ok(h) => h,
            Err(e) => {
                problems.push(format!("{file}: {e}"));
                continue;
            }
        };
        for n in names {
            if !header.tensors.contains_key(*n) {
                problems.push(format!(
                    "index puts \"{n}\" in {file}, whose header lacks it"
                ));
            }
        }
        for n in header.tensors.keys() {
            if !names.contains(n.as_str()) {
                problems.push(format!(
                    "{file} holds \"{n}\", which the index does not list there"
                ));
            }
        }
    }
    match problems.first() {
        None => check(
            "index",
            Status::Ok,
            format!(
                "{} entries agree with {} shard headers",
                map.len(),
                by_file.len()
            ),
        ),
        Some(first) => check(
            "index",
            Status::Error,
            format!("{} disagreement(s), first: {first}", problems.len()),
        ),
    }
}

/// The worst status among `checks` (Ok when there are none).
pub fn worst(checks: &[Check]) -> Status {
    checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok)
}

/// `coli doctor`'s exit code: 0 when every check passed or only warned, 1 when one failed.
pub fn exit_code(checks: &[Check]) -> u8 {
    match worst(checks) {
        Status::Ok | Status::Warning => 0,
        Status::Error => 1,
    }
}
