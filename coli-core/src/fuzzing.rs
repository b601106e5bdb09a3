//! Entry points shared by the cargo-fuzz targets (`fuzz/`, nightly) and the stable seeded
//! tests (`coli-core/tests/suite/fuzz_seeded.rs`), plus the input makers both use.
//!
//! Each entry point feeds untrusted bytes to one parser exactly as coli does and returns
//! whether the parser accepted them. Errors are fine; a panic is a bug found: either the parser panicked, or it accepted input that
//! breaks the contract checked here (ranges inside the file, sizes matching shapes,
//! no overlapping tensors, every accepted tensor convertible).

use std::path::Path;

use crate::config::{RawConfig, RopeScaling};
use crate::dtype::DType;
use crate::gguf::{self, GgmlType};
use crate::model_dir::{index_file_names_from, parse_index};
use crate::safetensors_header::{dtype_size, parse_file_bytes};

/// Every ggml type coli reads.
pub const GGML_TYPES: [GgmlType; 23] = GgmlType::ALL;

/// A whole safetensors file: header validation, then every tensor coli computes with
/// converted to f32.
pub fn safetensors(data: &[u8]) -> bool {
    let h = match parse_file_bytes(data) {
        Ok(h) => h,
        Err(e) => {
            assert!(!e.is_empty(), "an error without a message");
            return false;
        }
    };
    let mut spans = Vec::new();
    for (name, e) in &h.tensors {
        let r = &e.file_range;
        assert!(
            h.data_start <= r.start && r.start <= r.end && r.end <= data.len(),
            "{name}: accepted range {r:?} outside the data section"
        );
        let numel = e.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let want = numel.and_then(|n| n.checked_mul(dtype_size(&e.dtype)?));
        assert_eq!(want, Some(r.len()), "{name}: accepted size mismatch");
        if let Some(dt) = DType::from_safetensors_name(&e.dtype) {
            assert_eq!(dt.to_f32_vec(&data[r.clone()]).len(), numel.unwrap_or(0));
        }
        if !r.is_empty() {
            spans.push(r.clone());
        }
    }
    spans.sort_by_key(|r| r.start);
    for w in spans.windows(2) {
        assert!(w[0].end <= w[1].start, "accepted overlapping tensors");
    }
    true
}

/// `model.safetensors.index.json`: the full parse and the names-only parse agree, and
/// every shard name is a plain file name.
pub fn safetensors_index(data: &[u8]) -> bool {
    let path = Path::new("model.safetensors.index.json");
    let full = parse_index(path, data);
    let names = index_file_names_from(path, data);
    match (&full, &names) {
        (Ok((files, map)), Ok(files2)) => {
            assert_eq!(files, files2, "the two index parses disagree on the shards");
            assert!(files.windows(2).all(|w| w[0] < w[1]), "shards not sorted");
            for f in map.values() {
                assert!(
                    files.binary_search(f).is_ok(),
                    "{f} missing from the shards"
                );
            }
            for f in files {
                assert!(!f.contains('/') && !f.contains('\\') && f != "..");
            }
        }
        (Err(a), Err(b)) => {
            assert!(!a.to_string().is_empty() && !b.to_string().is_empty());
            return false;
        }
        _ => panic!("the two index parses disagree: {full:?} vs {names:?}"),
    }
    true
}

