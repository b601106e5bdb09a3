//! `cargo xtask fast-int8`: how far the optional fast mode (`coli --fast-int8`, int8
//! activations on int8/int4 weights, see `coli_kernels::fast`) moves the tokens.
//!
//! For every oracle fixture, teacher-forced over its reference ids: the top-1 of the exact
//! engine and of the fast mode against `transformers`' (`tf_pred`), and the largest logit
//! difference between the two modes relative to the row's largest logit. Each fixture is
//! measured as stored and converted with `coli convert` (dense int8 + experts int8; dense
//! int8 + experts int4), which is where the fast mode has int8/int4 matrices to act on.
//! `transformers`' predictions are those of the stored weights, so a converted model's
//! exact column shows what the weight quantization costs and the fast column what the
//! activation rounding adds.

use std::path::Path;
use std::process::ExitCode;

use coli_kernels::fast;
use coli_models::convert::{convert, ConvertOptions, Target};
use coli_models::Session;
use coli_tests::{ids, Reference, TINY_FIXTURES};

/// One model's teacher-forced comparison.
struct Row {
    positions: usize,
    exact_agree: usize,
    fast_agree: usize,
    modes_agree: usize,
    max_rel_diff: f32,
}

fn logits(dir: &Path, seq: &[u32], fast_mode: bool) -> Result<(Vec<f32>, usize), String> {
    let model = coli_models::load(dir).map_err(|e| e.to_string())?;
    let vocab = model.info.vocab_size;
    fast::set_int8_activations(fast_mode);
    let mut s = Session::new(&model, seq.len());
    let out = s
        .forward(seq, true)
        .map(<[f32]>::to_vec)
        .map_err(|e| e.to_string());
    fast::set_int8_activations(false);
    Ok((out?, vocab))
}

fn argmaxes(l: &[f32], vocab: usize) -> Vec<u32> {
    l.chunks_exact(vocab)
        .map(coli_models::sampling::argmax)
        .collect()
}

fn measure(dir: &Path, seq: &[u32], tf: &[u32]) -> Result<Row, String> {
    let (exact, vocab) = logits(dir, seq, false)?;
    let (fast, _) = logits(dir, seq, true)?;
    let (e, f) = (argmaxes(&exact, vocab), argmaxes(&fast, vocab));
    let agree = |a: &[u32], b: &[u32]| a.iter().zip(b).filter(|(x, y)| x == y).count();
    let max_rel_diff = exact
        .chunks_exact(vocab)
        .zip(fast.chunks_exact(vocab))
        .map(|(a, b)| {
            let scale = a
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()))
                .max(f32::MIN_POSITIVE);
            a.iter()
                .zip(b)
                .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
                / scale
        })
        .fold(0.0f32, f32::max);
    Ok(Row {
        positions: tf.len(),
        exact_agree: agree(&e, tf),
        fast_agree: agree(&f, tf),
        modes_agree: agree(&e, &f),
        max_rel_diff,
    })
}

/// The report; fails only when a fixture cannot be measured at all.
pub fn fast_int8() -> ExitCode {
    println!(
        "fast mode (--fast-int8): int8 activations on int8/int4 weights, {}",
        if fast::vnni_available() {
            "AVX-512 VNNI kernels"
        } else if fast::avx2_available() {
            "AVX2 kernels"
        } else {
            "this CPU has neither VNNI nor AVX2: the scalar definition (same numbers, slowly)"
        }
    );
    println!("teacher-forced top-1 agreement with transformers (tf_pred); exact vs fast; largest logit difference between the modes, relative to the row's largest logit\n");
    println!(
        "{:<34} {:<10} {:>9} {:>9} {:>11} {:>10}",
        "fixture", "weights", "exact", "fast", "exact=fast", "max diff"
    );
    let tmp = std::env::temp_dir().join(format!("coli-fast-int8-{}", std::process::id()));
    let mut totals = [[0usize; 3]; 3];
    let mut failed = false;
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        let (seq, tf) = (r.ids(), ids(&r.json["tf_pred"]));
        let variants = [
            ("stored", None),
            ("int8", Some(Target::Int8)),
            ("int4", Some(Target::Int4)),
        ];
        for (v, (label, target)) in variants.into_iter().enumerate() {
            let dir = match target {
                None => r.dir.clone(),
                Some(experts) => {
                    let out = tmp.join(format!("{name}-{label}"));
                    let opts = ConvertOptions {
                        experts,
                        dense: Target::Int8,
                        shard_bytes: 1 << 30,
                    };
                    if let Err(e) = convert(&r.dir, &out, &opts, |_, _| {}) {
                        println!("{name:<34} {label:<10} not convertible: {e}");
                        continue;
                    }
                    out
                }
            };
            match measure(&dir, &seq, &tf) {
                Ok(row) => {
                    let n = row.positions;
                    println!(
                        "{name:<34} {label:<10} {:>5}/{n:<3} {:>5}/{n:<3} {:>7}/{n:<3} {:>10.2e}",
                        row.exact_agree, row.fast_agree, row.modes_agree, row.max_rel_diff
                    );
                    totals[v][0] += n;
                    totals[v][1] += row.exact_agree;
                    totals[v][2] += row.fast_agree;
                }
                Err(e) => {
                    println!("{name:<34} {label:<10} failed: {e}");
                    failed = true;
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    println!();
    for (label, [n, e, f]) in ["stored", "int8", "int4"].iter().zip(totals) {
        let pct = |k: usize| 100.0 * k as f64 / n.max(1) as f64;
        println!(
            "{label:<6} weights: {n} positions, exact {:.1}% / fast {:.1}% agree with transformers",
            pct(e),
            pct(f)
        );
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
