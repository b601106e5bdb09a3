//! `coli tune`: measure candidate settings on a calibration prompt, keep one only if its
//! tokens equal the baseline's and it is faster by a minimum gain, save the profile.
//!
//! Profiles live in `$XDG_CONFIG_HOME/coli/tuning/<fingerprint>.json` (else
//! `~/.config/coli/tuning`), written atomically. The fingerprint covers the CPU model, the
//! model's files (size and mtime of config, index and shards) and the engine version, so a
//! profile never applies to another machine, model revision or coli build.

use std::path::{Path, PathBuf};

use coli_models::experts::{CacheSize, Placement, Prefetch};
use coli_models::{Sampler, SamplingParams, Session};
use serde::{Deserialize, Serialize};

use crate::{PlanError, Result};

/// Profile format version.
pub const PROFILE_VERSION: u32 = 1;

/// Settings a profile can hold (the `coli run` flags they stand for).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// `--threads`.
    pub threads: usize,
    /// `--prefetch on|layer|off`.
    pub prefetch: Prefetch,
    /// `--direct`.
    pub direct: bool,
    /// `--pin GB`: the cache split between pinned (historically hottest) and LRU experts.
    #[serde(default)]
    pub pin_gb: f64,
}

/// A saved tuning result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    /// Format version.
    pub version: u32,
    /// What it applies to.
    pub fingerprint: String,
    /// The chosen settings (the baseline's when nothing won).
    pub settings: Settings,
    /// Baseline decode tok/s.
    pub baseline_tok_s: f64,
    /// The chosen settings' decode tok/s.
    pub tuned_tok_s: f64,
}

/// One measured candidate.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    /// Settings.
    pub settings: Settings,
    /// Decode tok/s (best of the runs).
    pub tok_s: f64,
    /// Same tokens as the baseline.
    pub same_tokens: bool,
}

/// FNV-1a over the parts.
fn fnv(parts: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0u8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// CPU model name from /proc/cpuinfo.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into())
}

/// The fingerprint of (this CPU, this model's files, this engine).
pub fn fingerprint(dir: &Path) -> Result<String> {
    let mut parts = vec![cpu_model(), env!("CARGO_PKG_VERSION").to_string()];
    for f in coli_core::model_files(dir)? {
        let m = std::fs::metadata(&f).map_err(|source| PlanError::Io {
            path: f.clone(),
            source,
        })?;
        use std::os::unix::fs::MetadataExt;
        parts.push(format!(
            "{} {} {}.{}",
            f.display(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ));
    }
    Ok(fnv(&parts))
}

/// Where profiles are kept.
pub fn profile_dir() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from(".config"))
        .join("coli/tuning")
}

/// The saved profile for this machine, model and engine, if any (a corrupt one is ignored).
pub fn load_profile(dir: &Path) -> Option<Profile> {
    let fp = fingerprint(dir).ok()?;
    let text = std::fs::read(profile_dir().join(format!("{fp}.json"))).ok()?;
    let p: Profile = serde_json::from_slice(&text).ok()?;
    (p.version == PROFILE_VERSION && p.fingerprint == fp).then_some(p)
}

/// Runs the calibration once with `s`: generated ids and decode tok/s.
fn trial(
    dir: &Path,
    s: &Settings,
    cache: CacheSize,
    prompt: &[u32],
    tokens: usize,
) -> Result<(Vec<u32>, f64)> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(s.threads)
        .build()
        .map_err(|e| PlanError::BadSetting(format!("{} threads: {e}", s.threads)))?;
    pool.install(|| {
        let mut m = coli_models::load(dir)?;
        let p = Placement {
            cache,
            direct: s.direct,
            prefetch: s.prefetch,
            pin_bytes: (s.pin_gb * 1e9) as u64,
        };
        m.place_experts(dir, &p)?;
        let mut session = Session::new(&m, prompt.len() + tokens);
        let mut sampler = Sampler::new(SamplingParams::default());
        let g = session.generate(prompt, tokens, &mut sampler, &[], |_| {})?;
        let st = &g.stats;
        Ok((
            g.generated_ids,
            st.decode_tokens as f64 / st.decode_s.max(1e-9),
        ))
    })
}

