//! A GGUF file (or the parts of a split one) opened as a model directory: its metadata
//! becomes `config.json`, its tensors are views under their Hugging Face names, read in
//! place (each expert of a stacked `*_exps` tensor a slice of it), never converted.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::{search_dirs, ModelDir, TensorView};
use crate::config::RawConfig;
use crate::error::{CoreError, Result};
use crate::gguf::hf::{hf_config, hf_name, Arch, HfName};
use crate::gguf::{parse, GgufTensor, GgufValue};

/// One opened part of a GGUF.
#[derive(Debug)]
pub struct GgufPart {
    /// Where it is.
    pub path: PathBuf,
    /// Its tensor directory.
    pub tensors: Vec<GgufTensor>,
    map: Arc<Mmap>,
    file: Arc<File>,
}

/// Where a Hugging Face tensor lies in the parts.
#[derive(Clone, Debug)]
struct Entry {
    part: usize,
    tensor: usize,
    /// Expert `e` of a stacked tensor.
    expert: Option<usize>,
    /// Rows to put back from llama.cpp's RoPE order, in this many heads.
    unpermute_heads: Option<usize>,
}

/// The GGUF behind a [`ModelDir`].
#[derive(Debug)]
pub struct GgufModel {
    /// The first part's metadata (the model's).
    pub metadata: BTreeMap<String, GgufValue>,
    /// The parts, in order.
    pub parts: Vec<GgufPart>,
    entries: HashMap<String, Entry>,
}

