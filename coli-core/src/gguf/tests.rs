use super::*;
use proptest::prelude::*;

fn s(out: &mut Vec<u8>, x: &str) {
    out.extend((x.len() as u64).to_le_bytes());
    out.extend(x.as_bytes());
}

/// A GGUF with one u32 key and one Q4_1 tensor of 32 elements.
fn tiny() -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend(3u32.to_le_bytes());
    v.extend(1u64.to_le_bytes());
    v.extend(1u64.to_le_bytes());
    s(&mut v, "llama.block_count");
    v.extend(4u32.to_le_bytes());
    v.extend(7u32.to_le_bytes());
    s(&mut v, "w");
    v.extend(1u32.to_le_bytes());
    v.extend(32u64.to_le_bytes());
    v.extend(3u32.to_le_bytes());
    v.extend(0u64.to_le_bytes());
    while !v.len().is_multiple_of(32) {
        v.push(0);
    }
    v.extend(half::f16::from_f32(0.5).to_bits().to_le_bytes());
    v.extend(half::f16::from_f32(-1.0).to_bits().to_le_bytes());
    v.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    v
}

#[test]
fn parses_and_dequantizes_q4_1_per_spec() {
    let buf = tiny();
    let (meta, tensors) = parse(&buf).unwrap();
    assert_eq!(meta["llama.block_count"], GgufValue::Int(7));
    let t = &tensors[0];
    assert_eq!(
        (t.name.as_str(), t.ty, t.shape()),
        ("w", GgmlType::Q4_1, vec![32])
    );
    let mut out = vec![0.0; 32];
    dequantize(t.ty, &buf[t.range.clone()], &mut out).unwrap();
    // Low nibbles hold j, high nibbles 15 - j: x = q * 0.5 - 1.
    for j in 0..16 {
        assert_eq!(out[j], j as f32 * 0.5 - 1.0);
        assert_eq!(out[j + 16], (15 - j) as f32 * 0.5 - 1.0);
    }
}

#[test]
fn q8_0_and_q4_0_per_spec() {
    let mut b = half::f16::from_f32(0.25).to_bits().to_le_bytes().to_vec();
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let mut out = vec![0.0; 32];
    dequantize(GgmlType::Q8_0, &b, &mut out).unwrap();
    assert_eq!(out[0], -4.0);
    assert_eq!(out[31], 3.75);
    let mut b = half::f16::from_f32(2.0).to_bits().to_le_bytes().to_vec();
    b.extend([0x9fu8; 16]);
    dequantize(GgmlType::Q4_0, &b, &mut out).unwrap();
    assert_eq!((out[0], out[16]), ((15.0 - 8.0) * 2.0, (9.0 - 8.0) * 2.0));
}

#[test]
fn truncations_are_errors() {
    let buf = tiny();
    for cut in [0, 3, 10, 30, 60, buf.len() - 1] {
        assert!(parse(&buf[..cut]).is_err(), "cut at {cut}");
    }
    let mut bad = buf.clone();
    bad[0] = b'X';
    assert!(parse(&bad).unwrap_err().contains("magic"));
}

/// A GGUF with one metadata key of type `ty` whose payload is `payload`.
fn one_key(ty: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend(3u32.to_le_bytes());
    v.extend(0u64.to_le_bytes());
    v.extend(1u64.to_le_bytes());
    s(&mut v, "general.name");
    v.extend(ty.to_le_bytes());
    v.extend(payload);
    v
}

#[test]
fn hostile_metadata_is_refused_by_key_without_allocating() {
    // A string that is not UTF-8.
    let mut p = 2u64.to_le_bytes().to_vec();
    p.extend([0xff, 0xfe]);
    let e = parse(&one_key(8, &p)).unwrap_err();
    assert!(e.contains("\"general.name\"") && e.contains("UTF-8"), "{e}");
    // An array claiming 2^60 elements: refused by the file size, not allocated.
    let mut p = 0u32.to_le_bytes().to_vec();
    p.extend((1u64 << 60).to_le_bytes());
    let e = parse(&one_key(9, &p)).unwrap_err();
    assert!(
        e.contains("\"general.name\"") && e.contains("exceeds the file size"),
        "{e}"
    );
    // A string of 2^60 bytes.
    let e = parse(&one_key(8, &(1u64 << 60).to_le_bytes())).unwrap_err();
    assert!(e.contains("exceeds the file size"), "{e}");
    // An unknown value type.
    let e = parse(&one_key(99, &[])).unwrap_err();
    assert!(
        e.contains("\"general.name\"") && e.contains("type 99"),
        "{e}"
    );
}

#[test]
fn bad_tensor_entries_are_refused_by_name() {
    let buf = tiny();
    // 24 header bytes, the key (8 + 17 + 4 + 4), the name (8 + 1), nd (4), then the
    // dim (8) at 70, the type id (4) at 78 and the offset (8) at 82.
    let entry = 78;
    let mut bad = buf.clone();
    bad[entry..entry + 4].copy_from_slice(&77u32.to_le_bytes());
    let e = parse(&bad).unwrap_err();
    assert!(
        e.contains("tensor \"w\"") && e.contains("ggml type 77"),
        "{e}"
    );
    // A row length that is not a whole number of blocks.
    let mut bad = buf.clone();
    bad[entry - 8..entry].copy_from_slice(&33u64.to_le_bytes());
    let e = parse(&bad).unwrap_err();
    assert!(
        e.contains("tensor \"w\"") && e.contains("block size"),
        "{e}"
    );
    // An offset past the end.
    let mut bad = buf.clone();
    bad[entry + 4..entry + 12].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = parse(&bad).unwrap_err();
    assert!(
        e.contains("tensor \"w\"") && e.contains("past the end"),
        "{e}"
    );
    // Data cut short.
    let e = parse(&buf[..buf.len() - 1]).unwrap_err();
    assert!(
        e.contains("tensor \"w\"") && e.contains("past the end"),
        "{e}"
    );
}

proptest! {
    #[test]
    fn mutated_files_never_panic(pos in 0usize..200, byte in any::<u8>()) {
        let mut buf = tiny();
        let p = pos % buf.len();
        buf[p] = byte;
        if let Ok((_, tensors)) = parse(&buf) {
            for t in tensors {
                prop_assert!(t.range.end <= buf.len());
            }
        }
    }
}
