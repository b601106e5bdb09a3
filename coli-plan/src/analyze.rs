//! `analyze_model`: a model directory's shard headers, validated and classified.
//!
//! The scan reads each shard's 8-byte length prefix and JSON header with `pread` and
//! validates it (length bounds, offsets inside the file, known dtype, byte span = shape ×
//! dtype size, no overlaps; no tensor in two shards). Each tensor is classified by the
//! family registry's name layout (dense, routed expert of a layer, shared expert, DSA
//! indexer, MTP layer) and the bytes are totalled.
//!
//! The result is cached in `.coli_analysis.json` beside the model, keyed on a signature:
//! the format version and the (size, mtime_ns) of `config.json`, the index and every shard.
//! A hit returns the stored result without reading any header; a changed file, a corrupt,
//! truncated or foreign cache means a full scan (never an error); a directory that cannot
//! be written keeps working uncached. Writes go to a temp file unique to the process and
//! thread, are fsynced and renamed over the cache (temp removed on failure).

use crate::PlanError;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use coli_core::model_dir::model_gguf;
use coli_core::safetensors_header::{header_len, parse_header};
use coli_core::{model_files, shard_paths, sidecar_path, CoreError, ModelDir, RawConfig};
use coli_models::families::{classify, lookup, FamilyDescriptor, TensorClass};
use serde::{Deserialize, Serialize};

/// The sidecar's file name.
pub const SIDECAR: &str = ".coli_analysis.json";

/// Version of the sidecar format (a different version is a miss).
pub const FORMAT_VERSION: u32 = 8;

/// Full scans run by this process.
pub static SCANS: AtomicU64 = AtomicU64::new(0);

/// Bytes and counts of one decoder layer's routed experts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertLayer {
    /// Decoder layer.
    pub layer: usize,
    /// Routed experts found.
    pub experts: usize,
    /// Their bytes (weights and scales).
    pub bytes: u64,
    /// The largest expert's bytes.
    pub max_expert_bytes: u64,
}

/// One shard's facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSummary {
    /// File name.
    pub file: String,
    /// File size.
    pub bytes: u64,
    /// Tensors in its header.
    pub tensors: usize,
}

/// What a model is, from its headers. Only serializable facts: the live family descriptor
/// is looked up again from `model_type` ([`Analysis::family`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// `model_type` from config.json.
    pub model_type: String,
    /// The family's display name.
    pub family_name: String,
    /// Decoder layers (`num_hidden_layers`).
    pub n_layers: usize,
    /// Shards in order.
    pub shards: Vec<ShardSummary>,
    /// Tensors over all shards.
    pub tensor_count: usize,
    /// Bytes of every tensor.
    pub model_bytes: u64,
    /// Dense tensors: embeddings, attention, norms, dense MLPs, routers, head.
    pub dense_bytes: u64,
    /// The embedding table's bytes when the head does not read them (an untied table:
    /// a token reads one row of it), 0 when the head is the same tensor. Part of
    /// `dense_bytes`.
    #[serde(default)]
    pub untied_embedding_bytes: u64,
    /// Whether the loader leaves that untied table in its shard, read a row at a time,
    /// instead of copying it into RAM with the other dense weights
    /// (`Transformer::embedding_stays_mapped`).
    #[serde(default)]
    pub embedding_mapped: bool,
    /// Shared experts.
    pub shared_expert_bytes: u64,
    /// DSA indexer.
    pub indexer_bytes: u64,
    /// MTP layers, but their copies of the embedding and the head (never read): budgeted
    /// by the plan only when `--draft auto` drafts by the layer.
    pub mtp_bytes: u64,
    /// Tensors never read: outside the text model (a vision tower), or an MTP layer's
    /// copies of the embedding and the head.
    #[serde(default)]
    pub ignored_bytes: u64,
    /// Routed experts, all layers.
    pub expert_bytes: u64,
    /// Routed experts per MoE layer.
    pub expert_layers: Vec<ExpertLayer>,
    /// Median bytes of one expert.
    pub typical_expert_bytes: u64,
    /// Largest expert.
    pub max_expert_bytes: u64,
    /// Resident bytes (dense, shared experts, indexer) by stored dtype.
    pub resident_dtype_bytes: BTreeMap<String, u64>,
    /// Routed expert bytes by stored dtype.
    pub expert_dtype_bytes: BTreeMap<String, u64>,
}

