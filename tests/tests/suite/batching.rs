//! Batching never changes tokens: requests advanced together in one batched forward per
//! step (joining and leaving at different steps, each at its own position, greedy and
//! seeded sampling mixed) produce, token for token and log-probability bit for bit, what
//! each produces alone — on every tiny oracle family, and through the expert store with a
//! cache of one expert per layer. A slot that reuses a shared prefix gives the tokens of a
//! fresh slot.

use coli_models::experts::{CacheSize, Placement, Prefetch};
use coli_models::{
    Batch, Decoding, Engine, GenerateRequest, Prompt, SamplingParams, Slot, SlotOptions,
};
use coli_tests::{fixtures_dir, TINY_FIXTURES};

/// A generated token and the bits of its log-probabilities (sampled, then the top 3).
type Traced = (u32, Vec<u64>);

fn requests(vocab: u32) -> Vec<GenerateRequest> {
    let prompt =
        |seed: u32, len: u32| Prompt::Ids((0..len).map(|i| (seed * 7 + i * 13) % vocab).collect());
    let sampled = |seed: u64, temperature: f32, top_p: f32| SamplingParams {
        temperature,
        top_k: 0,
        top_p,
        seed,
    };
    [
        (prompt(1, 3), SamplingParams::default(), 9),
        (prompt(2, 6), sampled(11, 1.0, 1.0), 7),
        (prompt(3, 2), sampled(12, 0.8, 0.9), 10),
        (prompt(4, 5), SamplingParams::default(), 5),
    ]
    .into_iter()
    .map(|(prompt, sampling, max_tokens)| GenerateRequest {
        prompt,
        sampling,
        max_tokens,
        ignore_eos: true,
        ..GenerateRequest::default()
    })
    .collect()
}

fn opts() -> SlotOptions {
    SlotOptions { logprobs: Some(3) }
}

fn trace(d: &mut Decoding<'_>, out: &mut Vec<Traced>) {
    while let Some(e) = d.take_event() {
        let lp = e.logprob.expect("logprobs were asked for");
        let mut bits = vec![lp.logprob.to_bits()];
        bits.extend(lp.top.iter().flat_map(|(t, l)| [*t as u64, l.to_bits()]));
        out.push((e.id, bits));
    }
}

/// Requests started on their own slots, request `i` joining at step `i * stagger`,
/// advanced together until all finish.
fn together(engine: &Engine, reqs: &[GenerateRequest], stagger: usize) -> Vec<Vec<Traced>> {
    together_counting(engine, reqs, stagger, None)
        .into_iter()
        .map(|(t, _)| t)
        .collect()
}

/// [`together`] on slots with MTP drafting on at `mtp_depth`, with each request's draft
/// counters.
fn together_counting(
    engine: &Engine,
    reqs: &[GenerateRequest],
    stagger: usize,
    mtp_depth: Option<usize>,
) -> Vec<(Vec<Traced>, [usize; 3])> {
    let mut slots: Vec<Slot<'_>> = reqs.iter().map(|_| engine.slot(64)).collect();
    if let Some(depth) = mtp_depth {
        for s in &mut slots {
            assert!(s.enable_mtp(depth), "the model has an MTP layer");
        }
    }
    let mut decs: Vec<Option<Decoding<'_>>> = reqs.iter().map(|_| None).collect();
    let mut out = vec![Vec::new(); reqs.len()];
    let mut batch = Batch::new();
    let mut step = 0;
    loop {
        for (i, req) in reqs.iter().enumerate() {
            if decs[i].is_none() && out[i].is_empty() && i * stagger <= step {
                let mut d = engine.begin(&mut slots[i], req, &opts()).unwrap();
                trace(&mut d, &mut out[i]);
                decs[i] = Some(d);
            }
        }
        let waiting = reqs.len() - decs.iter().filter(|d| d.is_some()).count();
        let mut pairs: Vec<(&mut Slot<'_>, &mut Decoding<'_>)> = slots
            .iter_mut()
            .zip(decs.iter_mut())
            .filter_map(|(s, d)| d.as_mut().filter(|d| d.finish().is_none()).map(|d| (s, d)))
            .collect();
        if pairs.is_empty() && waiting == 0 {
            break;
        }
        engine.step(&mut batch, &mut pairs).unwrap();
        drop(pairs);
        for (i, d) in decs.iter_mut().enumerate() {
            if let Some(d) = d {
                trace(d, &mut out[i]);
            }
        }
        step += 1;
    }
    out.into_iter()
        .zip(decs)
        .map(|(t, d)| (t, draft_counts(d.expect("every request started").stats())))
        .collect()
}