fn gguf_err(path: &Path, msg: impl Into<String>) -> CoreError {
    CoreError::Gguf {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// `(stem, number, count)` of a split part's name `{stem}-00001-of-00003.gguf`.
fn split_name(name: &str) -> Option<(&str, usize, usize)> {
    let base = name.strip_suffix(".gguf")?;
    let (rest, count) = base.rsplit_once("-of-")?;
    let (stem, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((stem, no.parse().ok()?, count.parse().ok()?))
}

fn open_part(path: &Path) -> Result<(GgufPart, BTreeMap<String, GgufValue>)> {
    let file = File::open(path).map_err(|e| CoreError::io(path, e))?;
    // SAFETY: a read-only mapping; coli never writes model files in place. Tensor bytes
    // that must survive a truncation are read with pread (TensorView::read_at).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| CoreError::io(path, e))?;
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::Random);
    let (metadata, tensors) = parse(&map).map_err(|msg| gguf_err(path, msg))?;
    Ok((
        GgufPart {
            path: path.to_path_buf(),
            tensors,
            map: Arc::new(map),
            file: Arc::new(file),
        },
        metadata,
    ))
}

/// The paths of every part of the GGUF whose first part (or only file) is `path`, from the
/// names alone: `{stem}-0000k-of-0000N.gguf`, looked for beside it, then in
/// `COLI_MODEL_DIRS`. A file whose name is not a split part's is the whole model.
pub fn gguf_part_paths(path: &Path) -> Result<Vec<PathBuf>> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some((stem, no, count)) = split_name(name) else {
        return Ok(vec![path.to_path_buf()]);
    };
    if no != 1 {
        return Err(gguf_err(
            path,
            format!(
                "is part {no} of {count}; open the first part ({stem}-00001-of-{count:05}.gguf)"
            ),
        ));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let dirs = search_dirs(dir);
    let mut parts = vec![path.to_path_buf()];
    for k in 2..=count {
        let part_name = format!("{stem}-{k:05}-of-{count:05}.gguf");
        let found = dirs
            .iter()
            .map(|d| d.join(&part_name))
            .find(|p| p.is_file());
        let Some(p) = found else {
            return Err(gguf_err(
                path,
                format!(
                    "part {k} of {count} ({part_name}) is missing (looked in {})",
                    super::show_dirs(&dirs)
                ),
            ));
        };
        parts.push(p);
    }
    Ok(parts)
}

/// Every part of the GGUF whose first part (or only file) is `path`
/// ([`gguf_part_paths`]), opened; each must say its number and the count.
fn open_parts(path: &Path) -> Result<(Vec<GgufPart>, BTreeMap<String, GgufValue>)> {
    let paths = gguf_part_paths(path)?;
    let (first, meta) = open_part(path)?;
    let declared = meta.get("split.count").and_then(GgufValue::as_u64);
    let single = paths.len() == 1;
    if declared.is_some_and(|c| c as usize != paths.len() && !(single && c <= 1)) {
        return Err(gguf_err(
            path,
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(split_name)
                .is_some()
            {
                format!(
                    "split.count = {declared:?} but the file name says {} parts",
                    paths.len()
                )
            } else {
                format!("split.count is {} but the file name is not {{name}}-00001-of-0000N.gguf, so its other parts cannot be found", declared.unwrap_or(0))
            },
        ));
    }
    let mut parts = vec![first];
    for (k, p) in paths.iter().enumerate().skip(1) {
        let (part, m) = open_part(p)?;
        let no_k = m.get("split.no").and_then(GgufValue::as_u64);
        if no_k.is_some_and(|n| n as usize != k) {
            return Err(gguf_err(
                p,
                format!("split.no = {no_k:?}, expected {k} for part {}", k + 1),
            ));
        }
        parts.push(part);
    }
    Ok((parts, meta))
}

/// What the planner needs of one tensor, without a view: its ggml type's name, its shape
/// (one expert's, for an expert of a stacked tensor) and its bytes in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The ggml type as a dtype name (`Q4_K`, `F32`, …).
    pub dtype: &'static str,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Bytes in the file.
    pub bytes: u64,
}

impl GgufModel {
    /// Opens the GGUF at `path` (the first part of a split one) and names its tensors.
    pub fn open(path: &Path) -> Result<(GgufModel, RawConfig)> {
        let (parts, metadata) = open_parts(path)?;
        let arch_name = metadata
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| gguf_err(path, "missing metadata key \"general.architecture\""))?;
        let arch = Arch::from_gguf(arch_name).map_err(|m| gguf_err(path, m))?;
        let all: Vec<GgufTensor> = parts.iter().flat_map(|p| p.tensors.clone()).collect();
        let config = hf_config(arch, &metadata, &all).map_err(|m| gguf_err(path, m))?;
        let n_heads = config["num_attention_heads"].as_u64().unwrap_or(1) as usize;
        let n_kv = config["num_key_value_heads"].as_u64().unwrap_or(1) as usize;
        let mut entries = HashMap::new();
        for (pi, part) in parts.iter().enumerate() {
            for (ti, t) in part.tensors.iter().enumerate() {
                let Some(hf) = hf_name(arch, &t.name) else {
                    return Err(gguf_err(
                        &part.path,
                        format!("tensor \"{}\" has no {arch_name} counterpart", t.name),
                    ));
                };
                let unpermute_heads = match () {
                    _ if !arch.permutes_qk() => None,
                    _ if t.name.ends_with(".attn_q.weight") => Some(n_heads),
                    _ if t.name.ends_with(".attn_k.weight") => Some(n_kv),
                    _ => None,
                };
                let entry = |expert| Entry {
                    part: pi,
                    tensor: ti,
                    expert,
                    unpermute_heads,
                };
                let mut insert = |name: String, e: Entry| {
                    if entries.insert(name.clone(), e).is_some() {
                        Err(gguf_err(
                            &part.path,
                            format!(
                                "two tensors map to \"{name}\" (the second is \"{}\")",
                                t.name
                            ),
                        ))
                    } else {
                        Ok(())
                    }
                };
                match hf {
                    HfName::Plain(name) => insert(name, entry(None))?,
                    HfName::Experts { prefix, suffix } => {
                        if t.dims.len() != 3 {
                            return Err(gguf_err(
                                &part.path,
                                format!(
                                    "tensor \"{}\": stacked experts need 3 dims, found {:?}",
                                    t.name, t.dims
                                ),
                            ));
                        }
                        let key = format!("{arch_name}.expert_count");
                        let want = metadata.get(&key).and_then(GgufValue::as_u64);
                        if want != Some(t.dims[2] as u64) {
                            return Err(gguf_err(
                                &part.path,
                                format!(
                                    "tensor \"{}\" stacks {} experts, but {key} is {want:?}",
                                    t.name, t.dims[2]
                                ),
                            ));
                        }
                        for e in 0..t.dims[2] {
                            insert(format!("{prefix}.{e}.{suffix}"), entry(Some(e)))?;
                        }
                    }
                }
            }
        }
        let text = serde_json::to_string_pretty(&config).expect("json");
        let raw = RawConfig::parse(path, &text)?;
        Ok((
            GgufModel {
                metadata,
                parts,
                entries,
            },
            raw,
        ))
    }

    /// Whether a tensor of that (Hugging Face) name exists.
    pub fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Every Hugging Face tensor name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// A tensor's type, shape and size by its Hugging Face name, without building a view
    /// (no Q/K rows are reordered, no byte is read).
    pub fn tensor_info(&self, name: &str) -> Option<GgufTensorInfo> {
        let e = self.entries.get(name)?;
        let t = &self.parts[e.part].tensors[e.tensor];
        let mut shape = t.shape();
        let mut bytes = t.range.len() as u64;
        if e.expert.is_some() && !shape.is_empty() {
            bytes /= shape[0].max(1) as u64;
            shape.remove(0);
        } else if shape.len() > 2 {
            shape = flat_rows(&shape);
        }
        Some(GgufTensorInfo {
            dtype: t.ty.name(),
            shape,
            bytes,
        })
    }

    /// The view of a tensor by its Hugging Face name: its ggml type as the dtype name
    /// (`Q4_K`; `F32`/`F16`/`BF16` as safetensors spells them), its shape outermost first.
    pub fn view(&self, name: &str) -> Option<Result<TensorView>> {
        let e = self.entries.get(name)?;
        let part = &self.parts[e.part];
        let t = &part.tensors[e.tensor];
        let mut view = TensorView {
            name: name.to_string(),
            dtype_name: t.ty.name().to_string(),
            shape: t.shape(),
            file: part.path.clone(),
            map: part.map.clone(),
            range: t.range.clone(),
            file_offset: t.range.start as u64,
            resident: false,
            handle: part.file.clone(),
        };
        if e.expert.is_none() && view.shape.len() > 2 {
            // A stack of matrices under one name (DeepSeek's per-head attn_k_b/attn_v_b):
            // its rows, one matrix after another.
            view.shape = flat_rows(&view.shape);
        }
        if let Some(x) = e.expert {
            view = match view.outer(x) {
                Ok(v) => v,
                Err(err) => return Some(Err(err)),
            };
            view.name = name.to_string();
        }
        Some(match e.unpermute_heads {
            None => Ok(view),
            Some(heads) => unpermuted(view, heads, t),
        })
    }
}