/// A GGUF file: parse, then dequantize every tensor; and raw bytes dequantized as each type.
pub fn gguf(data: &[u8]) -> bool {
    let parsed = gguf::parse(data);
    if let Err(e) = &parsed {
        assert!(!e.is_empty(), "an error without a message");
    }
    if let Ok((_, tensors)) = &parsed {
        let mut total = 0usize;
        for t in tensors {
            assert!(t.range.start <= t.range.end && t.range.end <= data.len());
            let numel = t
                .dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .expect("accepted dims do not overflow");
            let mut out = vec![0.0; numel];
            gguf::dequantize(t.ty, &data[t.range.clone()], &mut out)
                .expect("an accepted tensor dequantizes");
            total += numel;
        }
        // Tensors do not overlap, so the output is bounded by the file (at most 256
        // elements per 50 bytes, IQ1_S; a 0-dim F32 scalar is 1 per 4).
        assert!(
            total <= data.len() * 6,
            "{total} elements from {} bytes",
            data.len()
        );
    }
    for ty in GGML_TYPES {
        let (bs, bb) = ty.block();
        let whole = data.len() / bb * bb;
        let mut out = vec![0.0; whole / bb * bs];
        gguf::dequantize(ty, &data[..whole], &mut out).expect("whole blocks dequantize");
        out.push(0.0);
        assert!(gguf::dequantize(ty, &data[..whole], &mut out).is_err());
        if whole != data.len() {
            out.pop();
            assert!(gguf::dequantize(ty, data, &mut out).is_err());
        }
    }
    parsed.is_ok()
}

/// `config.json` and every shared key coli reads from it.
pub fn config(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let Ok(c) = RawConfig::parse(Path::new("config.json"), text) else {
        return false;
    };
    let _ = c.model_type();
    let _ = c.eos_token_ids();
    if let Ok(Some((r, cols))) = c.fp8_block_size() {
        assert!(r > 0 && cols > 0);
    }
    if let Ok(p) = c.rope_parameters(10000.0) {
        assert!(p.theta.is_finite() && p.theta > 1.0);
        if let RopeScaling::Yarn(y) = &p.scaling {
            assert!(y.factor > 0.0);
            let _ = y.attention_factor();
        }
    }
    true
}

/// A small deterministic generator (SplitMix64), so seeded runs repeat exactly.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

const INTERESTING_U64: [u64; 12] = [
    0,
    1,
    2,
    7,
    31,
    32,
    0x7f,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
    u64::MAX - 7,
];

const INTERESTING_TEXT: [&str; 10] = [
    "0",
    "-1",
    "18446744073709551616",
    "1e999",
    "\"\"",
    "null",
    "[]",
    "{}",
    "4294967296",
    "\"a\":1,\"a\":2",
];

/// A mutation of `seed`: one to four of bit flips, interesting bytes, truncation,
/// length fields (u32/u64) overwritten with edge values, inserted, deleted or
/// duplicated runs, and numbers in text replaced.
pub fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = v.len();
        match rng.below(10) {
            0 if len > 0 => {
                let p = rng.below(len);
                v[p] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let p = rng.below(len);
                v[p] = [0, 1, 0x7f, 0x80, 0xff, b'"', b'{', b'['][rng.below(8)];
            }
            2 => v.truncate(rng.below(len + 1)),
            3 if len >= 8 => {
                // Length fields are little-endian u64s at 8-byte (safetensors) or 4-byte
                // (GGUF) boundaries; hit those more often than random places.
                let p = if rng.below(2) == 0 {
                    rng.below(len - 7)
                } else {
                    (rng.below(len - 7) / 4) * 4
                };
                let x = INTERESTING_U64[rng.below(INTERESTING_U64.len())]
                    .wrapping_add(rng.below(3) as u64)
                    .wrapping_sub(1);
                v[p..p + 8].copy_from_slice(&x.to_le_bytes());
            }
            4 if len >= 4 => {
                let p = (rng.below(len - 3) / 4) * 4;
                let x = INTERESTING_U64[rng.below(INTERESTING_U64.len())] as u32;
                v[p..p + 4].copy_from_slice(&x.to_le_bytes());
            }
            5 => {
                let p = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let ins = rng.bytes(n);
                v.splice(p..p, ins);
            }
            6 if len > 0 => {
                let p = rng.below(len);
                let n = 1 + rng.below((len - p).min(64));
                v.drain(p..p + n);
            }
            7 if len > 0 => {
                let p = rng.below(len);
                let n = 1 + rng.below((len - p).min(64));
                let chunk = v[p..p + n].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, chunk);
            }
            8 => {
                // A number in text replaced by an edge value.
                let digits: Vec<usize> = (0..len).filter(|&i| v[i].is_ascii_digit()).collect();
                if !digits.is_empty() {
                    let mut p = digits[rng.below(digits.len())];
                    while p > 0 && v[p - 1].is_ascii_digit() {
                        p -= 1;
                    }
                    let mut e = p;
                    while e < len && v[e].is_ascii_digit() {
                        e += 1;
                    }
                    let t = INTERESTING_TEXT[rng.below(INTERESTING_TEXT.len())];
                    v.splice(p..e, t.bytes());
                }
            }
            _ => {
                let p = rng.below(len + 1);
                let n = rng.below(8);
                let r = rng.bytes(n);
                v.splice(p..p, r);
            }
        }
    }
    v
}

