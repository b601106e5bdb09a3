//! A Hugging Face model directory, memory-mapped.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde_json::Value;

use crate::config::RawConfig;
use crate::dtype::DType;
use crate::error::{CoreError, Result};
use crate::safetensors_header::{header_len, parse_header, Header};

mod gguf;
mod resident;
pub use gguf::{gguf_part_paths, is_gguf_path, model_gguf, GgufModel, GgufPart, GgufTensorInfo};
pub use resident::make_resident;

/// Environment variable listing extra directories (`:`-separated) searched for shards.
pub const MODEL_DIRS_ENV: &str = "COLI_MODEL_DIRS";

/// A memory-mapped safetensors shard with its validated header.
#[derive(Debug)]
pub struct Shard {
    /// Where the shard is.
    pub path: PathBuf,
    /// The mapping of the whole file.
    pub map: Arc<Mmap>,
    /// Its validated header.
    pub header: Header,
    /// The open file behind the mapping: `pread`s go to the same file the header was
    /// validated from, even if the path is renamed over afterwards.
    file: Arc<File>,
}

impl Shard {
    /// Maps and validates one safetensors file.
    pub fn open(path: &Path) -> Result<Shard> {
        let file = File::open(path).map_err(|e| CoreError::io(path, e))?;
        // SAFETY: the mapping is read-only; coli never writes model files in place (every
        // writer renames a finished temp file over the old one), so the bytes behind the map
        // stay those of the file we validated below.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| CoreError::io(path, e))?;
        // Tensors are read sparsely through the mapping (vectors, scales; the big weights are
        // copied with pread or streamed): no readahead around each touch.
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        let bad = |msg: String| CoreError::Header {
            path: path.to_path_buf(),
            msg,
        };
        // The mapping's length, not an earlier stat: a file that changed size in between
        // must not make the header slice below run past the mapping.
        let len = map.len() as u64;
        let n = header_len(&map[..map.len().min(8)], len).map_err(bad)?;
        let header = parse_header(&map[8..8 + n], len).map_err(bad)?;
        Ok(Shard {
            path: path.to_path_buf(),
            map: Arc::new(map),
            header,
            file: Arc::new(file),
        })
    }
}

/// A view of one stored tensor: where its bytes are and what they mean.
#[derive(Clone, Debug)]
pub struct TensorView {
    /// Name as the checkpoint spells it.
    pub name: String,
    /// The safetensors dtype spelling.
    pub dtype_name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// The shard holding it.
    pub file: PathBuf,
    map: Arc<Mmap>,
    range: Range<usize>,
    file_offset: u64,
    resident: bool,
    handle: Arc<File>,
}

impl TensorView {
    /// The raw little-endian bytes.
    ///
    /// For a view that is not resident (see [`make_resident`]) these are read through the
    /// shard's mapping: if the shard is truncated while mapped, touching a page past the
    /// new end raises SIGBUS. Prefer [`TensorView::read_bytes`] for one-off reads.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }

    /// Where the bytes are in `file` (also for a resident copy: the original place), for
    /// reading them with `pread` instead of through the mapping.
    pub fn file_range(&self) -> Range<u64> {
        self.file_offset..self.file_offset + self.range.len() as u64
    }

    /// Slice `i` along the outermost dimension (one expert of a fused `[E, ..]` tensor), as a
    /// view of its own: shape without the first dimension, bytes and file range narrowed.
    pub fn outer(&self, i: usize) -> Result<TensorView> {
        let n = self.shape.first().copied().unwrap_or(0);
        if i >= n || !self.range.len().is_multiple_of(n) {
            return Err(CoreError::Shape {
                name: format!("{}[{i}]", self.name),
                file: self.file.clone(),
                expected: vec![i + 1],
                found: self.shape.clone(),
            });
        }
        let each = self.range.len() / n;
        let mut v = self.clone();
        v.name = format!("{}[{i}]", self.name);
        v.shape = self.shape[1..].to_vec();
        v.range = self.range.start + i * each..self.range.start + (i + 1) * each;
        v.file_offset = self.file_offset + (i * each) as u64;
        Ok(v)
    }

