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
        let (bs, bb) = ty.block();
        // Every dim, zero ones as one, sized in bytes without overflow: a zero-element
        // tensor with a 2^62-long row would pass the product and overflow its row's size.
        let numel = checked_numel(&dims)
            .filter(|_| {
                dims.iter()
                    .try_fold(bb, |a, &d| a.checked_mul(d.max(1)))
                    .is_some()
            })
            .ok_or_else(|| format!("tensor \"{name}\": dims {dims:?} overflow"))?;
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

mod ggml_type;
mod grids;
pub mod hf;
pub use ggml_type::GgmlType;
pub mod quants;
pub use grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

#[cfg(test)]
mod tests;
