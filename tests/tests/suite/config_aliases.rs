//! Configs as `transformers` 5 saves them: each family's `attribute_map` alias (and
//! `partial_rotary_factor` inside `rope_parameters`) loads the fixture to the same logits,
//! bit for bit, as the hub spelling; both spellings disagreeing is a named error.

use coli_tests::Reference;
use serde_json::{Map, Value};

/// A copy of the fixture with its config rewritten by `edit`.
fn with_config(r: &Reference, edit: impl FnOnce(&mut Map<String, Value>)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    r.copy_files_to(tmp.path());
    let path = tmp.path().join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(cfg.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    tmp
}

fn logits(dir: &std::path::Path, ids: &[u32]) -> Result<Vec<u32>, String> {
    let m = coli_models::load(dir).map_err(|e| e.to_string())?;
    let mut s = coli_models::Session::new(&m, 64);
    let out = s.forward(ids, true).map_err(|e| e.to_string())?;
    Ok(out.iter().map(|v| v.to_bits()).collect())
}

/// Renames `key` to `alias` and checks the logits are unchanged; then puts `key` back
/// with a different value beside the alias and checks the load names both.
fn check_alias(fixture: &str, alias: &str, key: &str) {
    let r = Reference::load(fixture);
    let ids = &r.ids()[..6];
    let want = logits(&r.dir, ids).unwrap();
    let renamed = with_config(&r, |c| {
        let v = c
            .remove(key)
            .unwrap_or_else(|| panic!("{fixture}: no {key}"));
        c.insert(alias.into(), v);
    });
    let got = logits(renamed.path(), ids).unwrap_or_else(|e| panic!("{fixture} {alias}: {e}"));
    assert_eq!(got, want, "{fixture}: {alias} for {key}");
    let clash = with_config(&r, |c| {
        let v = c[key].as_u64().unwrap();
        c.insert(alias.into(), Value::from(v + 1));
    });
    let err = logits(clash.path(), ids).unwrap_err();
    assert!(err.contains(key) && err.contains(alias), "{fixture}: {err}");
}

#[test]
fn qwen3_moe_num_local_experts() {
    check_alias("qwen3_moe_headdim", "num_local_experts", "num_experts");
}

#[test]
fn mixtral_num_experts() {
    check_alias("mixtral_gqa", "num_experts", "num_local_experts");
}

#[test]
fn olmoe_num_local_experts() {
    check_alias("olmoe_gqa_clip", "num_local_experts", "num_experts");
}

#[test]
fn deepseek_v3_num_local_experts() {
    check_alias(
        "deepseek_v3_no_q_lora",
        "num_local_experts",
        "n_routed_experts",
    );
}

#[test]
fn glm4_moe_num_local_experts() {
    check_alias(
        "glm4_moe_partial_qknorm",
        "num_local_experts",
        "n_routed_experts",
    );
}

#[test]
fn glm_moe_dsa_num_local_experts() {
    check_alias("glm5_dsa_full", "num_local_experts", "n_routed_experts");
}

#[test]
fn deepseek_v4_num_local_experts_and_intermediate_size() {
    check_alias(
        "deepseek_v4_hash_csa",
        "num_local_experts",
        "n_routed_experts",
    );
    check_alias(
        "deepseek_v4_hash_csa",
        "intermediate_size",
        "moe_intermediate_size",
    );
}

#[test]
fn glm4_moe_rope_parameters_as_transformers_5_writes_them() {
    // transformers 5: no top-level rope_theta / rope_scaling / partial_rotary_factor; one
    // rope_parameters object holds them all. A factor other than the default (0.5), so that
    // losing it would change the logits.
    let r = Reference::load("glm4_moe_partial_qknorm");
    let ids = &r.ids()[..6];
    let default = logits(&r.dir, ids).unwrap();
    let v4 = with_config(&r, |c| {
        c.insert("partial_rotary_factor".into(), Value::from(0.25));
    });
    let want = logits(v4.path(), ids).unwrap();
    assert_ne!(want, default, "the factor must matter on this fixture");
    let v5 = with_config(&r, |c| {
        let theta = c.remove("rope_theta").unwrap();
        assert!(c.remove("rope_scaling").is_none_or(|v| v.is_null()));
        c.remove("partial_rotary_factor");
        let rope = serde_json::json!({"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.25});
        c.insert("rope_parameters".into(), rope);
    });
    assert_eq!(logits(v5.path(), ids).unwrap(), want);
}

#[test]
fn gpt_oss_num_experts() {
    check_alias("gpt_oss_window_yarn", "num_experts", "num_local_experts");
}

#[test]
fn minimax_m2_num_experts() {
    check_alias(
        "minimax_m2_partial_rope",
        "num_experts",
        "num_local_experts",
    );
}

/// The hub's MiniMax-M2 config says `rotary_dim` and `rope_theta` at the top level;
/// transformers 5 writes `partial_rotary_factor` and `rope_theta` inside
/// `rope_parameters` (and keeps `rotary_dim`). Both load to the same bits; `rotary_dim`
/// disagreeing with the factor is refused naming both.
#[test]
fn minimax_m2_rotary_dim_as_the_hub_and_transformers_5_write_it() {
    let r = Reference::load("minimax_m2_partial_rope");
    let ids = &r.ids()[..6];
    let want = logits(&r.dir, ids).unwrap();
    let hub = with_config(&r, |c| {
        let rp = c.remove("rope_parameters").unwrap();
        c.insert("rope_theta".into(), rp["rope_theta"].clone());
        assert_eq!(c["rotary_dim"], 16);
    });
    assert_eq!(logits(hub.path(), ids).unwrap(), want);
    let clash = with_config(&r, |c| {
        c.insert("rotary_dim".into(), Value::from(8));
    });
    let err = logits(clash.path(), ids).unwrap_err();
    assert!(
        err.contains("rotary_dim") && err.contains("partial_rotary_factor"),
        "{err}"
    );
}

/// Qwen3-Next's hub configs write `partial_rotary_factor` and `rope_theta` at the top
/// level; transformers 5 writes them inside `rope_parameters`. Both load the same model
/// (and the key is read: another factor changes the logits); the two spellings
/// disagreeing is a named error.
#[test]
fn qwen3_next_partial_rotary_factor_in_either_place() {
    let r = Reference::load("qwen3_next_hybrid");
    let ids = &r.ids()[..6];
    let want = logits(&r.dir, ids).unwrap();
    let hub = |factor: f64| {
        with_config(&r, |c| {
            let rope = c.remove("rope_parameters").unwrap();
            c.insert("rope_theta".into(), rope["rope_theta"].clone());
            c.insert("partial_rotary_factor".into(), Value::from(factor));
        })
    };
    assert_eq!(logits(hub(0.25).path(), ids).unwrap(), want);
    assert_ne!(logits(hub(0.5).path(), ids).unwrap(), want);
    let clash = with_config(&r, |c| {
        c.insert("partial_rotary_factor".into(), Value::from(0.5));
    });
    let err = logits(clash.path(), ids).unwrap_err();
    assert!(err.contains("partial_rotary_factor"), "{err}");
}