impl Analysis {
    /// The live family descriptor.
    pub fn family(&self) -> coli_models::Result<&'static FamilyDescriptor> {
        lookup(&self.model_type)
    }

    /// Bytes the loader copies into RAM: dense, shared experts, indexer, but an embedding
    /// table that stays in its shard ([`Analysis::embedding_mapped`]).
    pub fn resident_bytes(&self) -> u64 {
        let mapped = if self.embedding_mapped {
            self.untied_embedding_bytes
        } else {
            0
        };
        self.resident_class_bytes().saturating_sub(mapped)
    }

    /// Resident-class bytes a decode step reads: dense (the head included), shared
    /// experts, indexer, but an untied embedding table, of which it reads one row.
    pub fn resident_read_bytes(&self) -> u64 {
        self.resident_class_bytes()
            .saturating_sub(self.untied_embedding_bytes)
    }

    /// Dense, shared experts and indexer: the tensors that are not streamed.
    fn resident_class_bytes(&self) -> u64 {
        self.dense_bytes + self.shared_expert_bytes + self.indexer_bytes
    }
}

/// How [`analyze`] got its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from a valid sidecar; no header was read.
    Hit,
    /// Scanned, and the sidecar was (re)written.
    Stored,
    /// Scanned; the sidecar could not be written (the reason).
    Uncached(String),
}

/// Errors of the scan: the model itself is unreadable or invalid (said in one line).
type Result<T> = std::result::Result<T, String>;

#[derive(Serialize, Deserialize)]
struct Sidecar {
    format_version: u32,
    signature: Vec<FileStamp>,
    analysis: Analysis,
}

/// (name, size, mtime in ns) of one file the analysis depends on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    path: String,
    size: u64,
    mtime_ns: i128,
}

fn stamp(path: &Path) -> Result<FileStamp> {
    let m = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(FileStamp {
        path: path.display().to_string(),
        size: m.len(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
    })
}

/// The files the analysis depends on, stamped, and the weight files among them (a
/// GGUF's parts, or the shards).
fn signature(dir: &Path) -> Result<(Vec<PathBuf>, Vec<FileStamp>)> {
    if model_gguf(dir).map_err(|e| e.to_string())?.is_some() {
        let parts = model_files(dir).map_err(|e| e.to_string())?;
        let sig = parts.iter().map(|p| stamp(p)).collect::<Result<Vec<_>>>()?;
        return Ok((parts, sig));
    }
    let shards = shard_paths(dir).map_err(|e| e.to_string())?;
    let mut files = vec![dir.join("config.json")];
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        files.push(index);
    }
    files.extend(shards.iter().cloned());
    let sig = files.iter().map(|p| stamp(p)).collect::<Result<Vec<_>>>()?;
    Ok((shards, sig))
}

/// Analyzes `dir`, from the sidecar when it is valid for the current files.
pub fn analyze(dir: &Path) -> crate::Result<(Analysis, CacheOutcome)> {
    analyze_cached(dir).map_err(PlanError::Analysis)
}

fn analyze_cached(dir: &Path) -> Result<(Analysis, CacheOutcome)> {
    let path = sidecar_path(dir, SIDECAR);
    if let Some(a) = quick_hit(dir, &path) {
        return Ok((a, CacheOutcome::Hit));
    }
    let (shards, sig) = signature(dir)?;
    if let Some(a) = read_sidecar(&path, &sig) {
        return Ok((a, CacheOutcome::Hit));
    }
    let analysis = scan(dir, &shards)?;
    let outcome = match write_sidecar(&path, &sig, &analysis) {
        Ok(()) => CacheOutcome::Stored,
        Err(e) => CacheOutcome::Uncached(e),
    };
    Ok((analysis, outcome))
}

