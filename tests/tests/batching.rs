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
    if let Some(e) = d.take_event() {
        let lp = e.logprob.expect("logprobs were asked for");
        let mut bits = vec![lp.logprob.to_bits()];
        bits.extend(lp.top.iter().flat_map(|(t, l)| [*t as u64, l.to_bits()]));
        out.push((e.id, bits));
    }
}

/// Requests started on their own slots, request `i` joining at step `i * stagger`,
/// advanced together until all finish.
fn together(engine: &Engine, reqs: &[GenerateRequest], stagger: usize) -> Vec<Vec<Traced>> {
    let mut slots: Vec<Slot<'_>> = reqs.iter().map(|_| engine.slot(64)).collect();
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
    out
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

/// A saved slot carries the recurrent state with the tokens: loaded into another slot, a
/// continuation of the whole history gives the tokens of a fresh slot.
#[test]
fn a_saved_recurrent_state_comes_back_with_its_slot() {
    for name in ["qwen3_next_hybrid", "qwen3_5_moe_text_shard"] {
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