/// A GGUF file as a model (`ModelDir::open`): metadata to config, every tensor named for
/// its architecture, stacked experts sliced, Q/K rows reordered; then every view read. It
/// never panics, and every view it hands out lies inside the file with the bytes its
/// type and shape need. The bytes are written to a temp file first (a model is a path).
pub fn gguf_model(data: &[u8]) -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "coli-fuzz-{}-{}.gguf",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    if std::fs::write(&path, data).is_err() {
        return false;
    }
    let accepted = match crate::ModelDir::open(&path) {
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without a message");
            false
        }
        Ok(md) => {
            for name in md.tensor_names() {
                let Ok(v) = md.tensor(name) else { continue };
                let range = v.file_range();
                assert!(
                    range.end <= data.len() as u64,
                    "{name}: {range:?} past the file"
                );
                let rows: usize = v.shape[..v.shape.len().saturating_sub(1)].iter().product();
                let cols = v.shape.last().copied().unwrap_or(1);
                if let Some(ty) = GgmlType::from_name(&v.dtype_name) {
                    assert_eq!(
                        range.end - range.start,
                        (rows * ty.row_bytes(cols)) as u64,
                        "{name}: bytes for {:?} {:?}",
                        ty,
                        v.shape
                    );
                }
                assert_eq!(
                    v.read_bytes().expect("an accepted view reads").len() as u64,
                    range.end - range.start
                );
            }
            true
        }
    };
    let _ = std::fs::remove_file(&path);
    accepted
}

/// Builds GGUF files (version 3) for tests: metadata, then tensors laid out in order at
/// the alignment, unless an entry's offset is given explicitly.
#[derive(Clone, Debug, Default)]
pub struct GgufBuilder {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<BuiltTensor>,
}

