//! Drafting with the checkpoint's MTP layer (DeepSeek-V3, GLM-4.5, GLM-5): the layer's
//! logits against `transformers`' `MtpModel` (fixtures `deepseek_v3_mtp`, `glm4_moe_mtp`) or,
//! for GLM-5 whose layer `MtpModel` cannot wrap, the same forward built by hand from
//! transformers' `GlmMoeDsaDecoderLayer` (`glm5_mtp`; all built by oracle/generate.py), the drafts the session makes against the layer read teacher-forced,
//! and the output with MTP drafts against the output without, token for token.

use coli_models::mtp_drafts::teacher_forced;
use coli_models::sampling::argmax;
use coli_models::session::GenStats;
use coli_models::{Sampler, SamplingParams, Session, Transformer};
use coli_tests::{checks, compare_logits, floats, ids, Reference, ORACLE_TOLERANCE};

const MTP_FIXTURES: [&str; 3] = ["deepseek_v3_mtp", "glm4_moe_mtp", "glm5_mtp"];

fn f32s(path: &std::path::Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn mtp_logits_match_transformers() {
    for name in MTP_FIXTURES {
        // The main model first: the MTP tensors must not disturb it.
        checks::oracle(name).unwrap();
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        assert!(model.mtp.is_some(), "{name}: MTP layer not loaded");
        assert!(
            model.info.notes.is_empty(),
            "{name}: {:?}",
            model.info.notes
        );
        let got = teacher_forced(&model, &r.ids()).unwrap().unwrap();
        let want = f32s(&r.dir.join("mtp_logits.bin"));
        let margins = floats(&r.json["mtp_top2_margin"]);
        compare_logits(name, &got, &want, &margins, r.vocab(), ORACLE_TOLERANCE).unwrap();
        let pred: Vec<u32> = got.chunks_exact(r.vocab()).map(argmax).collect();
        assert_eq!(pred, ids(&r.json["mtp_pred"]), "{name}");
    }
}

/// A fixture whose checkpoint holds only part of an MTP layer (the decoy other fixtures
/// carry) loads without it and says so.
#[test]
fn an_incomplete_mtp_layer_is_left_out_with_a_note() {
    for name in ["deepseek_v3_group_yarn", "glm5_dsa_shared_group_yarn"] {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        assert!(model.mtp.is_none(), "{name}");
        let layer = format!("model.layers.{}", model.info.n_layers);
        assert!(
            model.info.notes.iter().any(|n| n.contains(&layer)
                && n.contains("incomplete")
                && n.contains("drafting by MTP is off")),
            "{name}: {:?}",
            model.info.notes
        );
    }
}

/// `Engine::open_drafting` keeps the layer only where it drafts: dropped for `Off`, and for
/// `Auto` when the experts are streamed; copied to RAM for `On`, with the same logits as
/// the mapped layer `Engine::open` keeps.
#[test]
fn the_engine_keeps_the_mtp_layer_only_where_it_drafts() {
    use coli_models::experts::{CacheSize, Placement};
    use coli_models::{Engine, MtpDrafting};
    let streamed = Placement {
        cache: CacheSize::Slots(1),
        ..Placement::default()
    };
    for name in MTP_FIXTURES {
        let r = Reference::load(name);
        let open = |p: &Placement, m| Engine::open_drafting(&r.dir, p, m).unwrap();
        let has = |e: &Engine| e.model().mtp.is_some();
        let d = Placement::default();
        assert!(has(&open(&d, MtpDrafting::Auto)), "{name}");
        assert!(!has(&open(&d, MtpDrafting::Off)), "{name}");
        assert!(!has(&open(&streamed, MtpDrafting::Auto)), "{name}");
        let on = open(&streamed, MtpDrafting::On);
        let mapped = Engine::open(&r.dir, &streamed).unwrap();
        assert!(has(&mapped) && !mapped.mtp_by_default(), "{name}");
        let bits = |e: &Engine| {
            let l = teacher_forced(e.model(), &r.ids()).unwrap().unwrap();
            l.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(bits(&on), bits(&mapped), "{name}");
    }
}

/// The generated tokens, the stats and the MTP drafts made (position, token).
fn generate_logged(
    model: &Transformer,
    prompt: &[u32],
    n: usize,
    temperature: f32,
    mtp_depth: usize,
) -> (Vec<u32>, GenStats, Vec<(usize, u32)>) {
    let mut s = Session::new(model, prompt.len() + n);
    if mtp_depth > 0 {
        assert!(s.enable_mtp());
        let d = s.mtp.as_mut().unwrap();
        d.depth = mtp_depth;
        d.log = Some(Vec::new());
    }
    let mut sampler = Sampler::new(SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        seed: 9,
    });
    let g = s.generate(prompt, n, &mut sampler, &[], |_| {}).unwrap();
    let log = s.mtp.and_then(|d| d.log).unwrap_or_default();
    (g.generated_ids, g.stats, log)
}

fn generate(
    model: &Transformer,
    prompt: &[u32],
    n: usize,
    temperature: f32,
    mtp_depth: usize,
) -> (Vec<u32>, GenStats) {
    let (ids, stats, _) = generate_logged(model, prompt, n, temperature, mtp_depth);
    (ids, stats)
}

#[test]
fn mtp_drafts_never_change_the_output() {
    for name in MTP_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let prompt = &r.ids()[..8];
        for temperature in [0.0, 1.0] {
            let (plain, _) = generate(&model, prompt, 28, temperature, 0);
            for depth in [1, 2, 4] {
                let (drafted, st) = generate(&model, prompt, 28, temperature, depth);
                assert_eq!(drafted, plain, "{name} t={temperature} depth {depth}");
                assert!(st.draft_forwards > 0, "{name}: no MTP draft was verified");
            }
        }
    }
}