/// A full scan, ignoring and not touching the sidecar.
pub fn analyze_uncached(dir: &Path) -> crate::Result<Analysis> {
    let (shards, _) = signature(dir).map_err(PlanError::Analysis)?;
    scan(dir, &shards).map_err(PlanError::Analysis)
}

/// The hit path without reading the index: every file the sidecar's signature names still
/// has its size and mtime, and the signature covers config.json and (if there is one) the
/// index — an unchanged index means an unchanged shard list. Without an index the shard
/// list comes from the directory listing (cheap) and must match too.
fn quick_hit(dir: &Path, path: &Path) -> Option<Analysis> {
    let text = std::fs::read(path).ok()?;
    let s: Sidecar = serde_json::from_slice(&text).ok()?;
    if s.format_version != FORMAT_VERSION || s.analysis.family().is_err() {
        return None;
    }
    let index = dir.join("model.safetensors.index.json");
    let named = |p: &Path| s.signature.iter().any(|f| Path::new(&f.path) == p);
    if !named(&dir.join("config.json")) || index.is_file() != named(&index) {
        return None;
    }
    if !index.is_file() {
        let shards = shard_paths(dir).ok()?;
        if shards.len() + 1 != s.signature.len() || !shards.iter().all(|p| named(p)) {
            return None;
        }
    }
    for f in &s.signature {
        if stamp(Path::new(&f.path)).ok()? != *f {
            return None;
        }
    }
    Some(s.analysis)
}

fn read_sidecar(path: &Path, sig: &[FileStamp]) -> Option<Analysis> {
    let text = std::fs::read(path).ok()?;
    let s: Sidecar = serde_json::from_slice(&text).ok()?;
    (s.format_version == FORMAT_VERSION && s.signature == sig && s.analysis.family().is_ok())
        .then_some(s.analysis)
}

/// Temp file beside `dest`, unique per process, thread and call; fsync; rename. The temp
/// file is removed if anything fails.
fn write_sidecar(path: &Path, sig: &[FileStamp], a: &Analysis) -> std::result::Result<(), String> {
    let s = Sidecar {
        format_version: FORMAT_VERSION,
        signature: sig.to_vec(),
        analysis: a.clone(),
    };
    let bytes = serde_json::to_vec(&s).map_err(|e| e.to_string())?;
    coli_core::write::write_atomic(path, |w| w.write_all(&bytes)).map_err(|e| e.to_string())
}

/// Reads and validates one shard's header with pread (not a byte of payload).
fn read_header(path: &Path) -> Result<coli_core::safetensors_header::Header> {
    let bad = |m: String| format!("{}: invalid safetensors header: {m}", path.display());
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    let mut prefix = [0u8; 8];
    let got = f
        .read_at(&mut prefix, 0)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let n = header_len(&prefix[..got], len).map_err(bad)?;
    let mut json = vec![0u8; n];
    f.read_exact_at(&mut json, 8)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    parse_header(&json, len).map_err(bad)
}

/// One tensor as the scan totals it: its name, stored dtype, bytes and outermost dim.
struct Record<'a> {
    name: &'a str,
    dtype: &'a str,
    bytes: u64,
    outer: usize,
}

/// Totals of a scan in progress.
struct Totals<'f> {
    a: Analysis,
    family: &'f FamilyDescriptor,
    experts: BTreeMap<(usize, usize), u64>,
}