fn check(engine: &Engine, what: &str) {
    let reqs = requests(engine.model().info.vocab_size as u32);
    let alone: Vec<Vec<Traced>> = reqs
        .iter()
        .map(|r| together(engine, std::slice::from_ref(r), 0).remove(0))
        .collect();
    for (r, a) in reqs.iter().zip(&alone) {
        // The batch path alone equals the engine's one-request path.
        let reference = engine.generate(r, |_, _| {}).unwrap();
        let ids: Vec<u32> = a.iter().map(|t| t.0).collect();
        assert_eq!(
            ids, reference.generated_ids,
            "{what}: slot path vs Engine::generate"
        );
        assert_eq!(
            ids.len(),
            r.max_tokens,
            "{what}: ignore_eos runs to max_tokens"
        );
    }
    for stagger in [0, 2] {
        let batched = together(engine, &reqs, stagger);
        for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
            assert_eq!(
                b, a,
                "{what}: request {i} batched (stagger {stagger}) differs from alone"
            );
        }
    }
}

#[test]
fn batched_requests_equal_requests_served_alone() {
    for name in TINY_FIXTURES {
        let engine = Engine::open(&fixtures_dir().join(name), &Placement::default()).unwrap();
        check(&engine, name);
    }
}

#[test]
fn batching_through_the_expert_store_keeps_tokens() {
    for name in [
        "olmoe_norm_topk",
        "qwen2_moe_shared",
        "mixtral_gqa",
        "deepseek_v3_group_yarn",
        "glm5_dsa_shared_group_yarn",
        "deepseek_v4_hash_csa",
    ] {
        let placement = Placement {
            cache: CacheSize::Slots(1),
            prefetch: Prefetch::On,
            ..Placement::default()
        };
        let engine = Engine::open(&fixtures_dir().join(name), &placement).unwrap();
        assert!(engine.model().store.is_some(), "{name} is placed");
        check(&engine, &format!("{name} streamed"));
    }
}

#[test]
fn a_reused_prefix_gives_the_tokens_of_a_fresh_slot() {
    for name in [
        "llama_gqa",
        "olmoe_gqa_clip",
        "deepseek_v3_group_yarn",
        "glm5_dsa_full",
        "deepseek_v4_hash_csa",
        "gpt_oss_window_yarn",
    ] {
        let engine = Engine::open(&fixtures_dir().join(name), &Placement::default()).unwrap();
        let reqs = requests(engine.model().info.vocab_size as u32);
        let mut slot = engine.slot(64);
        let first = together_on(&engine, &mut slot, &reqs[0]);
        // The next turn: the whole first exchange plus two new tokens.
        let (ids, next) = next_turn(&reqs, &first);
        let mut d = engine.begin(&mut slot, &next, &opts()).unwrap();
        // Everything but the first exchange's last token (emitted, never fed) is reused.
        assert_eq!(d.cached_tokens(), ids.len() - 3, "{name}");
        let mut reused = Vec::new();
        trace(&mut d, &mut reused);
        run_out(&engine, &mut slot, &mut d, &mut reused);
        let fresh = together(&engine, std::slice::from_ref(&next), 0).remove(0);
        assert_eq!(reused, fresh, "{name}: reused prefix vs fresh slot");
        // A different prompt on the same slot reuses only what it shares.
        let other = GenerateRequest {
            prompt: Prompt::Ids(vec![9, 9, 9]),
            ..reqs[0].clone()
        };
        let d = engine.begin(&mut slot, &other, &opts()).unwrap();
        assert_eq!(d.cached_tokens(), 0, "{name}");
    }
}

