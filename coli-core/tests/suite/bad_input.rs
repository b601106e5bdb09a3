//! Bad input gives named errors (issue 12): crafted GGUF and safetensors files, truncated
//! shards before and after opening, duplicate JSON keys.

use std::path::Path;

use coli_core::fuzzing::{safetensors_file, GgufBuilder};
use coli_core::gguf::{self, GgmlType, GgufFile};
use coli_core::model_dir::parse_index;
use coli_core::safetensors_header::parse_file_bytes;
use coli_core::{make_resident, CoreError, ModelDir};

fn gguf_err(bytes: &[u8]) -> String {
    match gguf::parse(bytes) {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    }
}

#[test]
fn gguf_zero_dim_quantized_tensor_is_an_error() {
    for ty in [2u32, 3, 8] {
        let e = gguf_err(&GgufBuilder::new().tensor("w", &[], ty, vec![]).build());
        assert!(e.contains("tensor \"w\": dims [] hold 1 elements"), "{e}");
        assert!(e.contains("not a whole number of"), "{e}");
    }
    // A 0-dim f32 is a scalar: accepted, one element.
    let (_, t) = gguf::parse(&GgufBuilder::new().tensor_f32("s", &[], &[2.5]).build()).unwrap();
    assert_eq!((t[0].numel(), t[0].range.len()), (1, 4));
}

/// Found by `cargo fuzz run gguf_model`: no elements (a zero dim), but a row of 2^62 f32
/// whose byte size overflows; refused by name, as a tensor of 2^62 x 2^2 is.
#[test]
fn gguf_zero_element_tensor_with_an_overflowing_row_is_an_error() {
    for dims in [[1u64 << 62, 0], [0, 1 << 62], [1 << 61, 4]] {
        let e = gguf_err(&GgufBuilder::new().tensor("w", &dims, 0, vec![]).build());
        assert!(
            e.contains("tensor \"w\": dims") && e.contains("overflow"),
            "{e}"
        );
    }
    // A zero-element tensor of a sane shape stays accepted (no bytes).
    let (_, t) = gguf::parse(&GgufBuilder::new().tensor("z", &[8, 0], 0, vec![]).build()).unwrap();
    assert_eq!((t[0].numel(), t[0].range.len()), (0, 0));
}

#[test]
fn dequantize_size_mismatch_is_an_error_not_an_assert() {
    let block = [0u8; 18];
    let mut out = vec![0.0; 33];
    let e = gguf::dequantize(GgmlType::Q4_0, &block, &mut out).unwrap_err();
    assert!(e.contains("18 bytes of Q4_0"), "{e}");
    assert!(e.contains("33 elements"), "{e}");
    let mut one = vec![0.0; 1];
    assert!(gguf::dequantize(GgmlType::Q4_0, &[], &mut one).is_err());
    // A partial block is refused too, even when the element count would round to it.
    let mut out = vec![0.0; 32];
    assert!(gguf::dequantize(GgmlType::Q4_0, &[0u8; 19], &mut out).is_err());
    assert!(gguf::dequantize(GgmlType::F32, &[0u8; 5], &mut [0.0]).is_err());
}

#[test]
fn gguf_duplicate_keys_and_tensor_names_are_errors() {
    let e = gguf_err(&GgufBuilder::new().u32("a.b", 1).u32("a.b", 2).build());
    assert!(e.contains("metadata key \"a.b\""), "{e}");
    assert!(e.contains("appears twice"), "{e}");
    let e = gguf_err(
        &GgufBuilder::new()
            .tensor_f32("w", &[1], &[1.0])
            .tensor_f32("w", &[1], &[2.0])
            .build(),
    );
    assert!(e.contains("tensor \"w\" appears twice"), "{e}");
}

#[test]
fn gguf_overlapping_or_misaligned_tensors_are_errors() {
    // Two entries over the same 64 bytes: an import would dequantize them twice each.
    let b = GgufBuilder::new()
        .tensor_f32("a", &[16], &[0.0; 16])
        .tensor_at("b", &[8], 0, 32);
    let e = gguf_err(&b.build());
    assert!(
        e.contains("\"a\"") && e.contains("\"b\"") && e.contains("overlap"),
        "{e}"
    );
    // Hidden behind a zero-size entry in between: still found.
    let b = GgufBuilder::new()
        .tensor_f32("a", &[16], &[0.0; 16])
        .tensor_at("z", &[0], 0, 32)
        .tensor_at("c", &[4], 0, 32);
    assert!(gguf_err(&b.build()).contains("overlap"));
    let b = GgufBuilder::new()
        .tensor_f32("a", &[16], &[0.0; 16])
        .tensor_at("b", &[1], 0, 4);
    let e = gguf_err(&b.build());
    assert!(
        e.contains("offset 4 is not a multiple of the alignment 32"),
        "{e}"
    );
}