impl Totals<'_> {
    /// Classifies one tensor by the family's name layout and adds its bytes.
    fn add(&mut self, r: &Record<'_>) {
        let (a, bytes, name) = (&mut self.a, r.bytes, r.name);
        a.model_bytes += bytes;
        let class = classify(&self.family.layout, name, a.n_layers);
        match class {
            TensorClass::Dense => a.dense_bytes += bytes,
            TensorClass::Expert { layer, expert } => {
                *self.experts.entry((layer, expert)).or_insert(0) += bytes;
                a.expert_bytes += bytes;
            }
            TensorClass::FusedExperts { layer } => {
                // Slice e of the first dimension is expert e.
                let n = r.outer.max(1) as u64;
                for expert in 0..n as usize {
                    *self.experts.entry((layer, expert)).or_insert(0) += bytes / n;
                }
                a.expert_bytes += bytes;
            }
            TensorClass::SharedExpert { .. } => a.shared_expert_bytes += bytes,
            TensorClass::Indexer { .. } => a.indexer_bytes += bytes,
            // The MTP layer's copies of the embedding and the head are never read: it
            // uses the main model's.
            TensorClass::Mtp { .. }
                if name.ends_with(".embed_tokens.weight")
                    || name.ends_with(".shared_head.head.weight") =>
            {
                a.ignored_bytes += bytes
            }
            TensorClass::Mtp { .. } => a.mtp_bytes += bytes,
            TensorClass::Ignored => a.ignored_bytes += bytes,
        }
        let by_dtype = match class {
            TensorClass::Expert { .. } | TensorClass::FusedExperts { .. } => {
                Some(&mut a.expert_dtype_bytes)
            }
            TensorClass::Mtp { .. } | TensorClass::Ignored => None,
            _ => Some(&mut a.resident_dtype_bytes),
        };
        if let Some(m) = by_dtype {
            // Fused expert blocks are MXFP4 (U8 bytes holding e2m1 pairs): their own
            // kernel rate, not coli int4's.
            let dtype = match class {
                TensorClass::FusedExperts { .. } if r.dtype == "U8" => "MXFP4",
                _ => r.dtype,
            };
            *m.entry(dtype.to_string()).or_insert(0) += bytes;
        }
    }

    /// Adds one weight file's summary.
    fn file(&mut self, path: &Path, tensors: usize) {
        self.a.tensor_count += tensors;
        self.a.shards.push(ShardSummary {
            file: path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            tensors,
        });
    }

    /// The per-expert and per-layer figures from the totals.
    fn finish(mut self) -> Analysis {
        let a = &mut self.a;
        let mut per_expert: Vec<u64> = self.experts.values().copied().collect();
        per_expert.sort_unstable();
        a.typical_expert_bytes = per_expert.get(per_expert.len() / 2).copied().unwrap_or(0);
        a.max_expert_bytes = per_expert.last().copied().unwrap_or(0);
        let mut layers: BTreeMap<usize, ExpertLayer> = BTreeMap::new();
        for (&(layer, _), &b) in &self.experts {
            let l = layers.entry(layer).or_insert(ExpertLayer {
                layer,
                experts: 0,
                bytes: 0,
                max_expert_bytes: 0,
            });
            l.experts += 1;
            l.bytes += b;
            l.max_expert_bytes = l.max_expert_bytes.max(b);
        }
        a.expert_layers = layers.into_values().collect();
        self.a
    }
}