/// A shape of more than two dims as `[rows, cols]`: the outer dims multiplied.
fn flat_rows(shape: &[usize]) -> Vec<usize> {
    let cols = shape.last().copied().unwrap_or(1);
    vec![shape[..shape.len() - 1].iter().product(), cols]
}

/// `view`'s rows put back in Hugging Face order, in a resident copy: within each head,
/// GGUF row `2j + i` holds Hugging Face row `i * half + j` (i in {0, 1}). Whole rows move,
/// so the quantized blocks are untouched.
fn unpermuted(view: TensorView, heads: usize, t: &GgufTensor) -> Result<TensorView> {
    let (rows, cols) = match view.shape[..] {
        [r, c] => (r, c),
        _ => {
            return Err(gguf_err(
                &view.file,
                format!("tensor \"{}\": expected 2 dims, found {:?}", t.name, t.dims),
            ))
        }
    };
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(gguf_err(
            &view.file,
            format!(
                "tensor \"{}\": {rows} rows do not split into {heads} heads of an even size",
                t.name
            ),
        ));
    }
    let src = view.read_bytes()?;
    let w = t.ty.row_bytes(cols);
    let (hd, half) = (rows / heads, rows / heads / 2);
    let mut dst = vec![0u8; src.len()];
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..half {
                let (s, d) = (h * hd + 2 * j + i, h * hd + i * half + j);
                dst[d * w..(d + 1) * w].copy_from_slice(&src[s * w..(s + 1) * w]);
            }
        }
    }
    view.resident_with(&dst)
}

/// Whether `path` names a GGUF file (by its extension), which opens as a model in place.
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        && !path.is_dir()
}

/// The GGUF that `path` names as a model: `path` itself when it is a `.gguf` file, or the
/// one GGUF (the first part, when split) in a directory that has no `config.json`. `None`
/// when `path` is a Hugging Face directory (or does not exist); an error when a directory
/// without `config.json` holds several GGUF models, naming them.
pub fn model_gguf(path: &Path) -> Result<Option<PathBuf>> {
    if is_gguf_path(path) {
        return Ok(path.is_file().then(|| path.to_path_buf()));
    }
    if !path.is_dir() || path.join("config.json").exists() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(path).map_err(|e| CoreError::io(path, e))?;
    let mut found: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let p = entry.map_err(|e| CoreError::io(path, e))?.path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let first = split_name(name).is_none_or(|(_, no, _)| no == 1);
        if is_gguf_path(&p) && p.is_file() && first {
            found.push(p);
        }
    }
    found.sort();
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(gguf_err(
            path,
            format!(
                "holds no config.json and {} GGUF models ({}): name the file to run",
                found.len(),
                found
                    .iter()
                    .filter_map(|p| p.file_name()?.to_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

impl ModelDir {
    /// Opens a GGUF file (or the first part of a split one) as a model.
    pub fn open_gguf(path: &Path) -> Result<ModelDir> {
        let (model, config) = GgufModel::open(path)?;
        Ok(ModelDir {
            path: path.to_path_buf(),
            config,
            shards: Vec::new(),
            index: HashMap::new(),
            gguf: Some(Arc::new(model)),
        })
    }

    /// The GGUF behind this model, if it is one.
    pub fn gguf(&self) -> Option<&GgufModel> {
        self.gguf.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_part_names_are_read() {
        assert_eq!(
            split_name("Kimi-K2-Q2_K-00001-of-00004.gguf"),
            Some(("Kimi-K2-Q2_K", 1, 4))
        );
        assert_eq!(split_name("model.gguf"), None);
        assert_eq!(split_name("a-1-of-4.gguf"), None);
    }
}