    /// Whether the bytes are a resident copy (see [`make_resident`]) rather than the shard's
    /// mapping.
    pub fn is_resident(&self) -> bool {
        self.resident
    }

    /// A resident view holding `bytes` (as many as this view's) in place of its own: the same
    /// name, dtype, shape and place in the file, for a copy that was rearranged (a matrix
    /// stored input-major, transposed once in memory).
    pub fn resident_with(&self, bytes: &[u8]) -> Result<TensorView> {
        assert_eq!(
            bytes.len(),
            self.range.len(),
            "{}: replacement bytes",
            self.name
        );
        let fail = |e: std::io::Error| CoreError::io("<resident weights>", e);
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(fail)?;
        map[..bytes.len()].copy_from_slice(bytes);
        Ok(TensorView {
            map: Arc::new(map.make_read_only().map_err(fail)?),
            range: 0..bytes.len(),
            resident: true,
            ..self.clone()
        })
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The dtype, if it is one coli computes with; otherwise a clear error.
    pub fn dtype(&self) -> Result<DType> {
        DType::from_safetensors_name(&self.dtype_name).ok_or_else(|| CoreError::Dtype {
            name: self.name.clone(),
            file: self.file.clone(),
            found: self.dtype_name.clone(),
            expected: "F32, BF16, F16".into(),
        })
    }

    /// Checks the shape against what the family expects.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<&Self> {
        if self.shape != expected {
            return Err(CoreError::Shape {
                name: self.name.clone(),
                file: self.file.clone(),
                expected: expected.to_vec(),
                found: self.shape.clone(),
            });
        }
        Ok(self)
    }

    /// A copy of the raw bytes: from the resident copy, or read with `pread` from the
    /// shard (never through its mapping), so a shard truncated since it was opened is an
    /// I/O error naming it rather than a SIGBUS.
    pub fn read_bytes(&self) -> Result<Vec<u8>> {
        if self.resident {
            return Ok(self.bytes().to_vec());
        }
        let mut out = vec![0u8; self.range.len()];
        std::os::unix::fs::FileExt::read_exact_at(&*self.handle, &mut out, self.file_offset)
            .map_err(|e| CoreError::io(&self.file, e))?;
        Ok(out)
    }

    /// `dst.len()` bytes from `start` bytes into the tensor, read as
    /// [`TensorView::read_bytes`] does (the resident copy, else `pread`, never the
    /// mapping); a range outside the tensor is an error too.
    pub fn read_at(&self, start: usize, dst: &mut [u8]) -> Result<()> {
        let end = start
            .checked_add(dst.len())
            .filter(|&e| e <= self.range.len())
            .ok_or_else(|| {
                CoreError::io(
                    &self.file,
                    std::io::Error::other(format!(
                        "{}: bytes {start}..+{} lie outside its {} bytes",
                        self.name,
                        dst.len(),
                        self.range.len()
                    )),
                )
            })?;
        if self.resident {
            dst.copy_from_slice(&self.bytes()[start..end]);
            return Ok(());
        }
        std::os::unix::fs::FileExt::read_exact_at(
            &*self.handle,
            dst,
            self.file_offset + start as u64,
        )
        .map_err(|e| {
            let what = format!("reading {} (bytes {start}..{end}): {e}", self.name);
            CoreError::io(&self.file, std::io::Error::new(e.kind(), what))
        })
    }

    /// All elements converted to f32 (read as [`TensorView::read_bytes`] does).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let dtype = self.dtype()?;
        if self.resident {
            return Ok(dtype.to_f32_vec(self.bytes()));
        }
        Ok(dtype.to_f32_vec(&self.read_bytes()?))
    }
}

/// The shard files of a model directory, without reading them: from
/// `model.safetensors.index.json` (each name searched in the directory, then in
/// `COLI_MODEL_DIRS`) with its weight map, else `model.safetensors`, else every
/// `*.safetensors` file in name order.
#[allow(clippy::type_complexity)]
pub fn shard_files(path: &Path) -> Result<(Vec<PathBuf>, Option<HashMap<String, String>>)> {
    shard_files_with(path, true)
}

/// [`shard_files`] without building the weight map: an index with a hundred thousand
/// entries is read for its distinct file names only (no per-entry allocation).
pub fn shard_paths(path: &Path) -> Result<Vec<PathBuf>> {
    Ok(shard_files_with(path, false)?.0)
}