fn scan(dir: &Path, shards: &[PathBuf]) -> Result<Analysis> {
    SCANS.fetch_add(1, Ordering::Relaxed);
    // A GGUF is opened whole (its tensor directory is its header); a Hugging Face
    // directory by its config, its headers read below.
    let gguf = match model_gguf(dir).map_err(|e| e.to_string())? {
        Some(_) => Some(ModelDir::open(dir).map_err(|e| e.to_string())?),
        None => None,
    };
    let config = match &gguf {
        Some(md) => md.config.clone(),
        None => RawConfig::read(&dir.join("config.json")).map_err(|e| e.to_string())?,
    };
    let model_type = config.model_type().map_err(|e| e.to_string())?.to_string();
    let family = lookup(&model_type).map_err(|e| e.to_string())?;
    let n_layers = config
        .value
        .get("num_hidden_layers")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| CoreError::Config {
            path: config.path.clone(),
            msg: "key \"num_hidden_layers\": missing or not a number".into(),
        })
        .map_err(|e| e.to_string())? as usize;
    let mut t = Totals {
        a: Analysis {
            model_type,
            family_name: family.display_name.to_string(),
            n_layers,
            shards: Vec::new(),
            tensor_count: 0,
            model_bytes: 0,
            dense_bytes: 0,
            untied_embedding_bytes: 0,
            embedding_mapped: false,
            shared_expert_bytes: 0,
            indexer_bytes: 0,
            mtp_bytes: 0,
            ignored_bytes: 0,
            expert_bytes: 0,
            expert_layers: Vec::new(),
            typical_expert_bytes: 0,
            max_expert_bytes: 0,
            resident_dtype_bytes: BTreeMap::new(),
            expert_dtype_bytes: BTreeMap::new(),
        },
        family,
        experts: BTreeMap::new(),
    };
    let md = match gguf {
        Some(md) => {
            scan_gguf(&md, &mut t);
            Ok(md)
        }
        None => {
            scan_headers(shards, &mut t)?;
            ModelDir::open(dir)
        }
    };
    let mut a = t.finish();
    (a.untied_embedding_bytes, a.embedding_mapped) = embedding_placement(md, family, &config);
    Ok(a)
}

/// A GGUF's tensors under their Hugging Face names (each expert of a stacked tensor by
/// itself); the parse that opened it validated every offset and size.
fn scan_gguf(md: &ModelDir, t: &mut Totals<'_>) {
    let Some(g) = md.gguf() else { return };
    let mut names: Vec<&str> = g.names().collect();
    names.sort_unstable();
    for name in names {
        if let Some(info) = g.tensor_info(name) {
            t.add(&Record {
                name,
                dtype: info.dtype,
                bytes: info.bytes,
                outer: info.shape.first().copied().unwrap_or(1),
            });
        }
    }
    for part in &g.parts {
        t.file(&part.path, part.tensors.len());
    }
}

/// Every shard's header, read and validated in parallel; the totals summed in shard order.
fn scan_headers(shards: &[PathBuf], t: &mut Totals<'_>) -> Result<()> {
    use rayon::prelude::*;
    let headers = shards
        .par_iter()
        .map(|p| read_header(p))
        .collect::<Result<Vec<_>>>()?;
    // No name in two shards: sort all names, compare neighbours (no hashing).
    let mut names: Vec<(&str, usize)> = headers
        .iter()
        .enumerate()
        .flat_map(|(i, h)| h.tensors.keys().map(move |n| (n.as_str(), i)))
        .collect();
    names.par_sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!(
            "{}: tensor \"{}\" is also stored in {}",
            shards[w[1].1].display(),
            w[0].0,
            shards[w[0].1].display()
        ));
    }
    drop(names);
    for (path, h) in shards.iter().zip(&headers) {
        for (name, e) in &h.tensors {
            t.add(&Record {
                name,
                dtype: &e.dtype,
                bytes: e.file_range.len() as u64,
                outer: e.shape.first().copied().unwrap_or(1),
            });
        }
        t.file(path, h.tensors.len());
    }
    Ok(())
}
/// The embedding table's bytes when the head does not read them and whether the loader
/// leaves it in its shard, from the model as the family builds it (headers and views
/// only: no weight is copied). A model the family cannot build gets the estimate
/// `vocab_size * hidden_size * 2` (a bf16 table), copied.
fn embedding_placement(
    md: coli_core::Result<ModelDir>,
    family: &FamilyDescriptor,
    config: &RawConfig,
) -> (u64, bool) {
    let built = md
        .map_err(coli_models::ModelError::from)
        .and_then(|d| (family.load)(&d));
    match built {
        Ok(m) => (m.untied_embedding_bytes(), m.embedding_stays_mapped()),
        Err(_) => {
            let key = |k: &str| config.value.get(k).and_then(serde_json::Value::as_u64);
            let bytes = key("vocab_size").unwrap_or(0) * key("hidden_size").unwrap_or(0) * 2;
            (bytes, false)
        }
    }
}
