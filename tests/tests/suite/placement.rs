//! Placement never changes bits: the expert store at every cache size, with prefetch and
//! O_DIRECT on or off, at 1 and 2 threads, against the model read in place — over every
//! MoE oracle fixture. Plus: stats, pinning from the usage history, and a shard truncated
//! mid-run.

use coli_models::experts::{CacheSize, Placement, Prefetch};
use coli_tests::{placement, Reference, TINY_FIXTURES};

/// A fixture's files (no sidecars) in a temp dir.
fn copy_fixture(r: &Reference) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    r.copy_files_to(tmp.path());
    tmp
}

#[test]
fn every_placement_gives_the_same_bits_on_every_moe_fixture() {
    let mut total = 0;
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        total += placement::check(&r.dir, &r.ids()).unwrap();
    }
    assert!(total > 100, "only {total} placements compared");
}

#[test]
fn a_small_cache_misses_and_a_full_one_hits_after_first_use() {
    let r = Reference::load("olmoe_gqa_clip");
    let seq = r.ids();
    let run = |cache: CacheSize| {
        let mut m = coli_models::load(&r.dir).unwrap();
        let p = Placement {
            cache,
            prefetch: Prefetch::Off,
            ..Placement::default()
        };
        m.place_experts(&r.dir, &p).unwrap();
        placement::trace(&m, &seq, 4).unwrap();
        m.store.as_ref().unwrap().stats()
    };
    let small = run(CacheSize::Slots(1));
    let full = run(CacheSize::Slots(8));
    // 8 experts per layer, 2 layers: a full cache reads each expert at most once.
    assert!(full.misses <= 16, "{full:?}");
    assert!(small.misses > full.misses, "{small:?} vs {full:?}");
    assert!(small.hit_rate() < full.hit_rate());
    // Every miss read exactly one expert's bytes.
    let m = coli_models::load(&r.dir).unwrap();
    let per_expert = m.expert_census().expert_bytes;
    assert_eq!(full.bytes_read, full.misses * per_expert);
    assert_eq!(small.bytes_read, small.misses * per_expert);
}

#[test]
fn pinned_experts_come_from_the_usage_history_and_stay() {
    let r = Reference::load("olmoe_norm_topk");
    let tmp = copy_fixture(&r);
    let dir = tmp.path();
    // Record a run's routing.
    let mut m = coli_models::load(dir).unwrap();
    m.place_experts(dir, &Placement::default()).unwrap();
    placement::trace(&m, &r.ids(), 10).unwrap();
    let usage = m.store.as_ref().unwrap().usage();
    let routed: u64 = usage.iter().map(|u| u.2).sum();
    // 40 tokens x 2 layers x top-2.
    assert_eq!(routed, 40 * 2 * 2);
    coli_models::experts::usage::merge(dir, &usage).unwrap();
    // Pin room for three experts: the three most used ones, loaded up front.
    let per_expert = m.expert_census().expert_bytes;
    let mut pinned = coli_models::load(dir).unwrap();
    let p = Placement {
        cache: CacheSize::Slots(1),
        pin_bytes: 3 * per_expert,
        prefetch: Prefetch::Off,
        ..Placement::default()
    };
    pinned.place_experts(dir, &p).unwrap();
    let st = pinned.store.as_ref().unwrap();
    assert_eq!(st.stats().pinned, 3);
    let mut hist: Vec<(usize, usize, u64)> = usage.clone();
    hist.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
    let before = st.stats();
    // Touch the hottest expert: a hit, no read.
    st.get(hist[0].0, hist[0].1).unwrap();
    let after = st.stats();
    assert_eq!(after.hits, before.hits + 1, "{hist:?} {before:?} {after:?}");
    assert_eq!(after.bytes_read, before.bytes_read);
    // Same bits as the model read in place.
    let base = coli_models::load(dir).unwrap();
    let a = placement::trace(&base, &r.ids(), 10).unwrap();
    let b = placement::trace(&pinned, &r.ids(), 10).unwrap();
    assert_eq!(
        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(pinned.store.as_ref().unwrap().stats().pinned, 3);
}

#[test]
fn a_shard_truncated_mid_run_is_a_clear_error() {
    let r = Reference::load("olmoe_gqa_clip");
    let tmp = copy_fixture(&r);
    let dir = tmp.path();
    for direct in [false, true] {
        let mut m = coli_models::load(dir).unwrap();
        let p = Placement {
            cache: CacheSize::Slots(1),
            direct,
            prefetch: if direct { Prefetch::Off } else { Prefetch::On },
            pin_bytes: 0,
        };
        m.place_experts(dir, &p).unwrap();
        let mut s = coli_models::Session::new(&m, 64);
        s.forward(&r.ids()[..4], false).unwrap();
        // Cut every shard after its header: expert reads now hit the end of the file.
        let mut saved = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "safetensors") {
                let bytes = std::fs::read(&path).unwrap();
                let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len((8 + n) as u64)
                    .unwrap();
                saved.push((path, bytes));
            }
        }
        let err = (0..20)
            .find_map(|i| s.forward(&[r.ids()[4 + i]], false).err())
            .expect("a read past the end must fail");
        let msg = err.to_string();
        // The first read to fail is an expert's or, since the untied embedding table stays
        // in the shard (read with pread), the token's embedding row.
        assert!(
            (msg.contains("expert store: reading expert")
                || msg.contains("reading model.embed_tokens.weight"))
                && msg.contains(".safetensors"),
            "{msg}"
        );
        for (path, bytes) in saved {
            std::fs::write(path, bytes).unwrap();
        }
    }
}