#[test]
fn gguf_file_truncated_after_open_is_an_io_error() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("m.gguf");
    let bytes = GgufBuilder::new()
        .tensor_f32("a", &[4], &[1.0, 2.0, 3.0, 4.0])
        .build();
    std::fs::write(&p, &bytes).unwrap();
    let f = GgufFile::open(&p).unwrap();
    let t = f.tensor("a").unwrap().clone();
    assert_eq!(f.dequantize(&t).unwrap(), [1.0, 2.0, 3.0, 4.0]);
    // Shrink the file under the open GgufFile: reads are pread, so an error, not SIGBUS.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(bytes.len() as u64 - 8)
        .unwrap();
    match f.dequantize(&t) {
        Err(CoreError::Io { path, .. }) => assert_eq!(path, p),
        other => panic!("expected an I/O error naming the file, got {other:?}"),
    }
    // An entry edited to disagree with its range is refused by name.
    let mut bad = t.clone();
    bad.dims = vec![5];
    let e = f.dequantize(&bad).unwrap_err().to_string();
    assert!(
        e.contains("tensor \"a\": 5 F32 elements need 20 bytes, the entry spans 16"),
        "{e}"
    );
}

#[test]
fn gguf_empty_file_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("empty.gguf");
    std::fs::write(&p, b"").unwrap();
    let e = GgufFile::open(&p).err().expect("refused").to_string();
    assert!(e.contains("invalid GGUF"), "{e}");
}

const ENTRY_A: &str = r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;

#[test]
fn safetensors_overlap_hidden_by_a_zero_length_tensor_is_found() {
    // a = [0, 8), z = [4, 4) (empty), b = [6, 14): sorted a, z, b; neighbours a/z and z/b
    // do not overlap, a/b do.
    let h = format!(
        r#"{{{ENTRY_A},"z":{{"dtype":"F32","shape":[0],"data_offsets":[4,4]}},"b":{{"dtype":"U8","shape":[8],"data_offsets":[6,14]}}}}"#
    );
    let e = parse_file_bytes(&safetensors_file(&h, 16)).unwrap_err();
    assert!(e.contains("\"a\" (data_offsets [0, 8])"), "{e}");
    assert!(e.contains("\"b\" (data_offsets [6, 14]) overlap"), "{e}");
    // A long tensor overlapping one past its neighbour: a = [0, 16), b = [2, 4), c = [8, 12).
    let h = r#"{"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"c":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#;
    assert!(parse_file_bytes(&safetensors_file(h, 16))
        .unwrap_err()
        .contains("overlap"));
    // Zero-length tensors anywhere, and adjacent tensors, are fine.
    let h = format!(
        r#"{{{ENTRY_A},"z":{{"dtype":"F32","shape":[0],"data_offsets":[4,4]}},"y":{{"dtype":"F32","shape":[0],"data_offsets":[8,8]}},"b":{{"dtype":"U8","shape":[8],"data_offsets":[8,16]}}}}"#
    );
    let ok = parse_file_bytes(&safetensors_file(&h, 16)).unwrap();
    assert_eq!(ok.tensors.len(), 4);
}