/// One tensor entry: name, dims innermost first, ggml type id, data, explicit offset.
type BuiltTensor = (String, Vec<u64>, u32, Vec<u8>, Option<u64>);

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufBuilder {
    /// An empty file.
    pub fn new() -> GgufBuilder {
        GgufBuilder::default()
    }
    fn key(&mut self, key: &str, ty: u32) -> &mut Vec<u8> {
        self.n_kv += 1;
        put_str(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        &mut self.kv
    }
    /// A u32 value.
    pub fn u32(mut self, key: &str, v: u32) -> Self {
        self.key(key, 4).extend(v.to_le_bytes());
        self
    }
    /// A u64 value.
    pub fn u64(mut self, key: &str, v: u64) -> Self {
        self.key(key, 10).extend(v.to_le_bytes());
        self
    }
    /// An f32 value.
    pub fn f32(mut self, key: &str, v: f32) -> Self {
        self.key(key, 6).extend(v.to_le_bytes());
        self
    }
    /// A bool value.
    pub fn bool(mut self, key: &str, v: bool) -> Self {
        self.key(key, 7).push(v as u8);
        self
    }
    /// A string value.
    pub fn str(mut self, key: &str, v: &str) -> Self {
        put_str(self.key(key, 8), v);
        self
    }
    /// An array of strings.
    pub fn strs(mut self, key: &str, v: &[&str]) -> Self {
        let out = self.key(key, 9);
        out.extend(8u32.to_le_bytes());
        out.extend((v.len() as u64).to_le_bytes());
        for s in v {
            put_str(out, s);
        }
        self
    }
    /// An array of i32.
    pub fn i32s(mut self, key: &str, v: &[i32]) -> Self {
        let out = self.key(key, 9);
        out.extend(5u32.to_le_bytes());
        out.extend((v.len() as u64).to_le_bytes());
        for x in v {
            out.extend(x.to_le_bytes());
        }
        self
    }
    /// Any metadata value, as the reader returns it (integers written as i64 or u64,
    /// floats as f64, arrays typed by their first element).
    pub fn value(mut self, key: &str, v: &gguf::GgufValue) -> Self {
        let ty = value_type(v);
        put_value(self.key(key, ty), v);
        self
    }
    /// A tensor: dims innermost first (GGUF order), ggml type id, raw data.
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data, None));
        self
    }
    /// An f32 tensor (type 0) from values.
    pub fn tensor_f32(self, name: &str, dims: &[u64], values: &[f32]) -> Self {
        let data = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, dims, 0, data)
    }
    /// A tensor entry with an explicit data offset and no data of its own.
    pub fn tensor_at(mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
        self.tensors.push((
            name.to_string(),
            dims.to_vec(),
            ty,
            Vec::new(),
            Some(offset),
        ));
        self
    }
    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        const ALIGN: usize = 32;
        let mut v = b"GGUF".to_vec();
        v.extend(3u32.to_le_bytes());
        v.extend((self.tensors.len() as u64).to_le_bytes());
        v.extend(self.n_kv.to_le_bytes());
        v.extend(&self.kv);
        let mut data = Vec::new();
        for (name, dims, ty, bytes, offset) in &self.tensors {
            put_str(&mut v, name);
            v.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                v.extend(d.to_le_bytes());
            }
            v.extend(ty.to_le_bytes());
            let off = match offset {
                Some(o) => *o,
                None => {
                    data.resize(data.len().next_multiple_of(ALIGN), 0);
                    let o = data.len() as u64;
                    data.extend(bytes);
                    o
                }
            };
            v.extend(off.to_le_bytes());
        }
        v.resize(v.len().next_multiple_of(ALIGN), 0);
        v.extend(data);
        v
    }
}

fn value_type(v: &gguf::GgufValue) -> u32 {
    use gguf::GgufValue::*;
    match v {
        Int(i) if *i > i64::MAX as i128 => 10,
        Int(_) => 11,
        Float(_) => 12,
        Bool(_) => 7,
        Str(_) => 8,
        Array(_) => 9,
    }
}