/// The MTP back-off as documented on `MtpDrafts::refused`: drafts refused whole in a row,
/// and the steps still to sit out.
#[derive(Default)]
struct Backoff {
    refused: u32,
    rest: usize,
}

/// The depth-1 drafts of a generation whose tokens sit at `seq[first..end]`, by the rule
/// below, from the teacher-forced `guesses` over `seq`; and how many are kept. `backoff`
/// carries the layer's back-off between the turns of one session.
fn expected_drafts(
    model: &Transformer,
    guesses: &[f32],
    seq: &[u32],
    (first, end): (usize, usize),
    backoff: &mut Backoff,
) -> (Vec<(usize, u32)>, usize) {
    let v = model.info.vocab_size;
    let (mut want, mut accepted) = (Vec::new(), 0);
    let mut p = first;
    // A step at p emits seq[p]; it drafts only while a drafted token could be kept and
    // still leave room for the token its row samples (two more after seq[p]).
    while p + 2 < end {
        if backoff.rest > 0 {
            backoff.rest -= 1;
            p += 1;
            continue;
        }
        let d = argmax(&guesses[(p - 1) * v..p * v]);
        want.push((p + 1, d));
        if seq[p + 1] == d {
            accepted += 1;
            backoff.refused = 0;
            p += 2;
        } else {
            // From the second refusal in a row: sit out 1, 3, 7, 15, then 31 steps.
            backoff.refused += 1;
            if backoff.refused >= 2 {
                backoff.rest = [1, 3, 7, 15, 31][(backoff.refused as usize - 2).min(4)];
            }
            p += 1;
        }
    }
    (want, accepted)
}

