//! GGUF, llama.cpp's single-file container: metadata, tensor directory and
//! block dequantization.
//!
//! Layout (version 2 and 3, little-endian): magic `GGUF`, u32 version, u64
//! tensor count, u64 metadata count, the metadata key/values, the tensor infos
//! (name, dims innermost first, ggml type, offset into the data section), then
//! the data section at the next multiple of `general.alignment` (default 32).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{CoreError, Result};

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Any unsigned or signed integer type, widened.
    Int(i128),
    /// f32 or f64, widened.
    Float(f64),
    /// bool.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// As an unsigned integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            GgufValue::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
    /// As a float (integers convert).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            GgufValue::Float(f) => Some(*f),
            GgufValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    /// As a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
    /// As a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        }
    }
    /// As an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The ggml tensor types coli reads: every type the common quantizations mix.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// f32.
    F32,
    /// f16.
    F16,
    /// bf16.
    BF16,
    /// 32 weights: f16 scale, 4-bit values offset by 8.
    Q4_0,
    /// 32 weights: f16 scale and minimum, 4-bit values.
    Q4_1,
    /// 32 weights: f16 scale, 5-bit values offset by 16.
    Q5_0,
    /// 32 weights: f16 scale and minimum, 5-bit values.
    Q5_1,
    /// 32 weights: f16 scale, 8-bit signed values.
    Q8_0,
    /// 256 weights: 2-bit values, 4-bit sub-block scales and minimums.
    Q2_K,
    /// 256 weights: 3-bit values, 6-bit signed sub-block scales.
    Q3_K,
    /// 256 weights: 4-bit values, 6-bit sub-block scales and minimums.
    Q4_K,
    /// 256 weights: 5-bit values, 6-bit sub-block scales and minimums.
    Q5_K,
    /// 256 weights: 6-bit values, 8-bit signed sub-block scales.
    Q6_K,
    /// 256 weights: 2.06 bits each, E8-lattice grid of 256.
    IQ2_XXS,
    /// 256 weights: 2.31 bits each, grid of 512.
    IQ2_XS,
    /// 256 weights: 2.5 bits each, grid of 1024, explicit signs.
    IQ2_S,
    /// 256 weights: 3.06 bits each, grid of 256 of 4 values.
    IQ3_XXS,
    /// 256 weights: 3.44 bits each, grid of 512 of 4 values.
    IQ3_S,
    /// 256 weights: 1.56 bits each, ternary grid of 2048.
    IQ1_S,
    /// 256 weights: 1.75 bits each, ternary grid of 2048.
    IQ1_M,
    /// 32 weights: f16 scale, 4-bit indices into a non-linear table.
    IQ4_NL,
    /// 256 weights: IQ4_NL's table with 6-bit sub-block scales.
    IQ4_XS,
    /// 32 weights: E8M0 scale, `e2m1` values (OCP MX FP4).
    MXFP4,
}