fn put_value(out: &mut Vec<u8>, v: &gguf::GgufValue) {
    use gguf::GgufValue::*;
    match v {
        Int(i) if value_type(v) == 10 => out.extend((*i as u64).to_le_bytes()),
        Int(i) => out.extend((*i as i64).to_le_bytes()),
        Float(f) => out.extend(f.to_le_bytes()),
        Bool(b) => out.push(*b as u8),
        Str(x) => put_str(out, x),
        Array(items) => {
            let et = items.first().map_or(8, value_type);
            out.extend(et.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for x in items {
                put_value(out, x);
            }
        }
    }
}

/// A GGUF split into `n` parts as `gguf-split` and `convert_hf_to_gguf.py
/// --split-max-tensors` write them: the tensors in order, about `len / n` to a part; every
/// part carries `split.no` (from 0), `split.count` and `split.tensors.count`; the first
/// part also all of the model's metadata. Name part `k` `{stem}-0000k-of-0000n.gguf`.
pub fn split_gguf(bytes: &[u8], n: usize) -> Result<Vec<Vec<u8>>, String> {
    rewrite_gguf(bytes, n, |_| {})
}

/// [`split_gguf`] with the model's metadata edited first (to damage it in a test).
pub fn rewrite_gguf(
    bytes: &[u8],
    n: usize,
    edit: impl FnOnce(&mut std::collections::BTreeMap<String, gguf::GgufValue>),
) -> Result<Vec<Vec<u8>>, String> {
    let (mut meta, tensors) = gguf::parse(bytes)?;
    edit(&mut meta);
    if meta
        .get("general.alignment")
        .is_some_and(|a| a.as_u64() != Some(32))
    {
        return Err("only the default alignment (32) is re-laid out".into());
    }
    let n = n.clamp(1, tensors.len().max(1));
    let per = tensors.len().div_ceil(n);
    let mut parts = Vec::with_capacity(n);
    for k in 0..n {
        let mut b = GgufBuilder::new()
            .u32("split.no", k as u32)
            .u32("split.count", n as u32)
            .u32("split.tensors.count", tensors.len() as u32);
        if k == 0 {
            for (key, v) in meta.iter().filter(|(k, _)| !k.starts_with("split.")) {
                b = b.value(key, v);
            }
        }
        for t in tensors.iter().skip(k * per).take(per) {
            let dims: Vec<u64> = t.dims.iter().map(|&d| d as u64).collect();
            b = b.tensor(&t.name, &dims, t.ty.id(), bytes[t.range.clone()].to_vec());
        }
        parts.push(b.build());
    }
    Ok(parts)
}

/// A safetensors file from header JSON and `data_len` zero bytes of data.
pub fn safetensors_file(header: &str, data_len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.resize(v.len() + data_len, 0);
    v
}

/// Where the committed seed corpus of a fuzz target lives (`fuzz/seeds/TARGET`).
pub fn seed_dir(target: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target)
}

/// The committed seed files of a target, in name order (at least one: panics without them,
/// so a test over them cannot pass vacuously).
pub fn seed_corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = seed_dir(target);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("seed entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seed corpus in {}", dir.display());
    files
        .iter()
        .map(|p| std::fs::read(p).expect("seed file"))
        .collect()
}

/// A block of `ty` from `next_u64` (a random source): random bytes whose f16 scale
/// fields hold finite values of either sign between about 1e-4 and 2 (every other bit
/// pattern of a block is a valid block), so that kernels can be compared bit for bit
/// without NaN payloads in the way. F32/F16/BF16 "blocks" are one finite value.
pub fn random_block(ty: GgmlType, mut next_u64: impl FnMut() -> u64) -> Vec<u8> {
    let (_, bb) = ty.block();
    let mut b: Vec<u8> = (0..bb).map(|_| next_u64() as u8).collect();
    let mut scale = || {
        let r = next_u64();
        let mag = 1e-4f32 * (2e4f32).powf((r >> 11) as f32 / (1u64 << 53) as f32);
        let v = if r & 1 == 0 { mag } else { -mag };
        half::f16::from_f32(v).to_bits()
    };
    let f16_at: &[usize] = match ty {
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::IQ1_M | GgmlType::MXFP4 | GgmlType::F32 | GgmlType::BF16 => &[],
        _ => &[0],
    };
    for &at in f16_at {
        b[at..at + 2].copy_from_slice(&scale().to_le_bytes());
    }
    match ty {
        GgmlType::IQ1_M => {
            // The f16 block scale is the top nibbles of the four u16 scale words.
            let d = scale();
            for (k, shift) in [12, 8, 4, 0].into_iter().enumerate() {
                let at = 48 + 2 * k;
                let w = u16::from_le_bytes([b[at], b[at + 1]]) & 0x0fff;
                let w = w | (((d >> shift) & 0xf) << 12);
                b[at..at + 2].copy_from_slice(&w.to_le_bytes());
            }
        }
        GgmlType::MXFP4 => b[0] = 100 + (next_u64() % 50) as u8,
        GgmlType::F32 => b.copy_from_slice(&(half::f16::from_bits(scale()).to_f32()).to_le_bytes()),
        GgmlType::BF16 => b.copy_from_slice(
            &((half::f16::from_bits(scale()).to_f32().to_bits() >> 16) as u16).to_le_bytes(),
        ),
        _ => {}
    }
    b
}