#[allow(clippy::type_complexity)]
fn shard_files_with(
    path: &Path,
    with_map: bool,
) -> Result<(Vec<PathBuf>, Option<HashMap<String, String>>)> {
    let search = search_dirs(path);
    let index_path = path.join("model.safetensors.index.json");
    Ok(if index_path.is_file() {
        let (names, map) = if with_map {
            let (n, m) = read_index(&index_path)?;
            (n, Some(m))
        } else {
            (index_file_names(&index_path)?, None)
        };
        let paths = names
            .iter()
            .map(|n| {
                locate(n, &search).ok_or_else(|| {
                    index_err(
                        &index_path,
                        format!("shard \"{n}\" not found in {}", show_dirs(&search)),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        (paths, map)
    } else if path.join("model.safetensors").is_file() {
        (vec![path.join("model.safetensors")], None)
    } else {
        let mut found: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| CoreError::io(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        found.sort();
        if found.is_empty() {
            return Err(CoreError::Index {
                path: path.to_path_buf(),
                msg: "no model.safetensors, no model.safetensors.index.json and no *.safetensors files".into(),
            });
        }
        (found, None)
    })
}

/// The files the model at `path` is read from, in a stable order: `config.json`, the index
/// when there is one and every shard of a Hugging Face directory; every part of a GGUF.
/// What a cache keyed on the model's files (the planner's analysis, a tuning result, a
/// saved conversation) must stamp.
pub fn model_files(path: &Path) -> Result<Vec<PathBuf>> {
    if let Some(file) = model_gguf(path)? {
        return gguf_part_paths(&file);
    }
    let mut files = vec![path.join("config.json")];
    let index = path.join("model.safetensors.index.json");
    if index.is_file() {
        files.push(index);
    }
    files.extend(shard_paths(path)?);
    Ok(files)
}

/// Where the model at `path` keeps its sidecar `name` (`.coli_usage`,
/// `.coli_analysis.json`, …): inside a Hugging Face directory; beside a GGUF, prefixed
/// with its file name (`.{file}{name}`, e.g. `.Kimi-K2-Q2_K-00001-of-00004.gguf.coli_usage`)
/// so two GGUFs in one directory keep their own, whether the file or its directory was
/// named.
pub fn sidecar_path(path: &Path, name: &str) -> PathBuf {
    match model_gguf(path) {
        Ok(Some(file)) => {
            let file_name = file.file_name().map(|n| n.to_string_lossy().into_owned());
            let dir = file.parent().unwrap_or(Path::new("."));
            dir.join(format!(".{}{name}", file_name.unwrap_or_default()))
        }
        _ => path.join(name),
    }
}

/// An opened model directory: its config and every tensor of every shard.
#[derive(Debug)]
pub struct ModelDir {
    /// The directory.
    pub path: PathBuf,
    /// `config.json`.
    pub config: RawConfig,
    /// The shards, in a stable order.
    pub shards: Vec<Shard>,
    index: HashMap<String, usize>,
    /// The GGUF file(s), when the model is one (then `path` is its first part and
    /// `shards` is empty).
    gguf: Option<Arc<GgufModel>>,
}

impl ModelDir {
    /// Opens `path`: reads `config.json`, locates and validates every shard.
    pub fn open(path: impl AsRef<Path>) -> Result<ModelDir> {
        let path = path.as_ref();
        if let Some(file) = model_gguf(path)? {
            return ModelDir::open_gguf(&file);
        }
        if !path.is_dir() {
            return Err(CoreError::MissingDir(path.to_path_buf()));
        }
        let config = RawConfig::read(&path.join("config.json"))?;
        let index_path = path.join("model.safetensors.index.json");
        let (shard_paths, weight_map) = shard_files(path)?;
        let shards = shard_paths
            .iter()
            .map(|p| Shard::open(p))
            .collect::<Result<Vec<_>>>()?;
        let mut index = HashMap::new();
        for (i, s) in shards.iter().enumerate() {
            for name in s.header.tensors.keys() {
                if let Some(prev) = index.insert(name.clone(), i) {
                    return Err(CoreError::Header {
                        path: s.path.clone(),
                        msg: format!(
                            "tensor \"{name}\" is also stored in {}",
                            shards[prev].path.display()
                        ),
                    });
                }
            }
        }
        if let Some(map) = weight_map {
            for (name, file) in &map {
                match index.get(name) {
                    Some(&i)
                        if shards[i]
                            .path
                            .file_name()
                            .is_some_and(|f| f == file.as_str()) => {}
                    Some(&i) => {
                        return Err(index_err(
                            &index_path,
                            format!(
                                "maps \"{name}\" to {file}, but it is stored in {}",
                                shards[i].path.display()
                            ),
                        ))
                    }
                    None => {
                        return Err(index_err(
                            &index_path,
                            format!("maps \"{name}\" to {file}, which does not contain it"),
                        ))
                    }
                }
            }
        }
        Ok(ModelDir {
            path: path.to_path_buf(),
            config,
            shards,
            index,
            gguf: None,
        })
    }

    /// Whether a tensor of that name exists.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name) || self.gguf.as_ref().is_some_and(|g| g.has(name))
    }

    /// Looks a tensor up by name.
    pub fn tensor(&self, name: &str) -> Result<TensorView> {
        if let Some(view) = self.gguf.as_ref().and_then(|g| g.view(name)) {
            return view;
        }
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| CoreError::MissingTensor {
                name: name.to_string(),
                dir: self.path.clone(),
            })?;
        let shard = &self.shards[i];
        let e = &shard.header.tensors[name];
        Ok(TensorView {
            name: name.to_string(),
            dtype_name: e.dtype.clone(),
            shape: e.shape.clone(),
            file: shard.path.clone(),
            map: shard.map.clone(),
            range: e.file_range.clone(),
            file_offset: e.file_range.start as u64,
            resident: false,
            handle: shard.file.clone(),
        })
    }

    /// Looks a tensor up and checks its shape (see [`ModelDir::unit_dims`]).
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<TensorView> {
        let mut t = self.tensor(name)?;
        self.unit_dims(&mut t, shape);
        t.expect_shape(shape)?;
        Ok(t)
    }

    /// ggml drops a tensor's outer dims of size 1 (llama.cpp's quantizer writes
    /// `ggml_n_dims`): a GGUF tensor wanted as `[1, .., n]` that holds the same shape
    /// without those leading ones (Qwen's `shared_expert_gate`, `[1, hidden]`) is given
    /// them back. Safetensors shapes are left as they are.
    pub fn unit_dims(&self, t: &mut TensorView, shape: &[usize]) {
        let lead = shape.iter().take_while(|&&d| d == 1).count();
        let from_gguf = !self.index.contains_key(&t.name);
        if from_gguf && lead > 0 && t.shape.as_slice() == &shape[lead..] {
            t.shape = shape.to_vec();
        }
    }

    /// Every tensor name, sorted.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.index.keys().map(String::as_str).collect();
        if let Some(g) = &self.gguf {
            v.extend(g.names());
        }
        v.sort_unstable();
        v
    }
}

fn index_err(path: &Path, msg: String) -> CoreError {
    CoreError::Index {
        path: path.to_path_buf(),
        msg,
    }
}

fn show_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The model directory followed by the directories in `COLI_MODEL_DIRS`.
pub fn search_dirs(model_dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![model_dir.to_path_buf()];
    if let Some(extra) = std::env::var_os(MODEL_DIRS_ENV) {
        dirs.extend(std::env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs
}

fn locate(file_name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(file_name)).find(|p| p.is_file())
}

/// A JSON string borrowed from the input when it has no escapes (no allocation per key).
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The shard names of an index's weight map (distinct, sorted), read without building
/// the map; a tensor name given twice fails (the full parse then names it).
struct Names(BTreeSet<String>);
impl<'de> serde::Deserialize<'de> for Names {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Names;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a weight_map object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Names, A::Error> {
                let mut set = BTreeSet::new();
                let mut keys = std::collections::HashSet::new();
                while let Some(key) = m.next_key::<Key<'de>>()? {
                    if !keys.insert(key.0) {
                        // The full parse names the key.
                        return Err(serde::de::Error::custom("duplicate tensor name"));
                    }
                    let file: std::borrow::Cow<'de, str> = m.next_value()?;
                    if !set.contains(file.as_ref()) {
                        set.insert(file.into_owned());
                    }
                }
                Ok(Names(set))
            }
        }
        d.deserialize_map(V)
    }
}

/// The distinct shard names of an index, sorted, validated as plain file names.
fn index_file_names(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read(path).map_err(|e| CoreError::io(path, e))?;
    index_file_names_from(path, &text)
}

/// [`index_file_names`] of index text already read; `path` is only used in messages.
#[doc(hidden)]
pub fn index_file_names_from(path: &Path, text: &[u8]) -> Result<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: Names,
    }
    match serde_json::from_slice::<Index>(text) {
        Ok(i) => {
            for file in &i.weight_map.0 {
                if file.contains('/') || file.contains('\\') || file == ".." {
                    return Err(index_err(
                        path,
                        format!("\"{file}\" is not a plain file name"),
                    ));
                }
            }
            Ok(i.weight_map.0.into_iter().collect())
        }
        // Not well-formed: the full parse says what is wrong.
        Err(_) => parse_index(path, text).map(|(names, _)| names),
    }
}

