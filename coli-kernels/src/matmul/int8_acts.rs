//! The fast mode's matmul ([`crate::fast`]: int8 activations, not exact), on the row
//! blocks and scale rows of the exact path.

use std::cell::RefCell;

use super::{check, for_row_blocks, row_quads, with_scale_rows, MatRef, OutPtr};
use crate::dot::WFormat;
use crate::fast;

thread_local! {
    /// The fast mode's quantized activations (int8 rows, int4 rows), one per token; grow
    /// once per thread, then reused.
    static INT8_ACTS: RefCell<[Vec<fast::Int8Acts>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// The fast mode's matmul ([`crate::fast`], not exact): every token of `xs` quantized to
/// int8 once per weight format, then integer dot products. Returns `false`, computing
/// nothing, when a matrix is not one [`fast::takes`] or the activations hold a non-finite
/// value; the caller then runs the exact kernels.
pub fn matmul_many_int8_acts<const N: usize>(
    mats: [&MatRef; N],
    xs: &[f32],
    n_tok: usize,
    outs: [&mut [f32]; N],
) -> bool {
    for (m, out) in mats.iter().zip(outs.iter()) {
        check(m, xs, n_tok, out);
    }
    if !mats.iter().all(|m| fast::takes(m)) {
        return false;
    }
    INT8_ACTS.with(|cell| {
        // Re-entered (it is not): fresh buffers rather than a panic.
        let mut fresh = Default::default();
        let mut held = cell.try_borrow_mut();
        let [i8_acts, i4_acts]: &mut [Vec<fast::Int8Acts>; 2] = match held.as_deref_mut() {
            Ok(bufs) => bufs,
            Err(_) => &mut fresh,
        };
        let used = |fmt: WFormat| {
            if mats.iter().any(|m| m.fmt == fmt) {
                n_tok
            } else {
                0
            }
        };
        for (fmt, acts) in [(WFormat::I8, &mut *i8_acts), (WFormat::I4, &mut *i4_acts)] {
            let n = used(fmt);
            if acts.len() < n {
                acts.resize_with(n, Default::default);
            }
            let k = xs.len() / n_tok.max(1);
            if !acts[..n]
                .iter_mut()
                .zip(xs.chunks_exact(k.max(1)))
                .all(|(a, x)| a.quantize_into(fmt, x))
            {
                return false;
            }
        }
        let (i8_acts, i4_acts) = (&i8_acts[..used(WFormat::I8)], &i4_acts[..used(WFormat::I4)]);
        let ptrs = outs.map(|o| OutPtr(o.as_mut_ptr()));
        for_row_blocks(mats.map(|m| m.rows), |j, r0, r1| {
            let m = mats[j];
            let acts = if m.fmt == WFormat::I4 {
                &i4_acts
            } else {
                &i8_acts
            };
            rows_block_int8_acts(m, acts, r0, r1, ptrs[j])
        });
        true
    })
}

/// Rows `r0..r1` of the fast mode, four rows at a time, every token.
fn rows_block_int8_acts(m: &MatRef, acts: &[fast::Int8Acts], r0: usize, r1: usize, out: OutPtr) {
    let s = m.scales.expect("scaled matrix");
    if r0 >= r1 {
        return;
    }
    let k = m.cols;
    let cb = k.div_ceil(s.block_cols);
    let first = r0 / s.block_rows;
    let n_blocks = (r1 - 1) / s.block_rows + 1 - first;
    let put = |t: usize, r: usize, v: f32| {
        // SAFETY: t < n_tok and r < m.rows, inside `out`; rows r0..r1 belong to this task.
        unsafe { *out.0.add(t * m.rows + r) = v };
    };
    with_scale_rows(&s, cb, first, n_blocks, |all| {
        let scales = |r: usize| &all[(r / s.block_rows - first) * cb..][..cb];
        let rest = row_quads(m, r0, r1, |r, rows, next| {
            let sc = [scales(r), scales(r + 1), scales(r + 2), scales(r + 3)];
            // Three tokens at a time share each weight load (12 accumulators); the rows
            // that follow are prefetched during the first pass only.
            let mut t = 0;
            while t + 3 <= acts.len() {
                let nx = if t == 0 { next } else { &[] };
                let v = fast::dot_block(
                    rows,
                    sc,
                    s.block_cols,
                    [&acts[t], &acts[t + 1], &acts[t + 2]],
                    nx,
                );
                for (dt, row) in v.iter().enumerate() {
                    for (j, &val) in row.iter().enumerate() {
                        put(t + dt, r + j, val);
                    }
                }
                t += 3;
            }
            while t < acts.len() {
                let nx = if t == 0 { next } else { &[] };
                let v = fast::dot_rows(rows, sc, s.block_cols, &acts[t], nx);
                for (j, &val) in v.iter().enumerate() {
                    put(t, r + j, val);
                }
                t += 1;
            }
        });
        for r in rest..r1 {
            for (t, a) in acts.iter().enumerate() {
                put(
                    t,
                    r,
                    fast::dot_rows([m.row(r)], [scales(r)], s.block_cols, a, &[])[0],
                );
            }
        }
    })
}