impl GgmlType {
    /// Every type, in ggml's id order.
    pub const ALL: [GgmlType; 23] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// ggml's numeric id (`GGMLQuantizationType`).
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ2_XS => 17,
            GgmlType::IQ3_XXS => 18,
            GgmlType::IQ1_S => 19,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ3_S => 21,
            GgmlType::IQ2_S => 22,
            GgmlType::IQ4_XS => 23,
            GgmlType::IQ1_M => 29,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    /// The type of ggml id `id`, if coli reads it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// ggml's name (`Q4_K`), which is also the dtype name coli gives GGUF tensors.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::IQ2_XXS => "IQ2_XXS",
            GgmlType::IQ2_XS => "IQ2_XS",
            GgmlType::IQ2_S => "IQ2_S",
            GgmlType::IQ3_XXS => "IQ3_XXS",
            GgmlType::IQ3_S => "IQ3_S",
            GgmlType::IQ1_S => "IQ1_S",
            GgmlType::IQ1_M => "IQ1_M",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// The type named `name` ([`GgmlType::name`]).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether values come in blocks of several (every type but F32, F16, BF16).
    pub fn is_quantized(self) -> bool {
        self.block().0 > 1
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 | GgmlType::IQ4_NL => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::MXFP4 => (32, 17),
            GgmlType::Q2_K => (256, 84),
            GgmlType::Q3_K => (256, 110),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q5_K => (256, 176),
            GgmlType::Q6_K => (256, 210),
            GgmlType::IQ2_XXS => (256, 66),
            GgmlType::IQ2_XS => (256, 74),
            GgmlType::IQ2_S => (256, 82),
            GgmlType::IQ3_XXS => (256, 98),
            GgmlType::IQ3_S => (256, 110),
            GgmlType::IQ1_S => (256, 50),
            GgmlType::IQ1_M => (256, 56),
            GgmlType::IQ4_XS => (256, 136),
        }
    }

    /// Bytes of a row of `cols` elements (`cols` a multiple of the block size).
    pub fn row_bytes(self, cols: usize) -> usize {
        let (bs, bb) = self.block();
        cols / bs * bb
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    /// Name (llama.cpp spelling, e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions innermost first, as GGUF stores them.
    pub dims: Vec<usize>,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute byte range in the file.
    pub range: std::ops::Range<usize>,
}

