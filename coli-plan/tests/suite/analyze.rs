//! analyze_model and its sidecar cache: (a) a hit equals the fresh result and scans
//! nothing; (b) size/mtime changes invalidate; (c) corrupt caches fall back; (d) no temp
//! files after success or failure; (e) replaced by rename, never in place; (f) concurrent
//! writers leave one valid cache. Plus: the totals agree with the loaded model.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::common::{copy, fixture};

use coli_plan::analyze::{analyze, analyze_uncached, CacheOutcome, SIDECAR};

fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect()
}

#[test]
fn totals_agree_with_the_loaded_model() {
    for name in [
        "olmoe_gqa_clip",
        "deepseek_v3_group_yarn",
        "glm5_dsa_shared_group_yarn",
        "deepseek_v3_fp8_b128",
        "llama_gqa",
        "gpt_oss_window_yarn",
        "minimax_m2_top3_shard",
        "qwen3_next_hybrid",
        "qwen3_5_moe_hub_fused",
        "qwen3_5_moe_text_shard",
        "deepseek_v4_hash_csa",
        "deepseek_v4_hub_yarn",
    ] {
        let a = analyze_uncached(&fixture(name)).unwrap();
        let m = coli_models::load(fixture(name)).unwrap();
        let census = m.expert_census();
        // The store's experts are weights only; the analysis adds their scale tensors.
        assert!(a.expert_bytes >= census.total_bytes, "{name}");
        assert_eq!(a.expert_layers.len(), census.moe_layers, "{name}");
        for l in &a.expert_layers {
            assert_eq!(l.experts, census.experts_per_layer, "{name}");
        }
        assert_eq!(
            a.model_bytes,
            a.dense_bytes
                + a.expert_bytes
                + a.shared_expert_bytes
                + a.indexer_bytes
                + a.mtp_bytes
                + a.ignored_bytes
        );
        let on_disk: u64 = a.shards.iter().map(|s| s.bytes).sum();
        assert!(
            a.model_bytes < on_disk,
            "{name}: headers are not counted as tensors"
        );
        assert_eq!(a.model_type, m.info.model_type);
        assert_eq!(a.family().unwrap().display_name, m.info.family);
    }
    let a = analyze_uncached(&fixture("deepseek_v3_group_yarn")).unwrap();
    assert!(a.mtp_bytes > 0, "the MTP layer is classified");
    let a = analyze_uncached(&fixture("glm5_dsa_full")).unwrap();
    assert!(a.indexer_bytes > 0 && a.shared_expert_bytes > 0);
    // gpt-oss: the streamed bytes are exactly the MXFP4 blocks and E8M0 scales the store
    // reads, rated as MXFP4; their biases stay resident (BF16).
    let name = "gpt_oss_window_yarn";
    let a = analyze_uncached(&fixture(name)).unwrap();
    let m = coli_models::load(fixture(name)).unwrap();
    assert_eq!(a.expert_bytes, m.expert_census().total_bytes);
    assert_eq!(
        a.expert_dtype_bytes.keys().collect::<Vec<_>>(),
        vec!["MXFP4"]
    );
    assert!(!a.resident_dtype_bytes.contains_key("U8"));
    // Qwen3.5 as the hub ships it: fused BF16 experts under model.language_model are the
    // store's bytes exactly, rated as BF16; the vision tower is neither resident nor
    // streamed.
    let name = "qwen3_5_moe_hub_fused";
    let a = analyze_uncached(&fixture(name)).unwrap();
    let m = coli_models::load(fixture(name)).unwrap();
    assert_eq!(a.expert_bytes, m.expert_census().total_bytes);
    assert_eq!(
        a.expert_dtype_bytes.keys().collect::<Vec<_>>(),
        vec!["BF16"]
    );
    assert!(a.ignored_bytes > 0, "the vision tower is classified");
    assert_eq!(a.expert_layers.len(), 4);
}

/// `model.embed_tokens.weight`'s payload bytes, from the shard headers read here.
fn embedding_payload(dir: &Path) -> u64 {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().and_then(|x| x.to_str()) != Some("safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        if let Some(t) = h.get("model.embed_tokens.weight") {
            let o = &t["data_offsets"];
            return o[1].as_u64().unwrap() - o[0].as_u64().unwrap();
        }
    }
    panic!("{}: no embedding table", dir.display())
}

#[test]
fn an_untied_embedding_table_is_read_per_token_by_one_row_and_not_budgeted_as_ram() {
    // The loader leaves an untied table in its shard (rows read with pread): the
    // analysis says so, and neither the RAM budget nor the bytes a step reads count it.
    // A tied table is the head: copied and read whole every step.
    for (name, untied) in [
        ("llama_gqa", true),
        ("olmoe_gqa_clip", true),
        ("llama_tied_mha", false),
    ] {
        let a = analyze_uncached(&fixture(name)).unwrap();
        let all = a.dense_bytes + a.shared_expert_bytes + a.indexer_bytes;
        let table = embedding_payload(&fixture(name));
        assert!(table > 0 && table < all, "{name}");
        assert_eq!(a.embedding_mapped, untied, "{name}");
        if untied {
            assert_eq!(a.untied_embedding_bytes, table, "{name}");
            assert_eq!(a.resident_bytes(), all - table, "{name}");
            assert_eq!(a.resident_read_bytes(), all - table, "{name}");
        } else {
            assert_eq!(a.untied_embedding_bytes, 0, "{name}");
            assert_eq!(a.resident_bytes(), all, "{name}");
            assert_eq!(a.resident_read_bytes(), all, "{name}");
        }
    }
}