/// A linear-attention model's state cannot go back to an earlier position: a slot reuses
/// its history only when the new prompt continues all of it, and otherwise starts over,
/// with the tokens of a fresh slot either way.
#[test]
fn a_recurrent_state_is_reused_whole_or_not_at_all() {
    for name in ["qwen3_next_hybrid", "qwen3_next_layer_types_shard"] {
        let engine = Engine::open(&fixtures_dir().join(name), &Placement::default()).unwrap();
        let reqs = requests(engine.model().info.vocab_size as u32);
        let mut slot = engine.slot(64);
        let first = together_on(&engine, &mut slot, &reqs[0]);
        let (whole, _) = next_turn(&reqs, &first);
        let Prompt::Ids(prompt) = reqs[0].prompt.clone() else {
            unreachable!()
        };
        // Shares all but the last prompt token: a KV cache would keep that prefix.
        let mut partial = prompt[..prompt.len() - 1].to_vec();
        partial.extend([7, 8]);
        for (ids, cached) in [(whole.clone(), whole.len() - 3), (partial, 0)] {
            let next = GenerateRequest {
                prompt: Prompt::Ids(ids.clone()),
                ..reqs[1].clone()
            };
            let mut d = engine.begin(&mut slot, &next, &opts()).unwrap();
            assert_eq!(d.cached_tokens(), cached, "{name}");
            let mut got = Vec::new();
            trace(&mut d, &mut got);
            run_out(&engine, &mut slot, &mut d, &mut got);
            let fresh = together(&engine, std::slice::from_ref(&next), 0).remove(0);
            assert_eq!(got, fresh, "{name}: {cached} reused tokens vs a fresh slot");
        }
    }
}

/// A saved slot carries the recurrent state (or the rings of DeepSeek-V4 and sliding
/// windows) with the tokens:
/// loaded into another slot, a continuation of the whole history gives the tokens of a
/// fresh slot.
#[test]
fn a_saved_recurrent_state_comes_back_with_its_slot() {
    for name in [
        "qwen3_next_hybrid",
        "qwen3_5_moe_text_shard",
        "deepseek_v4_hash_csa",
        "gpt_oss_window_yarn",
    ] {
        let engine = Engine::open(&fixtures_dir().join(name), &Placement::default()).unwrap();
        let reqs = requests(engine.model().info.vocab_size as u32);
        let mut slot = engine.slot(64);
        let first = together_on(&engine, &mut slot, &reqs[0]);
        let mut saved = Vec::new();
        slot.save_state(&mut saved).unwrap();
        let mut other = engine.slot(64);
        other.load_state(&mut &saved[..]).unwrap();
        assert_eq!(other.tokens(), slot.tokens(), "{name}");
        let (ids, next) = next_turn(&reqs, &first);
        let mut d = engine.begin(&mut other, &next, &opts()).unwrap();
        assert_eq!(d.cached_tokens(), ids.len() - 3, "{name}");
        let mut got = Vec::new();
        trace(&mut d, &mut got);
        run_out(&engine, &mut other, &mut d, &mut got);
        let fresh = together(&engine, std::slice::from_ref(&next), 0).remove(0);
        assert_eq!(got, fresh, "{name}: loaded slot vs a fresh one");
    }
}

/// The conversation's next turn: `reqs[0]`'s prompt ids, the answer `first` and two new
/// tokens, as a request with `reqs[1]`'s settings.
fn next_turn(reqs: &[GenerateRequest], first: &[Traced]) -> (Vec<u32>, GenerateRequest) {
    let Prompt::Ids(mut ids) = reqs[0].prompt.clone() else {
        unreachable!()
    };
    ids.extend(first.iter().map(|t| t.0));
    ids.extend([5, 6]);
    let next = GenerateRequest {
        prompt: Prompt::Ids(ids.clone()),
        ..reqs[1].clone()
    };
    (ids, next)
}

