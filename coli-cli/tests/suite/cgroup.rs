//! In a container, coli is not killed: under a memory cgroup smaller than the model, the
//! default `coli run` sizes its expert cache from the cgroup's headroom (not the host's
//! `MemAvailable`) and completes, its peak usage under the limit. Needs root and a cgroup
//! v1 memory controller at /sys/fs/cgroup/memory; elsewhere the test says why it is
//! skipped and passes.

use std::path::{Path, PathBuf};
use std::process::Command;

const CGROUP_V1: &str = "/sys/fs/cgroup/memory";

/// A fresh memory cgroup of `limit` bytes, removed on drop.
struct Group(PathBuf);

impl Group {
    fn new(limit: u64) -> Option<Group> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = Path::new(CGROUP_V1).join(format!("coli-test-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let g = Group(dir);
        std::fs::write(g.0.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        let _ = std::fs::write(g.0.join("memory.swappiness"), "0");
        Some(g)
    }

    fn read(&self, name: &str) -> u64 {
        let text = std::fs::read_to_string(self.0.join(name)).unwrap();
        text.split_whitespace()
            .last()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    fn oom_kills(&self) -> u64 {
        let text = std::fs::read_to_string(self.0.join("memory.oom_control")).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The synthetic OLMoE both tests use: 4 MoE layers x 32 experts x 1.5 MB (bf16) =
/// 200 MB of experts, ~8 MB dense. Returns its directory and size in bytes.
fn synthetic_model(tmp: &Path) -> (PathBuf, u64) {
    let model = tmp.join("m");
    let spec = coli_tests::synthetic::OlmoeSpec {
        layers: 4,
        experts: 32,
        top_k: 4,
        hidden: 512,
        inter: 512,
        heads: 8,
        vocab: 512,
        int8_experts: false,
        seed: 11,
    };
    coli_tests::synthetic::write_olmoe(&model, &spec, |_, _| {}).unwrap();
    let bytes = std::fs::read_dir(&model)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    (model, bytes)
}

/// Runs `coli ARGS` inside `group`, after dropping the page cache.
fn coli_in(group: &Group, args: &str) -> std::process::Output {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    let coli = env!("CARGO_BIN_EXE_coli");
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/tasks && exec {coli} {args}",
            group.0.display()
        ))
        .output()
        .unwrap()
}

/// `coli convert` streams: in a cgroup of a quarter of the model's size it completes, and
/// writes the same bytes as an unconstrained convert.
#[test]
fn convert_completes_in_a_quarter_of_the_model_and_writes_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, model_bytes) = synthetic_model(tmp.path());
    let limit = model_bytes / 4;
    let Some(group) = Group::new(limit) else {
        eprintln!("skipped: cannot create a v1 memory cgroup under {CGROUP_V1} (needs root)");
        return;
    };
    let (free, limited) = (tmp.path().join("free"), tmp.path().join("limited"));
    let coli = env!("CARGO_BIN_EXE_coli");
    crate::cli::output_ok(Command::new(coli).args([
        "convert",
        "--model",
        model.to_str().unwrap(),
        "--out",
        free.to_str().unwrap(),
    ]));
    let out = coli_in(
        &group,
        &format!(
            "convert --model {} --out {}",
            model.display(),
            limited.display()
        ),
    );
    let peak = group.read("memory.max_usage_in_bytes");
    assert!(
        out.status.success(),
        "convert under {limit} B: {:?} (OOM kills {}): {}",
        out.status,
        group.oom_kills(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(peak <= limit, "peak {peak} over the limit {limit}");
    let mut files: Vec<_> = std::fs::read_dir(&free)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for f in files {
        assert_eq!(
            std::fs::read(free.join(&f)).unwrap(),
            std::fs::read(limited.join(&f)).unwrap(),
            "{f:?} differs"
        );
    }
    eprintln!("cgroup convert: limit {limit} B (model {model_bytes} B), peak {peak} B");
}

#[test]
fn default_run_completes_in_a_memory_cgroup_smaller_than_the_model() {
    const MB: u64 = 1 << 20;
    let limit = 160 * MB;
    let Some(group) = Group::new(limit) else {
        eprintln!("skipped: cannot create a v1 memory cgroup under {CGROUP_V1} (needs root)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (model, model_bytes) = synthetic_model(tmp.path());
    assert!(
        model_bytes > limit,
        "the model ({model_bytes} B) must not fit"
    );
    let out = coli_in(
        &group,
        &format!(
            "run --model {} --prompt-ids 1,2,3,4 --max-tokens 8 --json --no-usage",
            model.display()
        ),
    );
    let peak = group.read("memory.max_usage_in_bytes");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "coli run under a {limit} B cgroup: {:?} (OOM kills {}), stderr: {stderr}",
        out.status,
        group.oom_kills()
    );
    assert_eq!(group.oom_kills(), 0);
    assert!(peak <= limit, "peak {peak} over the limit {limit}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let cap = v["stats"]["cap_per_layer"].as_u64().unwrap();
    assert!(
        cap < 32,
        "the cache must be sized from the cgroup, got {cap} of 32 per layer"
    );
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 8);
    // RAM is short, so the experts stream past the page cache (O_DIRECT) by default,
    // unless the temporary directory's filesystem refuses it.
    let direct = v["stats"]["placement"]["direct"].as_bool().unwrap();
    assert!(
        direct || !o_direct_opens(&model),
        "an automatic cache of {cap}/32 streams with O_DIRECT"
    );
    eprintln!("cgroup run: limit {limit} B, peak {peak} B, cap {cap}/32, model {model_bytes} B, direct {direct}");
}

/// Whether a file of the model directory opens with `O_DIRECT` (tmpfs before Linux 6.6
/// and some other filesystems refuse it).
fn o_direct_opens(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .expect("a shard");
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .is_ok()
}