fn read_index(path: &Path) -> Result<(Vec<String>, HashMap<String, String>)> {
    let text = std::fs::read(path).map_err(|e| CoreError::io(path, e))?;
    parse_index(path, &text)
}

/// Parses the text of `model.safetensors.index.json`: the shard file names (sorted,
/// unique, each a plain file name) and the weight map. A tensor name given twice in the
/// weight map is an error (which file holds it would depend on the JSON reader).
/// `path` is only used in messages.
pub fn parse_index(path: &Path, text: &[u8]) -> Result<(Vec<String>, HashMap<String, String>)> {
    #[derive(serde::Deserialize)]
    struct Typed {
        weight_map: crate::json::UniqueKeys<String>,
    }
    #[derive(serde::Deserialize)]
    struct Loose {
        weight_map: Option<HashMap<String, Value>>,
    }
    // Well-formed indexes take the typed parse; anything else is parsed loosely to say
    // what is wrong.
    let map: HashMap<String, String> = match serde_json::from_slice::<Typed>(text) {
        Ok(t) => t.weight_map.0.into_iter().collect(),
        Err(_) => {
            crate::json::check_no_duplicate_keys(text).map_err(|m| index_err(path, m))?;
            let v: Loose = serde_json::from_slice(text)
                .map_err(|e| index_err(path, format!("not valid JSON: {e}")))?;
            let map = v
                .weight_map
                .ok_or_else(|| index_err(path, "missing \"weight_map\" object".into()))?;
            let mut out = HashMap::with_capacity(map.len());
            for (name, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    index_err(path, format!("weight_map[\"{name}\"] is not a string"))
                })?;
                out.insert(name, file.to_string());
            }
            out
        }
    };
    let mut files = BTreeSet::new();
    for (name, file) in &map {
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(index_err(
                path,
                format!("weight_map[\"{name}\"] = \"{file}\" is not a plain file name"),
            ));
        }
        if !files.contains(file.as_str()) {
            files.insert(file.clone());
        }
    }
    Ok((files.into_iter().collect(), map))
}

/// A model directory known by its `config.json` alone: no shard is opened. For what the
/// config decides by itself (shapes, the KV layout), where opening every shard would cost
/// the header scan the planner's sidecar exists to avoid.
impl ModelDir {
    /// Reads `path/config.json` only; the directory has no tensors.
    pub fn config_only(path: impl AsRef<Path>) -> Result<ModelDir> {
        let path = path.as_ref();
        if let Some(file) = model_gguf(path)? {
            // A GGUF's config is its metadata: only the header is parsed.
            return ModelDir::open_gguf(&file);
        }
        if !path.is_dir() {
            return Err(CoreError::MissingDir(path.to_path_buf()));
        }
        Ok(ModelDir {
            path: path.to_path_buf(),
            config: RawConfig::read(&path.join("config.json"))?,
            shards: Vec::new(),
            index: HashMap::new(),
            gguf: None,
        })
    }
}