fn together_on<'e>(engine: &'e Engine, slot: &mut Slot<'e>, req: &GenerateRequest) -> Vec<Traced> {
    let mut out = Vec::new();
    let mut d = engine.begin(slot, req, &opts()).unwrap();
    trace(&mut d, &mut out);
    run_out(engine, slot, &mut d, &mut out);
    out
}

fn run_out<'e>(
    engine: &'e Engine,
    slot: &mut Slot<'e>,
    d: &mut Decoding<'e>,
    out: &mut Vec<Traced>,
) {
    let mut batch = Batch::new();
    while d.finish().is_none() {
        engine
            .step(&mut batch, &mut [(&mut *slot, &mut *d)])
            .unwrap();
        trace(d, out);
    }
}

/// Draft counters of one request: proposed, accepted, verifying forwards.
fn draft_counts(s: &coli_models::session::GenStats) -> [usize; 3] {
    [s.draft_proposed, s.drafted_tokens, s.draft_forwards]
}

/// `requests` with prompts that repeat themselves (prompt lookup drafts from the first
/// step), drafting with `lookup` and the MTP layer as `mtp` (depth `depth`), or not at all.
fn drafting_requests(vocab: u32, lookup: bool, mtp: bool, depth: usize) -> Vec<GenerateRequest> {
    requests(vocab)
        .into_iter()
        .map(|r| {
            let Prompt::Ids(p) = &r.prompt else {
                unreachable!()
            };
            let ids = [&p[..], &p[..], &p[..]].concat();
            GenerateRequest {
                prompt: Prompt::Ids(ids),
                max_tokens: r.max_tokens + 6,
                drafts: lookup || mtp,
                lookup,
                mtp: if mtp {
                    coli_models::MtpDrafting::On
                } else {
                    coli_models::MtpDrafting::Off
                },
                mtp_depth: depth,
                ..r
            }
        })
        .collect()
}

/// Runs `reqs` one at a time on fresh slots (MTP on at `mtp_depth`): the traces and the
/// draft counters of each.
fn alone_with_counts(
    engine: &Engine,
    reqs: &[GenerateRequest],
    mtp_depth: Option<usize>,
) -> Vec<(Vec<Traced>, [usize; 3])> {
    reqs.iter()
        .map(|r| {
            let mut slot = engine.slot(64);
            if let Some(depth) = mtp_depth {
                assert!(slot.enable_mtp(depth), "the model has an MTP layer");
            }
            let mut out = Vec::new();
            let mut d = engine.begin(&mut slot, r, &opts()).unwrap();
            trace(&mut d, &mut out);
            run_out(engine, &mut slot, &mut d, &mut out);
            (out, draft_counts(d.stats()))
        })
        .collect()
}

/// A slot drafts with the request's sources inside the batched step: the tokens and
/// log-probabilities are those of undrafted slots, alone and batched with others, and
/// each request proposes and accepts exactly the drafts the one-request path
/// (`Engine::generate`) does.
#[test]
fn drafting_slots_give_the_tokens_of_undrafted_slots() {
    let (mut proposed, mut accepted, mut multi) = (0, 0, 0);
    for name in TINY_FIXTURES {
        let engine = Engine::open(&fixtures_dir().join(name), &Placement::default()).unwrap();
        let vocab = engine.model().info.vocab_size as u32;
        let plain = drafting_requests(vocab, false, false, 0);
        let drafted = drafting_requests(vocab, true, false, 0);
        let reference = alone_with_counts(&engine, &plain, None);
        let alone = alone_with_counts(&engine, &drafted, None);
        for (i, ((a, counts), (p, none))) in alone.iter().zip(&reference).enumerate() {
            assert_eq!(a, p, "{name}: request {i} with lookup drafts vs without");
            assert_eq!(
                *none,
                [0, 0, 0],
                "{name}: request {i} drafted with drafts off"
            );
            let g = engine.generate(&drafted[i], |_, _| {}).unwrap();
            assert_eq!(
                *counts,
                draft_counts(&g.stats),
                "{name}: request {i}: slot drafts vs Engine::generate's"
            );
            proposed += counts[0];
            accepted += counts[1];
            // Steps that produced more than one token.
            multi += counts[1].min(counts[2]);
        }
        for stagger in [0, 2] {
            let batched = together_counting(&engine, &drafted, stagger, None);
            for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
                assert_eq!(
                    b, a,
                    "{name}: request {i} drafted, batched (stagger {stagger}) vs alone"
                );
            }
        }
    }
    eprintln!("lookup drafts on slots: {accepted} of {proposed} accepted; {multi} steps made several tokens");
    assert!(
        accepted > 0 && multi > 0 && accepted < proposed,
        "drafts must be accepted and refused somewhere: {accepted} of {proposed} accepted"
    );
}