/// A second turn on the same session (its prompt fed after the first turn's history, whose
/// last token was emitted but never fed): the layer pairs the history's last state with
/// the new prompt's first token and drafts as over one sequence. A history cut below what
/// the layer has read keeps one position less (the layer needs that position's state
/// again); fed from there, the next turn drafts what the layer guesses over the new
/// sequence, and the output stays plain decoding's.
#[test]
fn later_turns_draft_from_the_whole_history_and_after_a_cut() {
    let greedy = || Sampler::new(SamplingParams::default());
    for name in MTP_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let ids = r.ids();
        let (p1, p2) = (&ids[..8], &ids[8..14]);
        let mut s = Session::new(&model, 80);
        assert!(s.enable_mtp());
        s.mtp.as_mut().unwrap().log = Some(Vec::new());
        let g1 = s.generate(p1, 12, &mut greedy(), &[], |_| {}).unwrap();
        let mut seq: Vec<u32> = p1.to_vec();
        seq.extend_from_slice(&g1.generated_ids[..11]);
        assert_eq!(s.len(), seq.len());
        let g2 = s.generate(p2, 12, &mut greedy(), &[], |_| {}).unwrap();
        let turn2 = seq.len() + p2.len();
        seq.extend_from_slice(p2);
        seq.extend_from_slice(&g2.generated_ids);
        let guesses = teacher_forced(&model, &seq).unwrap().unwrap();
        let mut backoff = Backoff::default();
        let (mut want, _) = expected_drafts(&model, &guesses, &seq, (8, 20), &mut backoff);
        want.extend(expected_drafts(&model, &guesses, &seq, (turn2, turn2 + 12), &mut backoff).0);
        let log = s.mtp.as_ref().unwrap().log.clone().unwrap();
        assert_eq!(log, want, "{name}");
        // Cut back to 10 positions, into what the layer has read: 9 are kept. Position 9
        // is fed again with the third turn's prompt.
        let mut plain = Session::new(&model, 80);
        plain.generate(p1, 12, &mut greedy(), &[], |_| {}).unwrap();
        plain.generate(p2, 12, &mut greedy(), &[], |_| {}).unwrap();
        assert_eq!(plain.truncate(10), 10);
        assert_eq!(s.truncate(10), 9, "{name}");
        let p3 = [&seq[9..10], &ids[20..24]].concat();
        // Long enough to outlast the longest back-off.
        let g3 = s.generate(&p3, 40, &mut greedy(), &[], |_| {}).unwrap();
        let want3 = plain
            .generate(&ids[20..24], 40, &mut greedy(), &[], |_| {})
            .unwrap();
        assert_eq!(g3.generated_ids, want3.generated_ids, "{name}");
        assert!(
            g3.stats.draft_proposed > 0,
            "{name}: no drafts after the cut"
        );
        let mut seq3 = seq[..10].to_vec();
        seq3.extend_from_slice(&ids[20..24]);
        seq3.extend_from_slice(&g3.generated_ids);
        let guesses3 = teacher_forced(&model, &seq3).unwrap().unwrap();
        want.extend(expected_drafts(&model, &guesses3, &seq3, (14, 54), &mut backoff).0);
        let log = s.mtp.as_ref().unwrap().log.clone().unwrap();
        assert_eq!(log, want, "{name}: drafts after the cut");
    }
}

/// With one draft per step, the session drafts at position `p` (the token at `p` known)
/// the layer's most likely token from the state at `p - 1`: replaying that rule over the
/// final sequence with the teacher-forced logits gives the same proposals and acceptances.
#[test]
fn session_drafts_are_the_layers_teacher_forced_guesses() {
    for name in MTP_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let prompt = &r.ids()[..8];
        let (out, st, log) = generate_logged(&model, prompt, 28, 0.0, 1);
        let seq: Vec<u32> = prompt.iter().chain(&out).copied().collect();
        let guesses = teacher_forced(&model, &seq).unwrap().unwrap();
        let (want, accepted) = expected_drafts(
            &model,
            &guesses,
            &seq,
            (prompt.len(), seq.len()),
            &mut Backoff::default(),
        );
        assert_eq!(log, want, "{name}");
        assert_eq!(
            (st.draft_proposed, st.drafted_tokens),
            (want.len(), accepted),
            "{name}"
        );
    }
}

/// A copy of fixture `name` with the bytes of `tensors` zeroed.
fn with_zeroed(name: &str, tensors: &[&str], out: &std::path::Path) {
    let r = Reference::load(name);
    r.copy_files_to(out);
    let path = out.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    for t in tensors {
        let off = &header[*t]["data_offsets"];
        let (a, b) = (
            off[0].as_u64().unwrap() as usize,
            off[1].as_u64().unwrap() as usize,
        );
        bytes[8 + n + a..8 + n + b].fill(0);
    }
    std::fs::write(&path, bytes).unwrap();
}

