//! Layers whose cache keeps only their last positions, in rings: DeepSeek-V4's attention
//! (its window's keys and its compressors' open rows) and gpt-oss' sliding-window layers
//! (their window's keys and values). Rings that wrap give the bits of a cache that keeps
//! everything, cuts within the slack continue exactly, deeper ones go back to the last
//! prompt's checkpoint or start over, and the cache allocates what the window needs.

use coli_tests::Reference;

/// Fixtures with ring layers, windows shorter than the sequences below.
const RING_FIXTURES: [&str; 4] = [
    "deepseek_v4_hash_csa",
    "deepseek_v4_hub_yarn",
    "gpt_oss_window_yarn",
    "gpt_oss_clamp_top3",
];

/// The bits of every position of `ids` fed to `s` in pieces of `chunk`.
fn fed_in_chunks(s: &mut coli_models::Session, ids: &[u32], chunk: usize) -> Vec<u32> {
    let mut out = Vec::new();
    for piece in ids.chunks(chunk) {
        out.extend(s.forward(piece, true).unwrap().iter().map(|v| v.to_bits()));
    }
    out
}

#[test]
fn rings_that_wrap_give_the_bits_of_a_cache_that_keeps_every_position() {
    // The rings keep only the window's keys (and values, or V4's open windows'
    // compressor rows) plus a slack. Small slacks make them wrap many times over 160
    // positions; every way of feeding the tokens, and every cut the slack allows, must
    // give the bits of rings that hold the whole sequence.
    for name in RING_FIXTURES {
        let r = Reference::load(name);
        let m = coli_models::load(&r.dir).unwrap();
        let vocab = m.info.vocab_size;
        let n = 160;
        let ids: Vec<u32> = (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
        let other: Vec<u32> = ids.iter().map(|&t| (t * 7 + 3) % vocab as u32).collect();
        let mut whole = coli_models::Session::with_ring_slack(&m, n, n);
        let want = fed_in_chunks(&mut whole, &ids, n);
        for slack in [1, 3, 5, 9] {
            let mut s = coli_models::Session::with_ring_slack(&m, n, slack);
            for chunk in [n, 1, 7] {
                s.truncate(0);
                let got = fed_in_chunks(&mut s, &ids, chunk);
                assert!(got == want, "{name}: slack {slack}, pieces of {chunk}");
            }
            // Cuts the slack allows keep their positions and continue exactly.
            for (hi, depth) in [
                (40, slack),
                (97, slack),
                (150, 1),
                (121, (slack / 2).max(1)),
            ] {
                s.truncate(0);
                s.forward(&ids[..hi - depth], false).unwrap();
                s.forward(&other[hi - depth..hi], false).unwrap();
                let cut = hi - depth;
                assert_eq!(
                    s.truncate(cut),
                    cut,
                    "{name}: slack {slack}, cut {depth} at {hi}"
                );
                let got = fed_in_chunks(&mut s, &ids[cut..cut + 8], 3);
                let v = vocab;
                assert!(
                    got[..] == want[cut * v..(cut + 8) * v],
                    "{name}: slack {slack}, cut {depth} at {hi}"
                );
            }
            // A cut deeper than the rings hold starts over.
            s.truncate(0);
            s.forward(&ids[..120], false).unwrap();
            assert_eq!(s.truncate(60), 0, "{name}: slack {slack}");
        }
    }
}

#[test]
fn a_deep_cut_goes_back_to_the_end_of_the_last_prompt() {
    // A conversation's next turn may rewrite the last answer (templates drop the
    // reasoning), so the shared prefix ends where the last prompt ended: further back than
    // the rings' slack. The checkpoint taken there brings the rings back.
    for name in RING_FIXTURES {
        let r = Reference::load(name);
        let m = coli_models::load(&r.dir).unwrap();
        let v = m.info.vocab_size;
        let n = 140;
        let ids: Vec<u32> = (0..n).map(|i| ((i * 7919 + 13) % v) as u32).collect();
        let other: Vec<u32> = ids.iter().map(|&t| (t * 7 + 3) % v as u32).collect();
        let mut whole = coli_models::Session::with_ring_slack(&m, n, n);
        let want = fed_in_chunks(&mut whole, &ids, n);
        let mut s = coli_models::Session::with_ring_slack(&m, n, 3);
        // Turn 1: a prompt of 61 positions, then an answer of 40 the next turn rewrites.
        s.forward(&ids[..61], false).unwrap();
        s.checkpoint();
        fed_in_chunks(&mut s, &other[61..101], 1);
        // Turn 2 shares the prompt and 5 more: back to the checkpoint, not to 0.
        assert_eq!(s.truncate(66), 61, "{name}");
        let got = fed_in_chunks(&mut s, &ids[61..120], 7);
        assert!(
            got[..] == want[61 * v..120 * v],
            "{name}: after the checkpoint"
        );
        // Within the slack, cuts still keep their length and leave the checkpoint.
        assert_eq!(s.truncate(118), 118, "{name}");
        assert_eq!(s.truncate(90), 61, "{name}");
        // Below the checkpoint: start over, and the checkpoint is gone.
        assert_eq!(s.truncate(40), 0, "{name}");
        s.forward(&ids[..120], false).unwrap();
        assert_eq!(s.truncate(70), 0, "{name}: no checkpoint any more");
    }
}

#[test]
fn a_sliding_layer_allocates_its_window_and_slack_only() {
    // From the config alone: a full layer keeps keys and values for every position, a
    // sliding layer a ring of `window - 1 + slack` positions and its checkpoint, whatever
    // the capacity (f32 each).
    for name in ["gpt_oss_window_yarn", "gpt_oss_clamp_top3"] {
        let r = Reference::load(name);
        let c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(r.dir.join("config.json")).unwrap()).unwrap();
        let (kv_heads, hd, window) = (
            c["num_key_value_heads"].as_u64().unwrap() as usize,
            c["head_dim"].as_u64().unwrap() as usize,
            c["sliding_window"].as_u64().unwrap() as usize,
        );
        let kinds: Vec<&str> = c["layer_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let full = kinds.iter().filter(|&&k| k == "full_attention").count();
        let sliding = kinds.iter().filter(|&&k| k == "sliding_attention").count();
        assert_eq!(full + sliding, kinds.len());
        let row = 2 * kv_heads * hd * 4;
        let m = coli_models::load(&r.dir).unwrap();
        for cap in [4096, 100_000] {
            let ring_rows = (window - 1 + coli_models::arch::ring::RING_SLACK).min(cap);
            let want = full * cap * row + sliding * 2 * ring_rows * row;
            let kv = coli_models::arch::KvCache::new(&m, cap);
            assert_eq!(kv.bytes(), want, "{name} at {cap}");
            assert_eq!(
                coli_models::arch::KvCache::bytes_for(&m, cap),
                want,
                "{name} at {cap}"
            );
        }
    }
}