/// The MTP layer drafts on slots too (depth 1 and 3): unchanged tokens, the drafts of the
/// one-request path, and a next turn on the same slot (its prefix reused) still drafts.
#[test]
fn slots_draft_with_the_mtp_layer() {
    for name in ["deepseek_v3_mtp", "glm4_moe_mtp", "glm5_mtp"] {
        let engine = Engine::open(&fixtures_dir().join(name), &Placement::default()).unwrap();
        let vocab = engine.model().info.vocab_size as u32;
        let reference =
            alone_with_counts(&engine, &drafting_requests(vocab, false, false, 0), None);
        for depth in [1, 3] {
            let reqs = drafting_requests(vocab, false, true, depth);
            let alone = alone_with_counts(&engine, &reqs, Some(depth));
            for (i, ((a, counts), (p, _))) in alone.iter().zip(&reference).enumerate() {
                assert_eq!(
                    a, p,
                    "{name} depth {depth}: request {i} with MTP drafts vs without"
                );
                assert!(
                    counts[0] > 0,
                    "{name} depth {depth}: request {i} drafted nothing"
                );
                let g = engine.generate(&reqs[i], |_, _| {}).unwrap();
                assert_eq!(
                    *counts,
                    draft_counts(&g.stats),
                    "{name} depth {depth}: request {i}: slot MTP drafts vs Engine::generate's"
                );
            }
            for stagger in [0, 2] {
                let batched = together_counting(&engine, &reqs, stagger, Some(depth));
                for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
                    assert_eq!(
                        b, a,
                        "{name} depth {depth}: request {i} batched (stagger {stagger}) vs alone"
                    );
                }
            }
            // The next turn edits the answer after its second token: the slot's history is
            // cut below what the MTP layer has read, so one more position is recomputed
            // (the layer needs its hidden state again), and drafting goes on.
            let mut slot = engine.slot(64);
            slot.enable_mtp(depth);
            let first = together_on(&engine, &mut slot, &reqs[0]);
            let Prompt::Ids(mut ids) = reqs[0].prompt.clone() else {
                unreachable!()
            };
            let shared = ids.len() + 2;
            ids.extend(first[..2].iter().map(|t| t.0));
            ids.extend([5, 6]);
            let next = GenerateRequest {
                prompt: Prompt::Ids(ids),
                ..reqs[0].clone()
            };
            let mut d = engine.begin(&mut slot, &next, &opts()).unwrap();
            assert_eq!(
                d.cached_tokens(),
                shared - 1,
                "{name}: one position re-read"
            );
            let mut got = Vec::new();
            trace(&mut d, &mut got);
            run_out(&engine, &mut slot, &mut d, &mut got);
            assert!(
                d.stats().draft_proposed > 0,
                "{name}: the next turn drafted nothing"
            );
            let plain = GenerateRequest {
                mtp: coli_models::MtpDrafting::Off,
                ..next.clone()
            };
            let fresh = together(&engine, std::slice::from_ref(&plain), 0).remove(0);
            assert_eq!(
                got, fresh,
                "{name}: next turn with MTP drafts vs a fresh slot"
            );
        }
    }
}
