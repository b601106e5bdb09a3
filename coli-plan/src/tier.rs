//! The one place a run's placement is decided: explicit flags first, then the saved
//! `coli tune` profile (with `auto_tier`), then `coli plan`'s cache size (with
//! `auto_tier`), then the defaults. `coli run`, `coli eval`, `coli tune` and the server
//! all go through here.

use std::path::Path;

use coli_models::experts::{CacheSize, Placement, Prefetch};

use crate::{PlanError, Result};

const GB: f64 = 1e9;

/// What the user asked for (`None` / `false`: not given).
#[derive(Clone, Debug, Default)]
pub struct PlacementFlags {
    /// `--cap N`: cached experts per layer.
    pub cap: Option<usize>,
    /// `--expert-cache GB|all|off`.
    pub expert_cache: Option<String>,
    /// `--direct`.
    pub direct: bool,
    /// `--prefetch on|layer|off`.
    pub prefetch: Option<Prefetch>,
    /// `--auto-tier`: apply the plan's cache size and the tuned profile.
    pub auto_tier: bool,
    /// `--pin GB` (0: none, or the profile's with `auto_tier`).
    pub pin_gb: f64,
}

fn bytes_of_gb(flag: &str, v: f64) -> Result<u64> {
    if v.is_finite() && v >= 0.0 {
        Ok((v * GB) as u64)
    } else {
        Err(PlanError::BadSetting(format!(
            "{flag} must be a non-negative number of GB, got {v}"
        )))
    }
}

/// The cache size `coli plan` gives this model at a 4096-token context (Auto when it has
/// no routed experts or cannot plan it).
pub fn planned_cache(dir: &Path) -> CacheSize {
    let req = crate::plan::PlanRequest {
        ram: None,
        ctx: 4096,
        kv_slots: 1,
    };
    match crate::plan::plan(dir, &req, false) {
        Ok(p) if p.moe_layers > 0 => CacheSize::Slots(p.cap_per_layer.max(1)),
        _ => CacheSize::Auto,
    }
}

/// The cache size the flags ask for.
fn cache_size(f: &PlacementFlags, dir: &Path) -> Result<CacheSize> {
    Ok(match (f.cap, f.expert_cache.as_deref()) {
        (Some(0), _) => return Err(PlanError::BadSetting("--cap must be at least 1".into())),
        (Some(n), _) => CacheSize::Slots(n),
        (None, None) if f.auto_tier => planned_cache(dir),
        (None, None) => CacheSize::Auto,
        (None, Some("all")) => CacheSize::Slots(usize::MAX),
        (None, Some("off")) => CacheSize::Off,
        (None, Some(v)) => {
            let x: f64 = v.parse().map_err(|_| {
                PlanError::BadSetting(format!(
                    "--expert-cache takes a number of GB, \"all\" or \"off\", got {v:?}"
                ))
            })?;
            CacheSize::Bytes(bytes_of_gb("--expert-cache", x)?)
        }
    })
}

/// The placement for a run over `dir`.
pub fn resolve(f: &PlacementFlags, dir: &Path) -> Result<Placement> {
    let profile = f
        .auto_tier
        .then(|| crate::tune::load_profile(dir))
        .flatten();
    let prefetch = f
        .prefetch
        .or_else(|| profile.as_ref().map(|p| p.settings.prefetch))
        .unwrap_or_default();
    let pin_bytes = match &profile {
        Some(prof) if f.pin_gb == 0.0 => (prof.settings.pin_gb * GB) as u64,
        _ => bytes_of_gb("--pin", f.pin_gb)?,
    };
    Ok(Placement {
        cache: cache_size(f, dir)?,
        direct: f.direct || profile.as_ref().is_some_and(|p| p.settings.direct),
        prefetch,
        pin_bytes,
    })
}

/// Worker threads: the explicit count, else (with `auto_tier`) the tuned profile's.
pub fn threads(explicit: Option<usize>, auto_tier: bool, dir: Option<&Path>) -> Option<usize> {
    explicit.or_else(|| {
        let dir = dir?;
        auto_tier
            .then(|| crate::tune::load_profile(dir))
            .flatten()
            .map(|p| p.settings.threads)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_flags_decide_and_bad_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let flags = |cap, cache: Option<&str>| PlacementFlags {
            cap,
            expert_cache: cache.map(str::to_string),
            ..PlacementFlags::default()
        };
        let p = resolve(&flags(Some(3), None), dir.path()).unwrap();
        assert_eq!(p.cache, CacheSize::Slots(3));
        assert_eq!(p.prefetch, Prefetch::On);
        let p = resolve(&flags(None, Some("1.5")), dir.path()).unwrap();
        assert_eq!(p.cache, CacheSize::Bytes(1_500_000_000));
        assert_eq!(
            resolve(&flags(None, Some("off")), dir.path())
                .unwrap()
                .cache,
            CacheSize::Off
        );
        for (cap, cache, needle) in [
            (Some(0), None, "--cap"),
            (None, Some("lots"), "--expert-cache"),
            (None, Some("-1"), "--expert-cache"),
        ] {
            let e = resolve(&flags(cap, cache), dir.path()).unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
        let pin = PlacementFlags {
            pin_gb: f64::NAN,
            ..PlacementFlags::default()
        };
        assert!(resolve(&pin, dir.path())
            .unwrap_err()
            .to_string()
            .contains("--pin"));
    }
}