/// Drafts that are right: with the final norms (the main model's and the MTP layer's)
/// zeroed, the main model's logits are all equal (greedy picks token 0 every time) and so are the MTP layer's (it drafts 0). Every
/// draft is kept, several a step at depth > 1, and the output is still the plain one.
#[test]
fn accepted_mtp_drafts_keep_the_output() {
    for name in MTP_FIXTURES {
        let tmp = tempfile::tempdir().unwrap();
        let zeroed = [
            "model.norm.weight",
            "model.layers.2.shared_head.norm.weight",
        ];
        with_zeroed(name, &zeroed, tmp.path());
        let model = coli_models::load(tmp.path()).unwrap();
        let prompt = &Reference::load(name).ids()[..8];
        let (plain, _) = generate(&model, prompt, 20, 0.0, 0);
        assert!(plain.iter().all(|&t| t == 0), "{plain:?}");
        for depth in [1, 2, 4] {
            let (drafted, st) = generate(&model, prompt, 20, 0.0, depth);
            assert_eq!(drafted, plain, "{name} depth {depth}");
            assert_eq!(st.drafted_tokens, st.draft_proposed, "{name} depth {depth}");
            // Each forward verified `depth` drafts, the last one perhaps fewer (the end).
            assert!(
                st.drafted_tokens + depth > depth * st.draft_forwards,
                "{name} depth {depth}: {} forwards verified {} drafts",
                st.draft_forwards,
                st.drafted_tokens
            );
        }
    }
}

/// Drafts at depth 4 (the layer run on its own pre-norm output, one new row per draft)
/// against an independent implementation of vLLM's recursive MTP drafting
/// (oracle/generate.py `mtp_chain_rows`): the history `ids[..p]` fed, `ids[p]` next.
#[test]
fn recursive_drafts_match_the_reference_chain() {
    for name in MTP_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let ids = r.ids();
        let chains = r.json["mtp_chain"].as_array().expect("mtp_chain");
        assert_eq!(chains.len(), 3);
        for c in chains {
            let p = c["p"].as_u64().unwrap() as usize;
            let want = coli_tests::ids(&c["drafts"]);
            let mut s = Session::new(&model, ids.len());
            assert!(s.enable_mtp());
            s.mtp.as_mut().unwrap().depth = want.len();
            // The history in two forwards, as generation feeds it (prompt, then a token).
            s.forward(&ids[..p - 1], false).unwrap();
            s.forward(&ids[p - 1..p], false).unwrap();
            assert_eq!(s.mtp_draft(ids[p], 8).unwrap(), want, "{name} p={p}");
            // Asked for fewer, it stops early: the chain's first tokens.
            let mut s2 = Session::new(&model, ids.len());
            assert!(s2.enable_mtp());
            s2.mtp.as_mut().unwrap().depth = want.len();
            s2.forward(&ids[..p], false).unwrap();
            assert_eq!(s2.mtp_draft(ids[p], 2).unwrap(), want[..2], "{name} p={p}");
        }
    }
}

/// The first three tokens and their probability.
type Cell = ([u32; 3], f64);

/// The top four tokens of a logits row and their probabilities at temperature 1 over those
/// four (what top-k 4 samples from), in f64.
fn top4(logits: &[f32]) -> Vec<(u32, f64)> {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    order.truncate(4);
    let m = logits[order[0] as usize] as f64;
    let e: Vec<f64> = order
        .iter()
        .map(|&t| (logits[t as usize] as f64 - m).exp())
        .collect();
    let z: f64 = e.iter().sum();
    order.into_iter().zip(e.iter().map(|x| x / z)).collect()
}

