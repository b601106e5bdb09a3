//! coli's cross-crate integration tests as one binary: each file here was its own test
//! binary, and each linked coli and its generic code anew (about 40 s of release build apiece).
//! `no_alloc` stays apart: it installs a global allocator that counts.

mod architecture;
mod batching;
mod chat_templates;
mod config_aliases;
mod convert;
mod deepseek_v4;
mod drafts;
mod fuzz_seeded;
mod gpt_oss;
mod int4_scales;
mod mtp;
mod oracle;
mod placement;
mod qwen3_next;
mod rings;
mod schema_generation;
mod store_failures;
mod tool_calls;
