//! How much memory this process may still use: the tighter of the kernel's
//! `MemAvailable` and, for every memory cgroup the process is in (cgroup v1 and v2, the
//! group itself and each ancestor up to the mount), its limit minus its usage. A
//! container's limit is what kills a process, not the host's free memory; usage includes
//! the group's page cache, which a v1 limit counts.

use std::path::{Path, PathBuf};

/// A limit at or above this is "no limit" (v1 writes 2^63 rounded down to a page).
const UNLIMITED: u64 = 1 << 62;

/// Bytes this process may still use, or `None` when nothing can be read.
pub fn available_memory() -> Option<u64> {
    available_memory_in(Path::new("/"))
}

/// [`available_memory`] with `/proc` and the cgroup mounts looked up under `root` (tests
/// build a fake tree).
pub fn available_memory_in(root: &Path) -> Option<u64> {
    let meminfo = mem_available(root);
    let cgroups = cgroup_headroom(root);
    match (meminfo, cgroups) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
fn mem_available(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/meminfo")).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A memory controller mount: where it is, which cgroup path its root shows, its version.
struct Mount {
    point: PathBuf,
    root: String,
    v2: bool,
}

/// The memory-controller mounts of `/proc/self/mountinfo`.
fn memory_mounts(root: &Path) -> Vec<Mount> {
    let Ok(text) = std::fs::read_to_string(root.join("proc/self/mountinfo")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        // ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL…] - FSTYPE SOURCE SUPER_OPTIONS
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        let v2 = r[0] == "cgroup2";
        let v1_memory = r[0] == "cgroup" && r[2].split(',').any(|o| o == "memory");
        if v2 || v1_memory {
            let point = root.join(l[4].trim_start_matches('/'));
            out.push(Mount {
                point,
                root: l[3].to_string(),
                v2,
            });
        }
    }
    out
}

/// The smallest `limit - usage` over the process's memory cgroups and their ancestors.
fn cgroup_headroom(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
    let mounts = memory_mounts(root);
    let mut best: Option<u64> = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let v2 = controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "memory") {
            continue;
        }
        for m in mounts.iter().filter(|m| m.v2 == v2) {
            let rel = path.strip_prefix(m.root.as_str()).unwrap_or(path);
            let mut dir = m.point.join(rel.trim_start_matches('/'));
            loop {
                if let Some(h) = headroom(&dir, v2) {
                    best = Some(best.map_or(h, |b| b.min(h)));
                }
                if dir == m.point || !dir.pop() || !dir.starts_with(&m.point) {
                    break;
                }
            }
        }
    }
    best
}