/// Sampled output with MTP drafts is distributed as the model says. 16000 draws of the
/// first three tokens at temperature 1, top-k 4, are compared with the joint probabilities
/// computed from the model's teacher-forced logits: a chi-square test over the 64 cells
/// (63 degrees of freedom; 103.4 is the 0.1% tail). The third token is the one a kept
/// draft's row of the verifying forward gives. Moving 2% of the mass between the two
/// likeliest cells would be expected to score past the bound (checked below). The prompt
/// is the fixture prefix where the layer's draft for the second token is most often one
/// the sampler can pick, so many draws take the drafted path; the first 1000 draws also
/// equal the undrafted runs'.
#[test]
fn sampled_output_with_drafts_has_the_models_distribution() {
    use coli_models::experts::Placement;
    use coli_models::Engine;
    // GLM-5: its MTP layer drafts the second token right for 62% of the first tokens'
    // mass at one prompt (the other fixtures reach 7%).
    let r = Reference::load("glm5_mtp");
    let engine = Engine::open(&r.dir, &Placement::default()).unwrap();
    let vocab = r.vocab();
    let last_row = |ids: &[u32]| {
        let l = engine.evaluate(ids).unwrap().logits;
        l[l.len() - vocab..].to_vec()
    };
    // (how often the draft can be kept, the prompt, its cells)
    let mut best: Option<(f64, Vec<u32>, Vec<Cell>)> = None;
    let ids = r.ids();
    for len in 3..ids.len() {
        let prompt = ids[..len].to_vec();
        let (mut hit, mut cells) = (0.0, Vec::new());
        for (t1, p1) in top4(&last_row(&prompt)) {
            let seq = [prompt.as_slice(), &[t1]].concat();
            let guesses = teacher_forced(engine.model(), &seq).unwrap().unwrap();
            let draft = argmax(&guesses[guesses.len() - vocab..]);
            for (t2, p2) in top4(&last_row(&seq)) {
                if t2 == draft {
                    hit += p1 * p2;
                }
                let seq2 = [seq.as_slice(), &[t2]].concat();
                for (t3, p3) in top4(&last_row(&seq2)) {
                    cells.push(([t1, t2, t3], p1 * p2 * p3));
                }
            }
        }
        if best.as_ref().is_none_or(|b| hit > b.0) {
            best = Some((hit, prompt, cells));
        }
    }
    let (hit, prompt, cells) = best.unwrap();
    assert!(hit > 0.3, "drafts would rarely be kept: {hit}");
    let n: u64 = 16000;
    let mut counts = vec![0u64; cells.len()];
    let mut kept = 0;
    // Three tokens: the layer's draft of the second is checked in the forward that makes
    // the third.
    // Each session keeps most of the prompt from one draw to the next (`truncate` says
    // how much: with MTP on, one position less than asked).
    let session = |mtp: bool| {
        let mut s = Session::new(engine.model(), prompt.len() + 3);
        if mtp {
            assert!(s.enable_mtp());
        }
        s
    };
    let (mut with, mut without) = (session(true), session(false));
    let mut run = |seed, mtp: bool| {
        let s = if mtp { &mut with } else { &mut without };
        let kept = s.truncate(prompt.len() - 1);
        // Draw afresh: no rest left from an earlier draw's refusals.
        if let Some(d) = &mut s.mtp {
            d.backoff = Default::default();
        }
        let mut sampler = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 4,
            top_p: 1.0,
            seed,
        });
        s.generate(&prompt[kept..], 3, &mut sampler, &[], |_| {})
            .unwrap()
    };
    // One thread: a tiny model's forward is too small to share.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        for seed in 0..n {
            let drafted = run(seed, true);
            if seed < 1000 {
                let plain = run(seed, false);
                assert_eq!(drafted.generated_ids, plain.generated_ids, "seed {seed}");
            }
            kept += drafted.stats.drafted_tokens;
            let first: [u32; 3] = drafted.generated_ids[..3].try_into().unwrap();
            let cell = cells.iter().position(|(c, _)| *c == first);
            counts[cell.unwrap_or_else(|| panic!("seed {seed}: {first:?} outside the top 4"))] += 1;
        }
    });
    // The 0.1% tail of chi-square with 63 degrees of freedom.
    const BOUND: f64 = 103.44;
    let expected_kept = hit * n as f64;
    assert!(
        (kept as f64 - expected_kept).abs() < 5.0 * expected_kept.sqrt(),
        "{kept} drafts kept, {expected_kept:.0} expected"
    );
    let chi2: f64 = cells
        .iter()
        .zip(&counts)
        .map(|((_, p), &o)| {
            let e = p * n as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum();
    eprintln!("chi-square {chi2:.1}, {kept} drafts kept of {expected_kept:.0} expected");
    assert!(
        chi2 < BOUND,
        "chi-square {chi2:.1} over 63 degrees of freedom"
    );
    // The power claimed above: with 2% of the mass moved from the likeliest cell to the
    // second, the statistic's expected value (the degrees of freedom plus the shift's
    // noncentrality) is past the bound.
    let mut p: Vec<f64> = cells.iter().map(|c| c.1).collect();
    p.sort_by(|a, b| b.total_cmp(a));
    let shifted = 63.0 + n as f64 * (0.02f64.powi(2) / p[0] + 0.02f64.powi(2) / p[1]);
    assert!(
        shifted > BOUND,
        "{n} draws would miss a 2% shift: {shifted:.1}"
    );
}
