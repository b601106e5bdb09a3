//! The routing history `.coli_usage` in a model directory: how often each routed expert
//! was chosen, summed over runs, so the next run can pin the hottest ones (`--pin GB`).
//!
//! Format (text, versioned): a first line `coli-usage 1`, then one line per
//! `(layer, expert)` with a nonzero count: `layer expert count`, sorted. A file that does
//! not parse is ignored (and replaced by the next merge); a directory that cannot be
//! written just keeps no history. Merges hold an exclusive `flock` on `.coli_usage.lock`
//! while they read, add and atomically replace the file, so concurrent runs add up.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The history's file name.
pub const USAGE_FILE: &str = ".coli_usage";
const HEADER: &str = "coli-usage 1";

/// Routing counts per `(layer, expert)`.
pub type Usage = BTreeMap<(usize, usize), u64>;

/// The history's path in `dir`.
pub fn usage_path(dir: &Path) -> PathBuf {
    coli_core::sidecar_path(dir, USAGE_FILE)
}

/// Parses a history; `None` if it is not a valid version-1 file.
pub fn parse(text: &str) -> Option<Usage> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut u = Usage::new();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let mut f = line.split(' ');
        let (l, e, n) = (f.next()?, f.next()?, f.next()?);
        if f.next().is_some() {
            return None;
        }
        let key = (l.parse().ok()?, e.parse().ok()?);
        let n: u64 = n.parse().ok()?;
        let slot = u.entry(key).or_insert(0);
        *slot = slot.checked_add(n)?;
    }
    Some(u)
}

/// Renders a history.
pub fn render(u: &Usage) -> String {
    let mut s = String::from(HEADER);
    s.push('\n');
    for (&(l, e), &n) in u {
        if n > 0 {
            s.push_str(&format!("{l} {e} {n}\n"));
        }
    }
    s
}

/// Reads `dir`'s history; empty when absent or corrupt.
pub fn read(dir: &Path) -> Usage {
    std::fs::read_to_string(usage_path(dir))
        .ok()
        .and_then(|t| parse(&t))
        .unwrap_or_default()
}

/// Adds `run` to `dir`'s history (under the lock; atomic replace).
pub fn merge(dir: &Path, run: &[(usize, usize, u64)]) -> std::io::Result<()> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(coli_core::sidecar_path(dir, ".coli_usage.lock"))?;
    // SAFETY: flock on a valid open descriptor; released when `lock` is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut u = read(dir);
    for &(l, e, n) in run {
        let slot = u.entry((l, e)).or_insert(0);
        *slot = slot.saturating_add(n);
    }
    let text = render(&u);
    coli_core::write::write_atomic(&usage_path(dir), |w| w.write_all(text.as_bytes()))
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// The hottest experts first (ties: lower layer, then lower expert), as many as fit in
/// `budget` bytes at `expert_bytes(layer)` each.
pub fn hottest(u: &Usage, budget: u64, expert_bytes: impl Fn(usize) -> u64) -> Vec<(usize, usize)> {
    let mut v: Vec<(&(usize, usize), &u64)> = u.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut used = 0u64;
    let mut out = Vec::new();
    for (&(l, e), _) in v {
        let b = expert_bytes(l);
        if b == 0 || used + b > budget {
            continue;
        }
        used += b;
        out.push((l, e));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn merges_add_up_and_corrupt_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        merge(dir.path(), &[(0, 3, 5), (1, 2, 1)]).unwrap();
        merge(dir.path(), &[(0, 3, 2), (2, 0, 7)]).unwrap();
        let u = read(dir.path());
        assert_eq!(u[&(0, 3)], 7);
        assert_eq!(u[&(1, 2)], 1);
        assert_eq!(u[&(2, 0)], 7);
        let text = std::fs::read_to_string(usage_path(dir.path())).unwrap();
        assert_eq!(text, "coli-usage 1\n0 3 7\n1 2 1\n2 0 7\n");
        for bad in [
            "",
            "coli-usage 2\n0 1 2\n",
            "coli-usage 1\n0 x 2\n",
            "coli-usage 1\n1 2\n",
        ] {
            std::fs::write(usage_path(dir.path()), bad).unwrap();
            assert!(read(dir.path()).is_empty(), "{bad:?}");
        }
        // A corrupt history is replaced by the next merge.
        merge(dir.path(), &[(4, 4, 4)]).unwrap();
        assert_eq!(
            read(dir.path()).into_iter().collect::<Vec<_>>(),
            vec![((4, 4), 4)]
        );
        // No temp files are left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp")), "{names:?}");
    }

    #[test]
    fn concurrent_merges_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::thread::scope(|s| {
            for t in 0..8 {
                let d = dir.path();
                s.spawn(move || {
                    for _ in 0..10 {
                        merge(d, &[(0, t % 2, 1), (1, 1, 2)]).unwrap();
                    }
                });
            }
        });
        let u = read(dir.path());
        assert_eq!(u[&(0, 0)] + u[&(0, 1)], 80);
        assert_eq!(u[&(1, 1)], 160);
    }

    #[test]
    fn pins_the_hottest_within_the_budget() {
        let u: Usage = [((0, 1), 9), ((0, 2), 3), ((1, 0), 9), ((1, 5), 1)]
            .into_iter()
            .collect();
        assert_eq!(hottest(&u, 30, |_| 10), vec![(0, 1), (1, 0), (0, 2)]);
        assert_eq!(hottest(&u, 19, |_| 10), vec![(0, 1)]);
    }

    proptest! {
        /// Any bytes: parse never panics; a rendered history parses back to itself.
        #[test]
        fn parse_is_total_and_round_trips(text in ".{0,200}", entries in proptest::collection::btree_map((0usize..100, 0usize..300), 1u64..1_000_000, 0..40)) {
            let _ = parse(&text);
            prop_assert_eq!(parse(&render(&entries)), Some(entries));
        }
    }
}