#[test]
fn a_hit_is_the_fresh_result_and_scans_nothing() {
    let t = copy("olmoe_gqa_clip");
    let (fresh, o) = analyze(t.path()).unwrap();
    assert_eq!(o, CacheOutcome::Stored);
    // Proof that a hit reads no header: break every shard's header but keep each file's
    // size and mtime. A scan would now fail; the hit still answers.
    for e in std::fs::read_dir(t.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
            let mut bytes = std::fs::read(&p).unwrap();
            bytes[8] = b'#';
            std::fs::write(&p, &bytes).unwrap();
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(mtime).unwrap();
        }
    }
    assert!(
        analyze_uncached(t.path()).is_err(),
        "the broken header must fail a scan"
    );
    let (hit, o) = analyze(t.path()).unwrap();
    assert_eq!(o, CacheOutcome::Hit);
    assert_eq!(hit, fresh);
    assert!(temp_files(t.path()).is_empty());
}

#[test]
fn size_or_mtime_changes_invalidate() {
    let t = copy("olmoe_gqa_clip");
    analyze(t.path()).unwrap();
    // mtime of a shard.
    let shard = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    let f = std::fs::File::options().write(true).open(&shard).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    assert_eq!(analyze(t.path()).unwrap().1, CacheOutcome::Stored);
    assert_eq!(analyze(t.path()).unwrap().1, CacheOutcome::Hit);
    // Size of config.json.
    let cfg = t.path().join("config.json");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push('\n');
    std::fs::write(&cfg, text).unwrap();
    assert_eq!(analyze(t.path()).unwrap().1, CacheOutcome::Stored);
}

#[test]
fn corrupt_truncated_or_foreign_caches_fall_back() {
    let t = copy("olmoe_gqa_clip");
    let (fresh, _) = analyze(t.path()).unwrap();
    let good = std::fs::read(t.path().join(SIDECAR)).unwrap();
    let foreign =
        serde_json::json!({"format_version": 99, "signature": [], "analysis": {}}).to_string();
    for bad in [
        b"\x00\xffgarbage".to_vec(),
        good[..good.len() / 2].to_vec(),
        foreign.into_bytes(),
        Vec::new(),
        String::from_utf8_lossy(&good)
            .replace("\"olmoe\"", "\"mamba9\"")
            .into_bytes(),
    ] {
        std::fs::write(t.path().join(SIDECAR), &bad).unwrap();
        let (a, o) = analyze(t.path()).unwrap();
        assert_eq!(o, CacheOutcome::Stored);
        assert_eq!(a, fresh);
        assert_eq!(analyze(t.path()).unwrap().1, CacheOutcome::Hit);
    }
}

#[test]
fn a_failed_write_leaves_no_temp_file_and_the_command_still_answers() {
    let t = copy("olmoe_gqa_clip");
    // The sidecar's name is taken by a directory: the rename must fail.
    std::fs::create_dir(t.path().join(SIDECAR)).unwrap();
    std::fs::write(t.path().join(SIDECAR).join("x"), b"x").unwrap();
    let (a, o) = analyze(t.path()).unwrap();
    assert!(matches!(o, CacheOutcome::Uncached(_)), "{o:?}");
    assert_eq!(a, analyze_uncached(t.path()).unwrap());
    assert!(
        temp_files(t.path()).is_empty(),
        "{:?}",
        temp_files(t.path())
    );
}

#[test]
fn the_cache_is_replaced_by_rename_never_in_place() {
    let t = copy("olmoe_gqa_clip");
    analyze(t.path()).unwrap();
    let path = t.path().join(SIDECAR);
    let old_bytes = std::fs::read(&path).unwrap();
    let old_ino = std::fs::metadata(&path).unwrap().ino();
    let held = std::fs::File::open(&path).unwrap();
    let cfg = t.path().join("config.json");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push(' ');
    std::fs::write(&cfg, text).unwrap();
    assert_eq!(analyze(t.path()).unwrap().1, CacheOutcome::Stored);
    assert_ne!(std::fs::metadata(&path).unwrap().ino(), old_ino);
    // The file we still hold was not written to.
    let mut still = Vec::new();
    use std::io::Read;
    (&held).read_to_end(&mut still).unwrap();
    assert_eq!(still, old_bytes);
    assert_ne!(std::fs::read(&path).unwrap(), old_bytes);
}

#[test]
fn concurrent_writers_leave_one_valid_cache() {
    let t = copy("deepseek_v3_no_q_lora");
    let fresh = analyze_uncached(t.path()).unwrap();
    for _ in 0..3 {
        let _ = std::fs::remove_file(t.path().join(SIDECAR));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let (a, _) = analyze(t.path()).unwrap();
                    assert_eq!(a, fresh);
                });
            }
        });
        assert_eq!(analyze(t.path()).unwrap().1, CacheOutcome::Hit);
        assert!(temp_files(t.path()).is_empty());
    }
}
