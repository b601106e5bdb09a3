//! The SwiGLU MLP `down(silu(gate x) * up x)`: dense layers, shared experts, and each
//! routed expert (read in place or handed over by the expert store); and gpt-oss' clamped
//! GLU expert over one interleaved gate/up projection (or, as llama.cpp's GGUF splits it,
//! separate gate and up projections).

use coli_core::ModelDir;
use coli_kernels::norm::{swiglu_clamped_inplace, swiglu_inplace};
use coli_kernels::routing::sigmoid;
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
    /// DeepSeek-V4's `swiglu_limit`: the gate clamped from above and up from both sides
    /// before the product (`None`: plain SwiGLU).
    pub limit: Option<f32>,
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
            limit: None,
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
        glu(g, u, self.limit);
        self.down_proj.forward(g, n, out);
    }
}

/// [`Mlp::forward`] on bias-free kernel matrices (a streamed expert): the same kernels, so
/// the same bits as reading the expert in place.
pub(crate) fn forward_mats(
    [gate_m, up_m, down_m]: [MatRef; 3],
    limit: Option<f32>,
    n: usize,
    xs: &[f32],
    s: &mut MlpScratch,
    out: &mut [f32],
) {
    let inter = gate_m.rows;
    let (g, u) = (&mut s.gate[..n * inter], &mut s.up[..n * inter]);
    coli_kernels::matmul::matmul_many([&gate_m, &up_m], xs, n, [&mut *g, &mut *u]);
    glu(g, u, limit);
    coli_kernels::matmul::matmul(&down_m, g, n, out);
}

/// SwiGLU in place, clamped when the MLP has a limit.
fn glu(gate: &mut [f32], up: &[f32], limit: Option<f32>) {
    match limit {
        None => swiglu_inplace(gate, up),
        Some(l) => swiglu_clamped_inplace(gate, up, l),
    }
}

/// gpt-oss' expert: the gate and up projections (see [`GluInput`]), then `down`
/// `[hidden, inter]`, all with biases:
/// `down((clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g))` with `g = min(gate, limit)`.
#[derive(Clone, Debug)]
pub struct GluExpert {
    /// The gate and up projections, with their biases.
    pub input: GluInput,
    /// `[hidden, intermediate]`, with a bias.
    pub down: Linear,
    /// The activation's constants.
    pub act: ClampedGlu,
}

/// How a gpt-oss expert holds its gate and up projections.
// One per expert, built at load; boxing would add a pointer chase per expert use.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum GluInput {
    /// One `[2 * intermediate, hidden]` projection whose even rows are the gate and odd
    /// rows the up projection (the release, and transformers).
    Interleaved(Linear),
    /// Two `[intermediate, hidden]` projections: llama.cpp's converter splits the
    /// interleaved rows into `ffn_gate_exps` and `ffn_up_exps`.
    Split {
        /// The gate's rows.
        gate: Linear,
        /// The up projection's rows.
        up: Linear,
    },
}

/// `swiglu_alpha` and `swiglu_limit` of gpt-oss.
#[derive(Clone, Copy, Debug)]
pub struct ClampedGlu {
    /// Sigmoid gain.
    pub alpha: f32,
    /// Clamp of the gate (above) and of up (both sides).
    pub limit: f32,
}

impl ClampedGlu {
    /// One output: `(clamp(up) + 1) * g * sigmoid(alpha g)`, `g = min(gate, limit)` (as
    /// `GptOssExperts._apply_gate`).
    fn one(&self, gate: f32, up: f32) -> f32 {
        let g = gate.min(self.limit);
        let u = up.clamp(-self.limit, self.limit);
        (u + 1.0) * (g * sigmoid(g * self.alpha))
    }

    /// `out[i]` over the interleaved pairs `(gate_i, up_i)` of `gate_up`.
    pub fn apply(&self, gate_up: &[f32], out: &mut [f32]) {
        assert_eq!(gate_up.len(), 2 * out.len());
        for (o, pair) in out.iter_mut().zip(gate_up.chunks_exact(2)) {
            *o = self.one(pair[0], pair[1]);
        }
    }

    /// `out[i]` over `gate[i]` and `up[i]` held apart.
    pub fn apply_split(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        assert!(gate.len() == out.len() && up.len() == out.len());
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = self.one(g, u);
        }
    }
}

impl GluExpert {
    /// Intermediate width.
    pub fn inter(&self) -> usize {
        self.down.cols
    }

    /// Its weight matrices, in the order the expert store reads them: the input
    /// projection(s), then down.
    pub fn linears(&self) -> Vec<&Linear> {
        match &self.input {
            GluInput::Interleaved(gu) => vec![gu, &self.down],
            GluInput::Split { gate, up } => vec![gate, up, &self.down],
        }
    }

