//! coli int4 containers keep one f32 scale per 64 weights, an eighth of the int4 bytes:
//! they are expert bytes, streamed with their matrices and checked as they are read, not
//! resident weights read at load.

use coli_tests::{
    convert_error, copy_fixture, expert_read_errors, one_slot_stats, shard_header, shard_tensors,
    Reference,
};

const FIXTURE: &str = "olmoe_int4_container";
const SHARD: &str = "model-00002-of-00002.safetensors";

#[test]
fn int4_group_scales_are_streamed_with_their_experts() {
    let r = Reference::load(FIXTURE);
    let tensors = shard_tensors(&r.dir.join(SHARD), ".experts.", "");
    let scales = tensors.iter().filter(|t| t.0.ends_with("_scale")).count();
    assert!(scales > 0 && scales * 2 == tensors.len(), "{tensors:?}");
    // The census counts the scales with the matrices: both are what the store reads.
    let m = coli_models::load(&r.dir).unwrap();
    let stored: usize = tensors.iter().map(|(_, s, e)| e - s).sum();
    assert_eq!(m.expert_census().total_bytes as usize, stored);
    // One slot per layer: every expert used is read, scales included.
    let (stats, per_expert) = one_slot_stats(&r.dir, &r.ids());
    assert!(stats.misses > 0);
    assert_eq!(stats.bytes_read, stats.misses * per_expert, "{stats:?}");
}

#[test]
fn an_infinite_int4_scale_is_an_error_when_its_expert_is_read() {
    // Every routed expert's first group scale made +inf: whichever expert a token routes
    // to, reading it fails with the reason, on every placement.
    let t = copy_fixture(FIXTURE);
    let shard = t.path().join(SHARD);
    let (_, data, mut bytes) = shard_header(&shard);
    for (_, start, _) in shard_tensors(&shard, ".experts.", "_scale") {
        bytes[data + start..data + start + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    }
    std::fs::write(&shard, bytes).unwrap();
    for e in expert_read_errors(t.path(), &Reference::load(FIXTURE).ids()) {
        assert!(e.contains("scale 0 is inf, not finite"), "{e}");
    }
    // Converting reads every scale: refused too, with nothing written.
    let e = convert_error(t.path());
    assert!(e.contains("not finite"), "{e}");
}
