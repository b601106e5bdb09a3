//! The SwiGLU MLP `down(silu(gate x) * up x)`: dense layers, shared experts, and each
//! routed expert (read in place or handed over by the expert store).

use coli_core::ModelDir;
use coli_kernels::norm::swiglu_inplace;
use coli_kernels::MatRef;

use super::scratch::{grow, MlpScratch};
use crate::error::Result;
use crate::weights::Linear;

/// A SwiGLU MLP: `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `[intermediate, hidden]`.
    pub gate_proj: Linear,
    /// `[intermediate, hidden]`.
    pub up_proj: Linear,
    /// `[hidden, intermediate]`.
    pub down_proj: Linear,
}

impl Mlp {
    /// An MLP from the full names of its three projections.
    pub fn load(
        dir: &ModelDir,
        [gate, up, down]: [&str; 3],
        hidden: usize,
        inter: usize,
        bias: bool,
    ) -> Result<Mlp> {
        Ok(Mlp {
            gate_proj: Linear::load_prefixed(dir, gate, inter, hidden, bias)?,
            up_proj: Linear::load_prefixed(dir, up, inter, hidden, bias)?,
            down_proj: Linear::load_prefixed(dir, down, hidden, inter, bias)?,
        })
    }

    /// `{prefix}.{gate,up,down}_proj` without biases.
    pub fn load_swiglu(dir: &ModelDir, prefix: &str, hidden: usize, inter: usize) -> Result<Mlp> {
        let names = ["gate_proj", "up_proj", "down_proj"].map(|p| format!("{prefix}.{p}"));
        Mlp::load(
            dir,
            names.each_ref().map(String::as_str),
            hidden,
            inter,
            false,
        )
    }

    /// Intermediate width.
    pub fn inter(&self) -> usize {
        self.gate_proj.rows
    }

    /// Sizes the intermediates for `n` rows.
    pub(crate) fn reserve(&self, s: &mut MlpScratch, n: usize) {
        grow(&mut s.gate, n * self.inter());
        grow(&mut s.up, n * self.inter());
    }

    /// `out = down(silu(gate xs) * up xs)` for `n` rows.
    pub(crate) fn forward(&self, n: usize, xs: &[f32], s: &mut MlpScratch, out: &mut [f32]) {
        let inter = self.inter();
        let (g, u) = (&mut s.gate[..n * inter], &mut s.up[..n * inter]);
        Linear::forward_group([&self.gate_proj, &self.up_proj], xs, n, [&mut *g, &mut *u]);
        swiglu_inplace(g, u);
        self.down_proj.forward(g, n, out);
    }
}

/// [`Mlp::forward`] on bias-free kernel matrices (a streamed expert): the same kernels, so
/// the same bits as reading the expert in place.
pub(crate) fn forward_mats(
    [gate_m, up_m, down_m]: [MatRef; 3],
    n: usize,
    xs: &[f32],
    s: &mut MlpScratch,
    out: &mut [f32],
) {
    let inter = gate_m.rows;
    let (g, u) = (&mut s.gate[..n * inter], &mut s.up[..n * inter]);
    coli_kernels::matmul::matmul_many([&gate_m, &up_m], xs, n, [&mut *g, &mut *u]);
    swiglu_inplace(g, u);
    coli_kernels::matmul::matmul(&down_m, g, n, out);
}