#[test]
fn safetensors_duplicate_keys_are_errors() {
    let cases = [
        // The same tensor twice (the typed path).
        format!("{{{ENTRY_A},{ENTRY_A}}}"),
        // Twice with different entries: last-wins would silently pick the second.
        format!(r#"{{{ENTRY_A},"a":{{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}}}"#),
        // A key repeated inside __metadata__, and __metadata__ repeated.
        format!(r#"{{"__metadata__":{{"format":"pt","format":"np"}},{ENTRY_A}}}"#),
        format!(r#"{{"__metadata__":{{}},"__metadata__":{{"x":"y"}},{ENTRY_A}}}"#),
        // A field repeated inside one entry.
        r#"{"a":{"dtype":"F32","dtype":"U8","shape":[2],"data_offsets":[0,8]}}"#.to_string(),
    ];
    for h in &cases {
        let e = parse_file_bytes(&safetensors_file(h, 8)).unwrap_err();
        assert!(e.contains("appears twice"), "{h}: {e}");
    }
    let e = parse_file_bytes(&safetensors_file(&cases[2], 8)).unwrap_err();
    assert!(e.contains("\"format\""), "{e}");
}

#[test]
fn index_duplicate_tensor_names_are_errors() {
    let p = Path::new("model.safetensors.index.json");
    let text = br#"{"weight_map":{"a":"x.safetensors","a":"y.safetensors"}}"#;
    let e = parse_index(p, text).unwrap_err().to_string();
    assert!(e.contains("\"a\" appears twice"), "{e}");
    let (files, map) = parse_index(
        p,
        br#"{"weight_map":{"a":"y.safetensors","b":"x.safetensors"}}"#,
    )
    .unwrap();
    assert_eq!(files, ["x.safetensors", "y.safetensors"]);
    assert_eq!(map["a"], "y.safetensors");
}

/// A model directory with one shard of two f32 tensors; returns the shard's path.
fn model_dir(root: &Path) -> std::path::PathBuf {
    std::fs::write(root.join("config.json"), r#"{"model_type":"llama"}"#).unwrap();
    let h = r#"{"a":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]},"b":{"dtype":"F32","shape":[1024],"data_offsets":[4096,8192]}}"#;
    let mut bytes = safetensors_file(h, 8192);
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&7.5f32.to_le_bytes());
    let p = root.join("model.safetensors");
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn shard_truncated_before_load_is_a_named_error() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = model_dir(tmp.path());
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let e = ModelDir::open(tmp.path()).unwrap_err();
    match &e {
        CoreError::Header { path, msg } => {
            assert_eq!(path, &shard);
            assert!(msg.contains("tensor \"b\": data_offsets [4096, 8192] lie outside the data section of 8092 bytes"), "{msg}");
        }
        other => panic!("expected a header error, got {other:?}"),
    }
    // Truncated inside the header, and to nothing.
    for cut in [20, 0] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let e = ModelDir::open(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("invalid safetensors header"), "{cut}: {e}");
    }
}

#[test]
fn shard_truncated_after_open_fails_make_resident_with_an_io_error() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = model_dir(tmp.path());
    let dir = ModelDir::open(tmp.path()).unwrap();
    let b = dir.tensor("b").unwrap();
    let resident = make_resident(&[&b]).unwrap();
    assert_eq!(resident[0].to_f32_vec().unwrap()[1023], 7.5);
    // Truncate under the open mapping. make_resident reads with pread: an error naming the
    // shard, not a SIGBUS. (Reading `b.bytes()` now would fault: see the report.)
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    match make_resident(&[&b]) {
        Err(CoreError::Io { path, source }) => {
            assert_eq!(path, shard);
            assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
    // The copy made before the truncation is unaffected.
    assert_eq!(resident[0].to_f32_vec().unwrap()[1023], 7.5);
}

#[test]
fn to_f32_vec_after_truncation_is_an_io_error_not_sigbus() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = model_dir(tmp.path());
    let dir = ModelDir::open(tmp.path()).unwrap();
    let b = dir.tensor("b").unwrap();
    assert_eq!(b.to_f32_vec().unwrap()[1023], 7.5);
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    match b.to_f32_vec() {
        Err(CoreError::Io { path, .. }) => assert_eq!(path, shard),
        other => panic!("expected an I/O error, got {:?}", other.map(|v| v.len())),
    }
    assert!(b.read_bytes().is_err());
    // "a" still lies wholly inside the file: read as before.
    assert_eq!(dir.tensor("a").unwrap().to_f32_vec().unwrap().len(), 1024);
}

#[test]
fn reads_after_open_go_to_the_validated_file_even_if_the_path_is_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = model_dir(tmp.path());
    let dir = ModelDir::open(tmp.path()).unwrap();
    // Another writer renames a new file over the path (as coli's own writers do).
    let other = tmp.path().join("other");
    std::fs::write(&other, vec![0xffu8; 9000]).unwrap();
    std::fs::rename(&other, &shard).unwrap();
    let b = dir.tensor("b").unwrap();
    assert_eq!(b.to_f32_vec().unwrap()[1023], 7.5);
    let r = make_resident(&[&b]).unwrap();
    assert_eq!(r[0].to_f32_vec().unwrap()[1023], 7.5);
}

/// Documents the remaining hazard: `TensorView::bytes()` of a non-resident view reads
/// through the mapping, and a page past the end of a shard truncated since it was mapped
/// raises SIGBUS (the process dies; no error can be returned). Run in a child process.
#[test]
fn bytes_through_a_truncated_mapping_raise_sigbus() {
    const CHILD: &str = "COLI_SIGBUS_CHILD_DIR";
    if let Some(root) = std::env::var_os(CHILD) {
        let root = Path::new(&root);
        let shard = root.join("model.safetensors");
        let dir = ModelDir::open(root).unwrap();
        let b = dir.tensor("b").unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .unwrap()
            .set_len(0)
            .unwrap();
        let sum: u32 = b.bytes().iter().map(|&x| x as u32).sum();
        println!("read {sum} without a fault");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    model_dir(tmp.path());
    // This test's name in the harness: its module path without the crate.
    let name = "bytes_through_a_truncated_mapping_raise_sigbus";
    let name = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    };
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--nocapture"])
        .env(CHILD, tmp.path())
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    const SIGBUS: i32 = 7; // Linux x86-64 and aarch64.
    assert_eq!(
        status.status.signal(),
        Some(SIGBUS),
        "{status:?}: {}",
        String::from_utf8_lossy(&status.stdout)
    );
}

/// The stricter checks (overlaps, duplicate keys, index names) still accept every committed
/// fixture checkpoint, and every tensor in them converts.
#[test]
fn committed_fixtures_still_open() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut opened = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("config.json").is_file() {
            continue;
        }
        let m = ModelDir::open(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for name in m.tensor_names() {
            let t = m.tensor(name).unwrap();
            if t.dtype().is_ok() {
                assert_eq!(t.to_f32_vec().unwrap().len(), t.numel(), "{name}");
            }
        }
        opened += 1;
    }
    assert!(
        opened >= 20,
        "only {opened} fixtures found in {}",
        root.display()
    );
}