impl GgufTensor {
    /// Shape outermost first (the Hugging Face / safetensors order).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
    /// Element count.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// An opened, validated GGUF file.
///
/// The header is parsed through a mapping that is dropped when `open` returns; tensor
/// data is read with `pread`, so a file truncated after opening gives an I/O error
/// naming the file, not a SIGBUS.
pub struct GgufFile {
    /// Where it is.
    pub path: PathBuf,
    /// Metadata key/values.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor directory in file order.
    pub tensors: Vec<GgufTensor>,
    file: File,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "unexpected end of file at byte {} (wanted {n} more bytes)",
                    self.pos
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn len(&mut self, what: &str) -> Result<usize, String> {
        let n = self.u64()?;
        // Every element occupies at least one byte, so a count beyond the remaining bytes is corrupt.
        if n > (self.buf.len() - self.pos) as u64 {
            return Err(format!(
                "{what} count {n} at byte {} exceeds the file size",
                self.pos
            ));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.len("string length")?;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| format!("string at byte {} is not UTF-8", self.pos - n))
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<GgufValue, String> {
        Ok(match ty {
            0 => GgufValue::Int(self.take(1)?[0] as i128),
            1 => GgufValue::Int(self.take(1)?[0] as i8 as i128),
            2 => GgufValue::Int(u16::from_le_bytes(self.take(2)?.try_into().expect("2")) as i128),
            3 => GgufValue::Int(i16::from_le_bytes(self.take(2)?.try_into().expect("2")) as i128),
            4 => GgufValue::Int(self.u32()? as i128),
            5 => GgufValue::Int(self.u32()? as i32 as i128),
            6 => GgufValue::Float(f32::from_bits(self.u32()?) as f64),
            7 => GgufValue::Bool(self.take(1)?[0] != 0),
            8 => GgufValue::Str(self.string()?),
            9 => {
                if depth > 2 {
                    return Err("arrays nested too deeply".into());
                }
                let et = self.u32()?;
                let n = self.len("array length")?;
                let mut v = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    v.push(self.value(et, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::Int(self.u64()? as i128),
            11 => GgufValue::Int(self.u64()? as i64 as i128),
            12 => GgufValue::Float(f64::from_bits(self.u64()?)),
            other => {
                return Err(format!(
                    "unknown metadata value type {other} at byte {}",
                    self.pos
                ))
            }
        })
    }
}

/// Parses the header and tensor directory of GGUF bytes; ranges are checked against `buf`.
pub fn parse(buf: &[u8]) -> Result<(BTreeMap<String, GgufValue>, Vec<GgufTensor>), String> {
    let mut r = Reader { buf, pos: 0 };
    if r.take(4)? != b"GGUF" {
        return Err("missing GGUF magic".into());
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "unsupported GGUF version {version} (supported: 2, 3)"
        ));
    }
    let n_tensors = r.len("tensor")?;
    let n_kv = r.len("metadata")?;
    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let at = r.pos;
        let key = r.string()?;
        let ty = r
            .u32()
            .map_err(|e| format!("metadata key \"{key}\": {e}"))?;
        let v = r
            .value(ty, 0)
            .map_err(|e| format!("metadata key \"{key}\": {e}"))?;
        if metadata.contains_key(&key) {
            return Err(format!(
                "metadata key \"{key}\" at byte {at} appears twice (each key once expected)"
            ));
        }
        metadata.insert(key, v);
    }
    let mut infos = Vec::with_capacity(n_tensors.min(1 << 16));
    let mut names = BTreeSet::new();
    for _ in 0..n_tensors {
        let name = r.string()?;
        if !names.insert(name.clone()) {
            return Err(format!(
                "tensor \"{name}\" appears twice in the tensor directory (each name once expected)"
            ));
        }
        let in_entry = |e: String| format!("tensor \"{name}\": {e}");
        let nd = r.u32().map_err(in_entry)?;
        if nd > 4 {
            return Err(format!("tensor \"{name}\": {nd} dimensions (at most 4)"));
        }
        let dims = (0..nd)
            .map(|_| r.u64().map(|d| d as usize))
            .collect::<Result<Vec<_>, _>>()
            .map_err(in_entry)?;
        let ty_id = r.u32().map_err(in_entry)?;
        let offset = r.u64().map_err(in_entry)?;
        infos.push((name, dims, ty_id, offset));
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => v
            .as_u64()
            .filter(|a| a.is_power_of_two())
            .ok_or("general.alignment is not a power of two")? as usize,
    };
    let data_start = r
        .pos
        .checked_next_multiple_of(alignment)
        .ok_or("data section start overflows")?;
    let mut tensors = Vec::with_capacity(infos.len());
    for (name, dims, ty_id, offset) in infos {
        let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
            let known: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
            format!(
                "tensor \"{name}\": ggml type {ty_id} is not supported (supported: {})",
                known.join(", ")
            )
        })?;
        let numel = checked_numel(&dims)
            .ok_or_else(|| format!("tensor \"{name}\": dims {dims:?} overflow"))?;
        let (bs, bb) = ty.block();
        if dims.first().is_some_and(|&d| !d.is_multiple_of(bs)) {
            return Err(format!(
                "tensor \"{name}\": row length {} is not a multiple of the {ty:?} block size {bs}",
                dims[0]
            ));
        }
        // A tensor with no dims is one element: not a whole block of a quantized type.
        if !numel.is_multiple_of(bs) {
            return Err(format!(
                "tensor \"{name}\": dims {dims:?} hold {numel} elements, not a whole number of {ty:?} blocks of {bs}"
            ));
        }
        let bytes = (numel / bs)
            .checked_mul(bb)
            .ok_or_else(|| format!("tensor \"{name}\": size overflows"))?;
        if !offset.is_multiple_of(alignment as u64) {
            return Err(format!(
                "tensor \"{name}\": offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        let offset = usize::try_from(offset)
            .map_err(|_| format!("tensor \"{name}\": offset {offset} overflows"))?;
        let start = data_start
            .checked_add(offset)
            .ok_or_else(|| format!("tensor \"{name}\": offset overflows"))?;
        let end = start.checked_add(bytes).filter(|&e| e <= buf.len()).ok_or_else(|| {
            format!("tensor \"{name}\": data [{start}, {start}+{bytes}) runs past the end of the file ({} bytes)", buf.len())
        })?;
        tensors.push(GgufTensor {
            name,
            dims,
            ty,
            range: start..end,
        });
    }
    check_no_overlap(&tensors)?;
    Ok((metadata, tensors))
}

/// Tensor data must not overlap (llama.cpp lays tensors out one after another): a file
/// whose tensors all alias one range would otherwise make an import allocate
/// (tensor count × range) bytes from a small file.
fn check_no_overlap(tensors: &[GgufTensor]) -> Result<(), String> {
    let mut spans: Vec<&GgufTensor> = tensors.iter().filter(|t| !t.range.is_empty()).collect();
    spans.sort_by_key(|t| (t.range.start, t.range.end));
    let mut furthest: Option<&GgufTensor> = None;
    for t in spans {
        if let Some(f) = furthest {
            if t.range.start < f.range.end {
                return Err(format!(
                    "tensors \"{}\" [{}, {}) and \"{}\" [{}, {}) overlap in the data section",
                    f.name, f.range.start, f.range.end, t.name, t.range.start, t.range.end
                ));
            }
        }
        if furthest.is_none_or(|f| t.range.end > f.range.end) {
            furthest = Some(t);
        }
    }
    Ok(())
}

impl GgufFile {
    /// Maps and parses a GGUF file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(|e| CoreError::io(path, e))?;
        // SAFETY: read-only mapping of a file coli does not modify while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| CoreError::io(path, e))?;
        let (metadata, tensors) = parse(&map).map_err(|msg| CoreError::Gguf {
            path: path.to_path_buf(),
            msg,
        })?;
        drop(map);
        Ok(GgufFile {
            path: path.to_path_buf(),
            metadata,
            tensors,
            file,
        })
    }

    /// A metadata value, or an error naming the key.
    pub fn meta(&self, key: &str) -> Result<&GgufValue> {
        self.metadata.get(key).ok_or_else(|| CoreError::Gguf {
            path: self.path.clone(),
            msg: format!("missing metadata key \"{key}\""),
        })
    }

    /// A tensor's entry by name.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Dequantizes a tensor to f32, in storage order. The bytes are read with `pread`: a
    /// file that shrank since `open` is an I/O error, and a tensor entry whose size does
    /// not match its range is a [`CoreError::Gguf`].
    pub fn dequantize(&self, t: &GgufTensor) -> Result<Vec<f32>> {
        let bad = |msg: String| CoreError::Gguf {
            path: self.path.clone(),
            msg: format!("tensor \"{}\": {msg}", t.name),
        };
        let numel =
            checked_numel(&t.dims).ok_or_else(|| bad(format!("dims {:?} overflow", t.dims)))?;
        let (bs, bb) = t.ty.block();
        if !numel.is_multiple_of(bs) || numel / bs * bb != t.range.len() {
            return Err(bad(format!(
                "{numel} {:?} elements need {} bytes, the entry spans {}",
                t.ty,
                numel.div_ceil(bs) * bb,
                t.range.len()
            )));
        }
        let mut bytes = vec![0u8; t.range.len()];
        self.file
            .read_exact_at(&mut bytes, t.range.start as u64)
            .map_err(|e| CoreError::io(&self.path, e))?;
        let mut out = vec![0.0; numel];
        dequantize(t.ty, &bytes, &mut out).map_err(bad)?;
        Ok(out)
    }
}

fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Dequantizes `bytes` of type `ty` into `out` (whole blocks), as gguf-py's
/// `gguf.quants.dequantize` does, bit for bit ([`quants`]). `bytes` must be whole blocks
/// holding exactly `out.len()` elements; anything else is an error saying both sizes
/// (never a panic).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    let (bs, bb) = ty.block();
    if !bytes.len().is_multiple_of(bb) || bytes.len() / bb * bs != out.len() {
        return Err(format!(
            "{} bytes of {ty:?} (blocks of {bb} bytes, {bs} elements) do not hold the {} elements expected",
            bytes.len(),
            out.len()
        ));
    }
    match ty {
        GgmlType::F32 => crate::DType::F32.to_f32(bytes, out),
        GgmlType::F16 => crate::DType::F16.to_f32(bytes, out),
        GgmlType::BF16 => crate::DType::BF16.to_f32(bytes, out),
        _ => {
            for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
                quants::dequantize_block(ty, b, o);
            }
        }
    }
    Ok(())
}

mod grids;
pub mod hf;
pub mod quants;
pub use grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

#[cfg(test)]
mod tests {
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
}
