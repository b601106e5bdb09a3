//! The `coli` binary's tests as one test binary (one link instead of one per file).

mod cgroup;
mod chat_serve;
mod cli;
mod constrained;
mod drafts;
mod gguf;
mod planning;
