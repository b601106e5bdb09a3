//! coli-kernels: pure compute, no I/O.
//!
//! Every kernel with a fast path has a scalar reference next to it that performs
//! the *same* floating-point operations in the same order, so the two agree bit
//! for bit (tested). Dot products use a fixed 16-lane accumulation with fused
//! multiply-add and a fixed halving tree at the end, whatever the instruction set.

pub mod alloc;
pub mod attention;
pub mod cpu;
pub mod deltanet;
pub mod dequant;
pub mod dot;
pub mod fast;
pub mod ggml_dot;
pub mod matmul;
pub mod norm;
pub mod qdot;
pub mod rope;
pub mod routing;
pub mod softmax;

pub use cpu::Isa;
pub use dot::WFormat;
pub use matmul::MatRef;
