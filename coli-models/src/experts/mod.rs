//! Routed experts off the compute path: the store (reads, cache, prefetch), its cache
//! policy, and the routing history that pinning learns from.
//!
//! Nothing here knows the model's blocks: the store is built from per-layer expert
//! locations (`arch::placement` computes them from a loaded model), so the dependency
//! points one way, from the forward pass to the store.

mod buffers;
mod config;
mod io;
pub mod memory;
pub mod policy;
pub mod store;
pub mod usage;

pub use store::{
    available_memory, CacheSize, ExpertHandle, ExpertLocation, ExpertStore, MatrixLocation,
    Placement, Prefetch, ScaleKind, ScaleLocation, StoreConfig, StoreStats,
};
