//! coli int4 containers keep one f32 scale per 64 weights, an eighth of the int4 bytes:
//! they are expert bytes, streamed with their matrices and checked as they are read, not
//! resident weights read at load.

use coli_models::experts::{CacheSize, Placement};
use coli_tests::{copy_fixture, shard_header, Reference};

const FIXTURE: &str = "olmoe_int4_container";
const SHARD: &str = "model-00002-of-00002.safetensors";

/// The routed experts' tensors of `shard`: (name, start, end) in its data section.
fn expert_tensors(shard: &std::path::Path) -> Vec<(String, usize, usize)> {
    let (h, _, _) = shard_header(shard);
    let mut out: Vec<(String, usize, usize)> = h
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.contains(".experts."))
        .map(|(k, v)| {
            let o = &v["data_offsets"];
            (
                k.clone(),
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn int4_group_scales_are_streamed_with_their_experts() {
    let r = Reference::load(FIXTURE);
    let tensors = expert_tensors(&r.dir.join(SHARD));
    let scales = tensors.iter().filter(|t| t.0.ends_with("_scale")).count();
    assert!(scales > 0 && scales * 2 == tensors.len(), "{tensors:?}");
    // The census counts the scales with the matrices: both are what the store reads.
    let m = coli_models::load(&r.dir).unwrap();
    let stored: usize = tensors.iter().map(|(_, s, e)| e - s).sum();
    assert_eq!(m.expert_census().total_bytes as usize, stored);
    // One slot per layer: every expert used is read, scales included.
    let mut m = coli_models::load(&r.dir).unwrap();
    let p = Placement {
        cache: CacheSize::Slots(1),
        prefetch: coli_models::experts::Prefetch::Off,
        ..Default::default()
    };
    m.place_experts(&r.dir, &p).unwrap();
    let mut s = coli_models::Session::new(&m, 64);
    s.forward(&r.ids(), false).unwrap();
    let stats = m.store.as_ref().unwrap().stats();
    assert!(stats.misses > 0);
    let per_expert = m.expert_census().expert_bytes;
    assert_eq!(stats.bytes_read, stats.misses * per_expert, "{stats:?}");
}

#[test]
fn an_infinite_int4_scale_is_an_error_when_its_expert_is_read() {
    // Every routed expert's first group scale made +inf: whichever expert a token routes
    // to, reading it fails with the reason, on every placement (streamed, in place, all
    // copied into RAM at start).
    let t = copy_fixture(FIXTURE);
    let shard = t.path().join(SHARD);
    let (_, data, mut bytes) = shard_header(&shard);
    for (name, start, _) in expert_tensors(&shard) {
        if name.ends_with("_scale") {
            bytes[data + start..data + start + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
        }
    }
    std::fs::write(&shard, bytes).unwrap();
    let ids = Reference::load(FIXTURE).ids();
    for cache in [CacheSize::Slots(1), CacheSize::Auto, CacheSize::Off] {
        let mut m = coli_models::load(t.path()).unwrap();
        let p = Placement {
            cache,
            ..Default::default()
        };
        let e = match m.place_experts(t.path(), &p) {
            Err(e) => e.to_string(),
            Ok(()) => {
                let mut s = coli_models::Session::new(&m, 64);
                s.forward(&ids, false).unwrap_err().to_string()
            }
        };
        assert!(e.contains("scale 0 is inf, not finite"), "{cache:?}: {e}");
    }
    // Converting reads every scale: refused too, with nothing written.
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("bf16");
    let opts = coli_models::convert::ConvertOptions {
        experts: coli_models::convert::Target::Bf16,
        dense: coli_models::convert::Target::Bf16,
        shard_bytes: 1 << 30,
    };
    let e = coli_models::convert::convert(t.path(), &dest, &opts, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");
    assert!(!dest.exists());
}