/// The trial to adopt: the fastest with the baseline's tokens that beats the baseline
/// (trial 0) by `min_gain`; else the baseline.
pub fn choose(trials: &[Trial], min_gain: f64) -> usize {
    let base = trials.first().map_or(0.0, |t| t.tok_s);
    trials
        .iter()
        .enumerate()
        .filter(|(_, t)| t.same_tokens && t.tok_s >= base * (1.0 + min_gain))
        .max_by(|a, b| a.1.tok_s.total_cmp(&b.1.tok_s))
        .map_or(0, |(i, _)| i)
}

/// Measures the candidates (best of `runs` each, interleaved), disqualifies any whose
/// tokens differ from the baseline's, and keeps the fastest only if it beats the baseline
/// by `min_gain` (e.g. 0.05). Saves and returns the profile with every trial.
pub fn tune(
    dir: &Path,
    cache: CacheSize,
    prompt: &[u32],
    tokens: usize,
    runs: usize,
    min_gain: f64,
    mut progress: impl FnMut(&str),
) -> Result<(Profile, Vec<Trial>)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let baseline = Settings {
        threads: cores,
        prefetch: Prefetch::On,
        direct: false,
        pin_gb: 0.0,
    };
    // Cache split: with a routing history, also try pinning the hottest experts in a
    // quarter or a half of the cache (the rest stays LRU).
    let mut pins = vec![0.0];
    if let (CacheSize::Slots(cap), false) =
        (cache, coli_models::experts::usage::read(dir).is_empty())
    {
        if let Ok((a, _)) = crate::analyze(dir) {
            let cache_gb =
                (cap as u64 * a.expert_layers.len() as u64 * a.max_expert_bytes) as f64 / 1e9;
            pins.extend([cache_gb / 4.0, cache_gb / 2.0]);
        }
    }
    let mut candidates = vec![baseline.clone()];
    for threads in [1, cores] {
        for prefetch in Prefetch::ALL {
            for direct in [false, true] {
                for &pin_gb in &pins {
                    let c = Settings {
                        threads,
                        prefetch,
                        direct,
                        pin_gb,
                    };
                    if !candidates.contains(&c) {
                        candidates.push(c);
                    }
                }
            }
        }
    }
    let mut best_rate = vec![0.0f64; candidates.len()];
    let mut ids: Vec<Option<Vec<u32>>> = vec![None; candidates.len()];
    for r in 0..runs.max(1) {
        for (i, c) in candidates.iter().enumerate() {
            progress(&format!("run {}/{}: {c:?}", r + 1, runs.max(1)));
            let (got, rate) = trial(dir, c, cache, prompt, tokens)?;
            best_rate[i] = best_rate[i].max(rate);
            ids[i].get_or_insert(got);
        }
    }
    let base_ids = ids[0].clone().unwrap_or_default();
    let trials: Vec<Trial> = candidates
        .iter()
        .zip(&best_rate)
        .zip(&ids)
        .map(|((c, &r), got)| Trial {
            settings: c.clone(),
            tok_s: r,
            same_tokens: got.as_ref() == Some(&base_ids),
        })
        .collect();
    let base_rate = best_rate[0];
    let winner = &trials[choose(&trials, min_gain)];
    let profile = Profile {
        version: PROFILE_VERSION,
        fingerprint: fingerprint(dir)?,
        settings: winner.settings.clone(),
        baseline_tok_s: base_rate,
        tuned_tok_s: winner.tok_s,
    };
    let path = profile_dir().join(format!("{}.json", profile.fingerprint));
    std::fs::create_dir_all(profile_dir()).map_err(|source| PlanError::Io {
        path: profile_dir(),
        source,
    })?;
    let bytes = serde_json::to_vec_pretty(&profile)?;
    coli_core::write::write_atomic(&path, |w| {
        use std::io::Write;
        w.write_all(&bytes)
    })?;
    Ok((profile, trials))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(tok_s: f64, same_tokens: bool) -> Trial {
        Trial {
            settings: Settings {
                threads: 1,
                prefetch: Prefetch::On,
                direct: false,
                pin_gb: 0.0,
            },
            tok_s,
            same_tokens,
        }
    }

    #[test]
    fn faster_but_different_tokens_or_too_small_a_gain_loses() {
        // A candidate with other tokens never wins, however fast.
        assert_eq!(
            choose(&[t(10.0, true), t(50.0, false), t(10.4, true)], 0.05),
            0
        );
        // 4% is below a 5% minimum gain; 6% is above.
        assert_eq!(choose(&[t(10.0, true), t(10.4, true)], 0.05), 0);
        assert_eq!(
            choose(&[t(10.0, true), t(10.6, true), t(10.5, true)], 0.05),
            1
        );
    }
}