    /// Its weight matrices, mutably, in the same order.
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match &mut self.input {
            GluInput::Interleaved(gu) => vec![gu, &mut self.down],
            GluInput::Split { gate, up } => vec![gate, up, &mut self.down],
        }
    }

    /// `out = expert(xs)` for `n` rows (`s.gate` holds the input projections, `s.up` the
    /// activation).
    pub(crate) fn forward(&self, n: usize, xs: &[f32], s: &mut MlpScratch, out: &mut [f32]) {
        let db = self.down.bias();
        // gpt-oss' unquantized experts are stored input-major: each use read in place
        // transposes them (placed models read them through the store, transposed once).
        match &self.input {
            GluInput::Interleaved(gu) => {
                let b = [gu.bias(), db];
                gu.with_mat(|m| {
                    self.down
                        .with_mat(|d| glu_forward_mats(&[m, d], &b, self.act, n, xs, s, out))
                })
            }
            GluInput::Split { gate, up } => {
                let b = [gate.bias(), up.bias(), db];
                gate.with_mat(|g| {
                    up.with_mat(|u| {
                        self.down
                            .with_mat(|d| glu_forward_mats(&[g, u, d], &b, self.act, n, xs, s, out))
                    })
                })
            }
        }
    }
}

/// [`GluExpert::forward`] on kernel matrices and their biases (a streamed expert): the same
/// kernels and the same bias additions, so the same bits as reading the expert in place.
/// `mats` is `[gate_up, down]` (interleaved) or `[gate, up, down]` (split), `biases` in
/// the same order.
pub(crate) fn glu_forward_mats(
    mats: &[MatRef],
    biases: &[Option<&[f32]>],
    act: ClampedGlu,
    n: usize,
    xs: &[f32],
    s: &mut MlpScratch,
    out: &mut [f32],
) {
    assert!(mats.len() == biases.len() && (mats.len() == 2 || mats.len() == 3));
    let (down_m, down_b) = (&mats[mats.len() - 1], biases[biases.len() - 1]);
    let inter = down_m.cols;
    let (gu, a) = (&mut s.gate[..n * 2 * inter], &mut s.up[..n * inter]);
    if mats.len() == 2 {
        coli_kernels::matmul::matmul(&mats[0], xs, n, gu);
        add_bias(gu, biases[0]);
        for (row, o) in gu.chunks_exact(2 * inter).zip(a.chunks_exact_mut(inter)) {
            act.apply(row, o);
        }
    } else {
        let (g, u) = gu.split_at_mut(n * inter);
        coli_kernels::matmul::matmul(&mats[0], xs, n, g);
        add_bias(g, biases[0]);
        coli_kernels::matmul::matmul(&mats[1], xs, n, u);
        add_bias(u, biases[1]);
        for ((g, u), o) in g
            .chunks_exact(inter)
            .zip(u.chunks_exact(inter))
            .zip(a.chunks_exact_mut(inter))
        {
            act.apply_split(g, u, o);
        }
    }
    coli_kernels::matmul::matmul(down_m, a, n, out);
    add_bias(out, down_b);
}

/// Adds `bias` to every row of `rows` (nothing when absent).
fn add_bias(rows: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in rows.chunks_exact_mut(b.len()) {
            for (o, &bi) in row.iter_mut().zip(b) {
                *o += bi;
            }
        }
    }
}

/// A routed expert: the SwiGLU most families use, or gpt-oss' clamped GLU.
// Experts live side by side in one Vec built at load; boxing the larger variant would add a
// pointer chase per expert for ~200 bytes saved each.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Expert {
    /// Gate, up and down projections.
    SwiGlu(Mlp),
    /// gpt-oss' gate and up projections (interleaved or split) and down, with biases.
    Glu(GluExpert),
}

impl Expert {
    /// Intermediate width.
    pub fn inter(&self) -> usize {
        match self {
            Expert::SwiGlu(m) => m.inter(),
            Expert::Glu(g) => g.inter(),
        }
    }

    /// Width of the `gate` scratch row it needs.
    pub(crate) fn gate_width(&self) -> usize {
        match self {
            Expert::SwiGlu(m) => m.inter(),
            Expert::Glu(g) => 2 * g.inter(),
        }
    }

    /// Its weight matrices, in the order the expert store reads them.
    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            Expert::SwiGlu(m) => vec![&m.gate_proj, &m.up_proj, &m.down_proj],
            Expert::Glu(g) => g.linears(),
        }
    }

    /// Its weight matrices, mutably (conversion re-points them).
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Expert::SwiGlu(m) => vec![&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj],
            Expert::Glu(g) => g.linears_mut(),
        }
    }

    /// `out = expert(xs)` for `n` rows.
    pub(crate) fn forward(&self, n: usize, xs: &[f32], s: &mut MlpScratch, out: &mut [f32]) {
        match self {
            Expert::SwiGlu(m) => m.forward(n, xs, s, out),
            Expert::Glu(g) => g.forward(n, xs, s, out),
        }
    }
}
