//! `coli plan` from the library: the KV formula equals what coli allocates, budgets turn
//! into cache slots, too small a budget is refused, the pieces add up.

mod common;
use common::{copy, fixture};

use coli_plan::plan::{kv_bytes_per_token, plan, PlanRequest};

#[test]
fn kv_formula_is_what_coli_allocates() {
    for name in [
        "llama_gqa",
        "llama_sharded_headdim",
        "olmoe_gqa_clip",
        "qwen3_moe_headdim",
        "mixtral_mqa_shard",
        "deepseek_v3_group_yarn",
        "glm4_moe_group_mtp",
        "glm5_dsa_full",
        "glm5_dsa_shared_group_yarn",
    ] {
        let m = coli_models::load(fixture(name)).unwrap();
        let cfg = coli_core::RawConfig::read(&fixture(name).join("config.json")).unwrap();
        let per_token = kv_bytes_per_token(&cfg).unwrap();
        let allocated = coli_models::decoder::KvCache::new(&m, 100).bytes() as u64;
        if name == "glm5_dsa_shared_group_yarn" {
            // Shared-indexer layers keep no index keys: the formula is an upper bound.
            assert!(per_token * 100 > allocated, "{name}");
        } else {
            assert_eq!(per_token * 100, allocated, "{name}");
        }
    }
}

#[test]
fn budgets_become_cache_slots_and_small_ones_are_refused() {
    let t = copy("olmoe_gqa_clip");
    let req = |ram: u64| PlanRequest {
        ram: Some(ram),
        ctx: 64,
        kv_slots: 1,
    };
    let big = plan(t.path(), &req(1 << 30), false).unwrap();
    assert!(big.fits);
    assert_eq!(big.version, 1);
    assert_eq!(big.cap_per_layer, big.experts_per_layer);
    assert_eq!(big.projected_hit_rate, 1.0);
    assert_eq!(big.disk_bytes_per_token, 0);
    assert_eq!(
        big.resident_bytes,
        big.resident_weight_bytes + big.kv_bytes + big.working_bytes + big.runtime_reserve_bytes
    );
    // Room for exactly three slots per layer.
    let three = big.resident_bytes + 3 * big.moe_layers as u64 * big.expert_bytes + 10;
    let p = plan(t.path(), &req(three), false).unwrap();
    assert!(p.fits);
    assert_eq!(p.cap_per_layer, 3);
    assert!((p.projected_hit_rate - 3.0 / p.experts_per_layer as f64).abs() < 1e-12);
    assert_eq!(p.hit_rate_basis, "uniform routing");
    assert!(p.disk_bytes_per_token > 0);
    assert!(p.settings.iter().any(|s| s == "--cap 3"));
    // A routing history sharpens the projection: all routing on three experts per layer.
    coli_models::usage::merge(t.path(), &[(0, 1, 50), (0, 2, 30), (0, 3, 20), (1, 0, 10)]).unwrap();
    let p = plan(t.path(), &req(three), false).unwrap();
    assert_eq!(p.hit_rate_basis, "routing history (.coli_usage)");
    assert_eq!(p.projected_hit_rate, 1.0);
    // Below the resident need: refused, with the reason.
    let p = plan(t.path(), &req(big.resident_bytes / 2), false).unwrap();
    assert!(!p.fits);
    assert!(p.projected_decode_tok_s.is_none());
    assert!(
        p.notes.iter().any(|n| n.contains("needs at least")),
        "{:?}",
        p.notes
    );
}

#[test]
fn an_unknown_family_is_refused() {
    let t = copy("llama_gqa");
    let cfg = t.path().join("config.json");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("\"llama\"", "\"mamba9\"");
    std::fs::write(&cfg, text).unwrap();
    let err = plan(
        t.path(),
        &PlanRequest {
            ram: Some(1 << 30),
            ctx: 16,
            kv_slots: 1,
        },
        false,
    )
    .unwrap_err();
    assert!(err.contains("unsupported model_type \"mamba9\""), "{err}");
}
