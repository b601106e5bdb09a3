//! `coli plan` from the library: the KV formula equals what coli allocates, budgets turn
//! into cache slots, too small a budget is refused, the pieces add up.

use crate::common::{copy, fixture};

use coli_plan::plan::{plan, PlanRequest};

/// The plan's KV bytes are the cache a session allocates, on every oracle fixture (the
/// planner asks the family's blocks; nothing is re-derived from config keys).
#[test]
fn plan_kv_bytes_equal_the_allocated_cache_on_every_fixture() {
    let root = fixture("");
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("config.json").is_file() {
            continue;
        }
        let t = copy(dir.file_name().unwrap().to_str().unwrap());
        let (ctx, slots) = (37, 2);
        let req = PlanRequest {
            ram: Some(1 << 40),
            ctx,
            kv_slots: slots,
        };
        let p = plan(t.path(), &req, false).unwrap();
        let m = coli_models::load(t.path()).unwrap();
        let allocated = coli_models::arch::KvCache::new(&m, ctx).bytes() as u64;
        assert_eq!(p.kv_bytes, slots as u64 * allocated, "{}", dir.display());
        // The planner's scratch is an upper bound of what a decode step's buffers hold,
        // and not a wild one.
        let actual = m.scratch_bytes(1, ctx, 1) as u64;
        assert!(
            p.working_bytes >= actual && p.working_bytes <= 8 * actual + (1 << 20),
            "{}: planned {} vs actual {actual}",
            dir.display(),
            p.working_bytes
        );
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} fixtures");
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
    assert_eq!(big.version, 2);
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
    coli_models::experts::usage::merge(t.path(), &[(0, 1, 50), (0, 2, 30), (0, 3, 20), (1, 0, 10)])
        .unwrap();
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

/// The MTP layer is budgeted exactly when `--draft auto` would load it: every routed
/// expert still fits beside it.
#[test]
fn the_mtp_layer_is_budgeted_only_when_it_drafts() {
    let t = copy("deepseek_v3_mtp");
    let req = |ram: u64| PlanRequest {
        ram: Some(ram),
        ctx: 64,
        kv_slots: 1,
    };
    let (a, _) = coli_plan::analyze::analyze(t.path()).unwrap();
    // What the engine loads of the layer: its matrices, plus norms and biases (small); its
    // copies of the embedding and the head (37% of this fixture's layer) are never read.
    let mut model = coli_models::load(t.path()).unwrap();
    let (dense, experts) = model.mtp.as_deref_mut().unwrap().bytes();
    assert!(
        a.mtp_bytes >= dense + experts && a.mtp_bytes - (dense + experts) < a.mtp_bytes / 20,
        "analysed {} vs loaded matrices {}",
        a.mtp_bytes,
        dense + experts
    );
    let big = plan(t.path(), &req(1 << 30), false).unwrap();
    assert_eq!(big.mtp_bytes, a.mtp_bytes);
    assert_eq!(big.resident_weight_bytes, a.resident_bytes() + a.mtp_bytes);
    assert!(
        big.notes.iter().any(|n| n.contains("is budgeted")),
        "{:?}",
        big.notes
    );
    let all_experts = big.moe_layers as u64 * big.experts_per_layer as u64 * big.expert_bytes;
    let without = big.resident_bytes - a.mtp_bytes;
    for (ram, drafts) in [
        (without + all_experts + a.mtp_bytes, true),
        (without + all_experts + a.mtp_bytes - 1, false),
    ] {
        let p = plan(t.path(), &req(ram), false).unwrap();
        assert_eq!(p.mtp_bytes > 0, drafts, "ram {ram}: {:?}", p.notes);
        assert_eq!(p.cap_per_layer, p.experts_per_layer, "ram {ram}");
        assert_eq!(p.resident_bytes, without + p.mtp_bytes, "ram {ram}");
    }
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
    let err = err.to_string();
    assert!(err.contains("unsupported model_type \"mamba9\""), "{err}");
}
