//! Defaults the family configs share for keys `config.json` may omit (serde's
//! `default = "…"` needs a function path).

/// `1`.
pub(crate) fn one() -> usize {
    1
}

/// `3` (`first_k_dense_replace` of DeepSeek-V3 and GLM-5).
pub(crate) fn three() -> usize {
    3
}

/// `1.0`.
pub(crate) fn one_f64() -> f64 {
    1.0
}

/// `true`.
pub(crate) fn yes() -> bool {
    true
}
