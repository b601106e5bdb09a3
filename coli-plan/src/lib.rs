//! coli-plan: what a model is and what it needs, from its files' headers alone.
//!
//! * [`analyze`]: every shard header read and validated (never the payload), every tensor
//!   classified through the family registry, totals by kind; cached in the model
//!   directory's `.coli_analysis.json` sidecar keyed on the files' sizes and mtimes.
//! * [`doctor`]: read-only readiness checks (`coli doctor [--deep]`).
//! * [`plan`]: memory, cache slots, projected hit rate, bottleneck and speed (`coli plan`).
//! * [`tier`]: the one place a run's placement is decided (flags, then the tuned
//!   profile, then the plan).
//! * [`tune`]: measured settings, token-checked, saved per machine/model/engine (`coli tune`).

pub mod analyze;
pub mod doctor;
mod error;
pub mod plan;
pub mod tier;
pub mod tune;

pub use analyze::{analyze, analyze_uncached, Analysis, CacheOutcome};
pub use error::{PlanError, Result};