/// An untied embedding table is left in the shard (one row read per token), the head and
/// the other dense matrices are copied into resident memory; a table the head shares (tied
/// weights) is copied. The results are the oracle's either way (the oracle suite).
#[test]
fn the_untied_embedding_table_stays_in_the_shard() {
    for (name, tied) in [
        ("llama_gqa", false),
        ("olmoe_gqa_clip", false),
        ("llama_tied_mha", true),
    ] {
        let r = Reference::load(name);
        let m = coli_models::load(&r.dir).unwrap();
        assert_eq!(m.embedding_stays_mapped(), !tied, "{name}");
        assert_eq!(m.embed_tokens.view().is_resident(), tied, "{name}");
        assert!(m.lm_head.view().is_resident(), "{name}: head");
        let l0 = &m.layers[0];
        if let coli_models::arch::Mixer::Gqa(a) = &l0.attn {
            assert!(a.q_proj.view().is_resident(), "{name}: q_proj");
        }
        // Rows read from the shard equal the rows of the mapping's bytes.
        let h = m.info.hidden_size;
        let (mut got, mut want) = (vec![0.0; h], vec![0.0; h]);
        for tok in [0, 1, r.vocab() - 1] {
            m.embed_tokens.embed_row(tok, &mut got).unwrap();
            m.embed_tokens.row_f32(tok, &mut want);
            assert_eq!(got, want, "{name}: row {tok}");
        }
    }
}

#[test]
fn experts_are_served_in_place_only_when_all_are_cached_through_the_page_cache() {
    let r = Reference::load("olmoe_gqa_clip");
    let n = 8; // experts per layer in this fixture
    let dir = r.dir.clone();
    let in_place = |cache: CacheSize, direct: bool| {
        let mut m = coli_models::load(&dir).unwrap();
        let p = Placement {
            cache,
            direct,
            prefetch: Prefetch::On,
            pin_bytes: 0,
        };
        m.place_experts(&dir, &p).unwrap();
        m.store.as_ref().unwrap().in_place()
    };
    assert!(in_place(CacheSize::Slots(n), false));
    assert!(!in_place(CacheSize::Slots(n - 1), false));
    assert!(!in_place(CacheSize::Slots(n), true));
}

#[test]
fn an_in_place_expert_past_a_truncated_end_is_a_clear_error() {
    // The shards are cut after the experts are placed (shards mapped at full length) and
    // before any expert is touched: faulting an expert in fails cleanly, no SIGBUS.
    let r = Reference::load("olmoe_gqa_clip");
    let n = 8; // experts per layer in this fixture
    let tmp = copy_fixture(&r);
    let dir = tmp.path();
    let mut m = coli_models::load(dir).unwrap();
    let p = Placement {
        cache: CacheSize::Slots(n),
        direct: false,
        prefetch: Prefetch::Off,
        pin_bytes: 0,
    };
    m.place_experts(dir, &p).unwrap();
    assert!(m.store.as_ref().unwrap().in_place());
    // The shard with the embedding table (read first, with pread) stays whole, so the
    // forward gets as far as the experts of the other shards.
    let embed_shard = m.embed_tokens.view().file.file_name().unwrap().to_owned();
    let mut cut = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "safetensors")
            && path.file_name().unwrap() != embed_shard
        {
            cut += 1;
            let bytes = std::fs::read(&path).unwrap();
            let h = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len((8 + h) as u64).unwrap();
        }
    }
    assert!(cut >= 1, "no shard but the embedding's to cut");
    let mut s = coli_models::Session::new(&m, 64);
    let msg = s.forward(&r.ids()[..4], false).unwrap_err().to_string();
    assert!(
        msg.contains("in place from") && msg.contains("faulting its pages in"),
        "{msg}"
    );
}

/// The same matrix on synthetic models (random weights, more experts and layers than the
/// fixtures), bf16 experts and int8 containers.
#[test]
fn every_placement_gives_the_same_bits_on_synthetic_models() {
    for int8_experts in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let spec = coli_tests::synthetic::OlmoeSpec {
            int8_experts,
            ..coli_tests::synthetic::OlmoeSpec::small()
        };
        coli_tests::synthetic::write_olmoe(tmp.path(), &spec, |_, _| {}).unwrap();
        let seq: Vec<u32> = (0..20).map(|i| (i * 131 + 7) % 512).collect();
        let n = placement::check(tmp.path(), &seq).unwrap();
        assert_eq!(n, 50);
    }
}
