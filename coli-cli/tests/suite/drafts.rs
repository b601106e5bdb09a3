//! `coli run --draft off|lookup|mtp|auto` and `--mtp-depth`: the same tokens whatever
//! drafts, with the drafting stats in `--json`; MTP asked of a checkpoint without the
//! layer is said, not silently ignored.

use std::process::{Command, Output};

use coli_tests::Reference;
use serde_json::Value;

fn coli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .env_remove("COLI_MODEL")
        .env("COLI_NO_USAGE", "1")
        .output()
        .expect("coli runs")
}

/// Runs greedy generation on fixture `name` with extra flags; the `--json` result.
fn run(name: &str, extra: &[&str]) -> (Value, String) {
    let r = Reference::load(name);
    let prompt: Vec<String> = r.ids()[..8].iter().map(u32::to_string).collect();
    let prompt = prompt.join(",");
    let dir = r.dir.to_str().unwrap().to_string();
    let mut args = vec![
        "run",
        "--model",
        &dir,
        "--prompt-ids",
        &prompt,
        "--max-tokens",
        "24",
        "--ignore-eos",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = coli(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{name} {extra:?}: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    (serde_json::from_str(line).unwrap(), stderr)
}

#[test]
fn every_draft_mode_gives_the_same_tokens() {
    for name in ["deepseek_v3_mtp", "glm4_moe_mtp", "glm5_mtp"] {
        let (off, _) = run(name, &["--draft", "off"]);
        assert_eq!(off["stats"]["draft_proposed"], 0, "{name}");
        for flags in [
            &["--draft", "mtp"][..],
            &["--draft", "mtp", "--mtp-depth", "3"],
            &["--draft", "auto"],
            &["--draft", "lookup"],
            &["--draft", "mtp", "--temperature", "0"],
        ] {
            let (got, stderr) = run(name, flags);
            assert_eq!(
                got["generated_ids"], off["generated_ids"],
                "{name} {flags:?}"
            );
            assert!(!stderr.contains("no usable"), "{name} {flags:?}: {stderr}");
            if flags[1] != "lookup" {
                // Every expert fits the cache here, so "auto" drafts by MTP too.
                assert!(
                    got["stats"]["draft_proposed"].as_u64().unwrap() > 0,
                    "{name} {flags:?}: {got}"
                );
            }
        }
    }
}

/// Streaming (two cached experts of eight per layer): "auto" leaves MTP out (its experts
/// would be read beside the cache's budget: it drafts what lookup alone drafts), "mtp"
/// still drafts; same tokens.
#[test]
fn auto_leaves_mtp_out_when_experts_are_streamed() {
    let (off, _) = run("deepseek_v3_mtp", &["--draft", "off", "--cap", "2"]);
    let (auto, _) = run("deepseek_v3_mtp", &["--draft", "auto", "--cap", "2"]);
    let (lookup, _) = run("deepseek_v3_mtp", &["--draft", "lookup", "--cap", "2"]);
    let (mtp, _) = run("deepseek_v3_mtp", &["--draft", "mtp", "--cap", "2"]);
    assert_eq!(auto["generated_ids"], off["generated_ids"]);
    assert_eq!(mtp["generated_ids"], off["generated_ids"]);
    for k in ["draft_proposed", "drafted_tokens", "draft_forwards"] {
        assert_eq!(
            auto["stats"][k], lookup["stats"][k],
            "{k}: {auto} vs {lookup}"
        );
    }
    // Without the cap, auto drafts by MTP besides lookup.
    let (all, _) = run("deepseek_v3_mtp", &["--draft", "auto"]);
    assert!(
        all["stats"]["draft_proposed"].as_u64() > lookup["stats"]["draft_proposed"].as_u64(),
        "{all}"
    );
    assert!(
        mtp["stats"]["draft_proposed"].as_u64().unwrap() > 0,
        "{mtp}"
    );
    assert_eq!(off["stats"]["cap_per_layer"], 2, "{off}");
    assert!(off["stats"]["disk_bytes"].as_u64().unwrap() > 0, "{off}");
}

#[test]
fn mtp_without_the_layer_is_said_and_changes_nothing() {
    let (off, _) = run("llama_gqa", &["--draft", "off"]);
    let (mtp, stderr) = run("llama_gqa", &["--draft", "mtp"]);
    assert_eq!(mtp["generated_ids"], off["generated_ids"]);
    assert_eq!(mtp["stats"]["draft_proposed"], 0);
    assert!(
        stderr.contains("no usable multi-token-prediction layer"),
        "{stderr}"
    );
    // A depth outside 1..=16 is a usage error.
    let r = Reference::load("llama_gqa");
    let out = coli(&[
        "run",
        "--model",
        r.dir.to_str().unwrap(),
        "--mtp-depth",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mtp-depth"));
}