/// `limit - usage` of one cgroup directory (None when unlimited or unreadable), the
/// group's inactive file pages not counted as used: the kernel reclaims them first when
/// the group nears its limit (the page cache of a model file read once at load would
/// otherwise shrink the expert cache sized after it).
fn headroom(dir: &Path, v2: bool) -> Option<u64> {
    let read = |name: &str| -> Option<String> {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let (limit, usage) = if v2 {
        (read("memory.max")?, read("memory.current")?)
    } else {
        (
            read("memory.limit_in_bytes")?,
            read("memory.usage_in_bytes")?,
        )
    };
    let limit: u64 = limit.parse().ok()?; // "max" (v2, unlimited) does not parse
    if limit >= UNLIMITED {
        return None;
    }
    let usage: u64 = usage.parse().ok()?;
    let inactive = inactive_file(&read("memory.stat").unwrap_or_default(), v2);
    Some(limit.saturating_sub(usage.saturating_sub(inactive)))
}

/// The inactive file bytes of a `memory.stat` (v1: `total_inactive_file`, the hierarchy's
/// as `memory.usage_in_bytes` is, else `inactive_file`; v2: `inactive_file`); 0 when absent.
fn inactive_file(stat: &str, v2: bool) -> u64 {
    let value = |key: &str| {
        stat.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
        })
    };
    let v = if v2 {
        value("inactive_file")
    } else {
        value("total_inactive_file").or_else(|| value("inactive_file"))
    };
    v.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    const GIB: u64 = 1 << 30;

    fn fake_proc(root: &Path, cgroup: &str, mountinfo: &str) {
        write(
            root,
            "proc/meminfo",
            "MemTotal: 25165824 kB\nMemAvailable: 20971520 kB\n",
        );
        write(root, "proc/self/cgroup", cgroup);
        write(root, "proc/self/mountinfo", mountinfo);
    }

    #[test]
    fn without_cgroups_it_is_mem_available() {
        let t = tempfile::tempdir().unwrap();
        fake_proc(t.path(), "0::/\n", "");
        assert_eq!(available_memory_in(t.path()), Some(20 * GIB));
    }

    #[test]
    fn v1_nested_groups_take_the_tightest_ancestor() {
        let t = tempfile::tempdir().unwrap();
        fake_proc(
            t.path(),
            "4:memory:/outer/inner\n3:cpu:/\n",
            "33 31 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n",
        );
        let g = "sys/fs/cgroup/memory";
        write(
            t.path(),
            &format!("{g}/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        write(
            t.path(),
            &format!("{g}/memory.usage_in_bytes"),
            "6442450944\n",
        );
        // The outer group allows 3 GiB with 1 GiB used; the inner one 8 GiB with 1.5 used.
        write(
            t.path(),
            &format!("{g}/outer/memory.limit_in_bytes"),
            &(3 * GIB).to_string(),
        );
        write(
            t.path(),
            &format!("{g}/outer/memory.usage_in_bytes"),
            &GIB.to_string(),
        );
        write(
            t.path(),
            &format!("{g}/outer/inner/memory.limit_in_bytes"),
            &(8 * GIB).to_string(),
        );
        write(
            t.path(),
            &format!("{g}/outer/inner/memory.usage_in_bytes"),
            &(3 * GIB / 2).to_string(),
        );
        assert_eq!(available_memory_in(t.path()), Some(2 * GIB));
    }

    #[test]
    fn v2_max_and_current_with_a_namespaced_mount_root() {
        let t = tempfile::tempdir().unwrap();
        // Inside a cgroup namespace the mount's root is the container's group.
        fake_proc(
            t.path(),
            "0::/ctr/app\n",
            "40 30 0:40 /ctr /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        let g = "sys/fs/cgroup";
        write(t.path(), &format!("{g}/memory.max"), &(4 * GIB).to_string());
        write(t.path(), &format!("{g}/memory.current"), &GIB.to_string());
        write(t.path(), &format!("{g}/app/memory.max"), "max\n");
        write(
            t.path(),
            &format!("{g}/app/memory.current"),
            &GIB.to_string(),
        );
        assert_eq!(available_memory_in(t.path()), Some(3 * GIB));
    }

    #[test]
    fn usage_above_the_limit_leaves_nothing_and_garbage_is_ignored() {
        let t = tempfile::tempdir().unwrap();
        fake_proc(
            t.path(),
            "garbage\n4:memory:/g\n",
            "nonsense line\n33 31 0:30 / /m rw - cgroup cgroup rw,memory\n",
        );
        write(t.path(), "m/g/memory.limit_in_bytes", &GIB.to_string());
        write(
            t.path(),
            "m/g/memory.usage_in_bytes",
            &(2 * GIB).to_string(),
        );
        assert_eq!(available_memory_in(t.path()), Some(0));
    }

    #[test]
    fn inactive_file_pages_count_as_free() {
        let t = tempfile::tempdir().unwrap();
        fake_proc(
            t.path(),
            "4:memory:/g\n",
            "33 31 0:30 / /m rw - cgroup cgroup rw,memory\n",
        );
        // v1: 4 GiB allowed, 3 used, of which 1.5 inactive file pages of the hierarchy
        // (the group's own 0.25 is not the figure usage_in_bytes is measured against).
        write(
            t.path(),
            "m/g/memory.limit_in_bytes",
            &(4 * GIB).to_string(),
        );
        write(
            t.path(),
            "m/g/memory.usage_in_bytes",
            &(3 * GIB).to_string(),
        );
        write(
            t.path(),
            "m/g/memory.stat",
            &format!(
                "cache 1\ninactive_file {}\nactive_file 7\ntotal_inactive_file {}\n",
                GIB / 4,
                3 * GIB / 2
            ),
        );
        assert_eq!(available_memory_in(t.path()), Some(5 * GIB / 2));
        // Without the hierarchical key, the group's own.
        write(
            t.path(),
            "m/g/memory.stat",
            &format!("inactive_file {}\n", GIB / 4),
        );
        assert_eq!(available_memory_in(t.path()), Some(GIB + GIB / 4));
        // v2: inactive_file; more inactive than used (a racy read) leaves the limit.
        let t = tempfile::tempdir().unwrap();
        fake_proc(
            t.path(),
            "0::/a\n",
            "40 30 0:40 / /c rw - cgroup2 cgroup2 rw\n",
        );
        write(t.path(), "c/a/memory.max", &(2 * GIB).to_string());
        write(t.path(), "c/a/memory.current", &GIB.to_string());
        write(
            t.path(),
            "c/a/memory.stat",
            &format!("anon 5\ninactive_file {}\n", GIB / 2),
        );
        assert_eq!(available_memory_in(t.path()), Some(3 * GIB / 2));
        write(
            t.path(),
            "c/a/memory.stat",
            &format!("inactive_file {}\n", 2 * GIB),
        );
        assert_eq!(available_memory_in(t.path()), Some(2 * GIB));
    }
}
