//! `coli convert`: a model directory → a quantized container in the safetensors layout.
//!
//! Routed experts become int8 (one f32 scale per row, `{name}_scale` `[rows, 1]`), int4
//! (values `q + 8` in nibbles, even column low, one scale per 64 columns of a row,
//! `{name}_scale` `[rows, ceil(cols / 64)]`) or bf16; dense matrices bf16 or int8. Embeddings,
//! the output head, routers and every vector keep their stored precision. Each source
//! matrix is dequantized exactly (any supported format, FP8 included) before quantizing.
//!
//! Each expert's gate, up and down (with their scales) are stored next to each other, so
//! the expert store fetches an expert with one read. Every shard carries the stamp
//! `coli.format` in its metadata. Conversion streams: one tensor is read, converted and
//! written at a time (memory is bounded by the largest tensor, whatever the model's size),
//! and the written part is synced and dropped from the page cache as it goes. The whole
//! container is written into a temporary sibling
//! directory, each file atomically, and renamed into place at the end: an interrupted or
//! failed convert never leaves a partial `OUT`. An existing `OUT` is refused.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use coli_core::write::{write_atomic, write_safetensors_streaming, TensorSpec};
use coli_core::{DType, ModelDir};

use crate::arch::LinearRole;
use crate::error::{ModelError, Result};
use crate::weights::{Linear, INT4_GROUP};

/// Precision of converted matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// bfloat16.
    Bf16,
    /// int8 with one scale per row.
    Int8,
    /// int4 with one scale per 64 columns.
    Int4,
}

impl Target {
    /// Parses `bf16`, `int8`, `int4`.
    pub fn parse(s: &str) -> Option<Target> {
        match s {
            "bf16" => Some(Target::Bf16),
            "int8" => Some(Target::Int8),
            "int4" => Some(Target::Int4),
            _ => None,
        }
    }

    /// The spelling in the format stamp.
    pub fn name(self) -> &'static str {
        match self {
            Target::Bf16 => "bf16",
            Target::Int8 => "int8",
            Target::Int4 => "int4",
        }
    }
}

/// What to convert to.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// Routed experts.
    pub experts: Target,
    /// Dense matrices (attention, dense MLPs, shared experts, indexer).
    pub dense: Target,
    /// Start a new shard once one holds this many bytes.
    pub shard_bytes: u64,
}

/// The container format version written in `coli.format`.
pub const FORMAT_VERSION: &str = "1";

/// Quantizes one row to int8: `scale = max|x| / 127` (1 for an all-zero row),
/// `q = round(x / scale)` clamped to ±127.
pub fn quantize_int8(row: &[f32], q: &mut [u8]) -> f32 {
    let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
    for (o, &x) in q.iter_mut().zip(row) {
        *o = ((x / scale).round().clamp(-127.0, 127.0) as i8) as u8;
    }
    scale
}

/// Quantizes one row to int4 in groups of [`INT4_GROUP`]: per group `scale = max|x| / 7`
/// (1 for an all-zero group), `q = round(x / scale)` clamped to ±7, stored as `q + 8`.
pub fn quantize_int4(row: &[f32], packed: &mut [u8], scales: &mut [f32]) {
    packed.fill(0);
    for (g, (chunk, s)) in row.chunks(INT4_GROUP).zip(scales.iter_mut()).enumerate() {
        let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        *s = if amax > 0.0 { amax / 7.0 } else { 1.0 };
        for (j, &x) in chunk.iter().enumerate() {
            let q = (x / *s).round().clamp(-7.0, 7.0) as i32 + 8;
            let c = g * INT4_GROUP + j;
            packed[c / 2] |= (q as u8) << (4 * (c % 2));
        }
    }
}

/// The tensors a matrix becomes at a target: the values, then the scales (if any).
fn converted_specs(
    name: &str,
    rows: usize,
    cols: usize,
    target: Target,
) -> Vec<(String, TensorSpec)> {
    let spec = |dtype, shape| TensorSpec { dtype, shape };
    match target {
        Target::Bf16 => vec![(name.to_string(), spec(DType::BF16, vec![rows, cols]))],
        Target::Int8 => vec![
            (name.to_string(), spec(DType::I8, vec![rows, cols])),
            (format!("{name}_scale"), spec(DType::F32, vec![rows, 1])),
        ],
        Target::Int4 => vec![
            (
                name.to_string(),
                spec(DType::U8, vec![rows, cols.div_ceil(2)]),
            ),
            (
                format!("{name}_scale"),
                spec(DType::F32, vec![rows, cols.div_ceil(INT4_GROUP)]),
            ),
        ],
    }
}

/// One converted matrix: the bytes of each tensor of [`converted_specs`], in its order.
fn convert_matrix(m: &coli_kernels::MatRef, target: Target) -> Vec<Vec<u8>> {
    let (rows, cols) = (m.rows, m.cols);
    let mut row = vec![0.0f32; cols];
    match target {
        Target::Bf16 => {
            let mut bytes = Vec::with_capacity(rows * cols * 2);
            for r in 0..rows {
                m.dequant_row(r, &mut row);
                for &x in &row {
                    bytes.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
                }
            }
            vec![bytes]
        }
        Target::Int8 => {
            let mut q = vec![0u8; rows * cols];
            let mut scales = Vec::with_capacity(rows * 4);
            for r in 0..rows {
                m.dequant_row(r, &mut row);
                let s = quantize_int8(&row, &mut q[r * cols..(r + 1) * cols]);
                scales.extend_from_slice(&s.to_le_bytes());
            }
            vec![q, scales]
        }
        Target::Int4 => {
            let (rb, groups) = (cols.div_ceil(2), cols.div_ceil(INT4_GROUP));
            let mut packed = vec![0u8; rows * rb];
            let mut scales = Vec::with_capacity(rows * groups * 4);
            let mut s = vec![0.0f32; groups];
            for r in 0..rows {
                m.dequant_row(r, &mut row);
                quantize_int4(&row, &mut packed[r * rb..(r + 1) * rb], &mut s);
                for v in &s {
                    scales.extend_from_slice(&v.to_le_bytes());
                }
            }
            vec![packed, scales]
        }
    }
}

/// Output bytes of a matrix at a target (scales included).
fn converted_bytes(rows: usize, cols: usize, t: Target) -> u64 {
    (match t {
        Target::Bf16 => rows * cols * 2,
        Target::Int8 => rows * cols + rows * 4,
        Target::Int4 => rows * cols.div_ceil(2) + rows * cols.div_ceil(INT4_GROUP) * 4,
    }) as u64
}

/// A unit of the output: tensors that must land in the same shard, next to each other.
struct Unit {
    /// Source tensor names, with what to do with each.
    items: Vec<(String, Action)>,
    bytes: u64,
}

#[derive(Clone, Copy)]
enum Action {
    Copy,
    Convert(Target),
}

/// What the conversion writes: its units in output order, and whether FP8 tensors stay.
struct ConvertPlan {
    /// Matrices by tensor name, with their role.
    role_of: HashMap<String, (LinearRole, Linear)>,
    units: Vec<Unit>,
    fp8_left: bool,
    /// Tensors holding every expert of a layer (gpt-oss' MXFP4 blocks), copied as stored.
    fused_kept: Vec<String>,
    /// Output names of the experts cut out of unquantized fused tensors, by view name.
    renamed: HashMap<String, String>,
}

/// The per-expert name of a matrix cut out of an unquantized fused expert tensor, as
/// transformers 5 fuses Qwen-style experts (`experts.gate_up_proj` = the gates' rows then
/// the up projections', `experts.down_proj`): view `{p}.experts.gate_up_proj[e][0]` is
/// `{p}.experts.{e}.gate_proj.weight`, `[e][1]` its `up_proj`, and
/// `{p}.experts.down_proj[e][0]` is `{p}.experts.{e}.down_proj.weight`. `None` for any other
/// name.
fn split_fused_name(view: &str) -> Option<(String, String)> {
    let (rest, part) = view.strip_suffix(']')?.rsplit_once('[')?;
    let (base, e) = rest.strip_suffix(']')?.rsplit_once('[')?;
    let e: usize = e.parse().ok()?;
    let (prefix, tensor) = base.rsplit_once('.')?;
    let proj = match (tensor, part) {
        ("gate_up_proj", "0") => "gate_proj",
        ("gate_up_proj", "1") => "up_proj",
        ("down_proj", "0") => "down_proj",
        _ => return None,
    };
    prefix
        .ends_with(".experts")
        .then(|| (base.to_string(), format!("{prefix}.{e}.{proj}.weight")))
}

/// The per-expert name of an input-major expert matrix (gpt-oss unquantized, as transformers
/// fuses it): view `{p}.experts.gate_up_proj[e]` is written `[out, in]` as
/// `{p}.experts.{e}.gate_up_proj.weight`, `down_proj[e]` as `{p}.experts.{e}.down_proj.weight`
/// (the biases stay fused). `None` for any other name.
fn split_transposed_name(view: &str) -> Option<(String, String)> {
    let (base, e) = view.strip_suffix(']')?.rsplit_once('[')?;
    let e: usize = e.parse().ok()?;
    let (prefix, tensor) = base.rsplit_once('.')?;
    (prefix.ends_with(".experts") && matches!(tensor, "gate_up_proj" | "down_proj"))
        .then(|| (base.to_string(), format!("{prefix}.{e}.{tensor}.weight")))
}

/// What a finished conversion wants the user to know.
#[derive(Clone, Debug, Default)]
pub struct ConvertReport {
    /// Tensors that hold all the experts of a layer at once (gpt-oss' MXFP4 `_blocks`,
    /// already 4.25 bits per weight): copied as stored, whatever `--experts` says.
    pub fused_experts_kept: Vec<String>,
}

/// Converts `input` into a new container at `out`, reporting `(bytes done, bytes total)`.
pub fn convert(
    input: &Path,
    out: &Path,
    opts: &ConvertOptions,
    progress: impl FnMut(u64, u64),
) -> Result<ConvertReport> {
    let fail = |msg: String| ModelError::Import {
        path: out.to_path_buf(),
        msg,
    };
    if out.exists() {
        return Err(fail(
            "already exists; refusing to overwrite (remove it or pick another --out)".into(),
        ));
    }
    let dir = ModelDir::open(input)?;
    let plan = plan_units(&dir, opts)?;
    // Everything goes into a sibling temp directory first.
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = out
        .file_name()
        .ok_or_else(|| fail("needs a directory name".into()))?
        .to_string_lossy()
        .into_owned();
    remove_stale_partials(parent, &base);
    let tmp = parent.join(format!(".{base}.coli-partial-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| fail(format!("creating {}: {e}", tmp.display())))?;
    let result = write_shards(&dir, &plan, opts, &tmp, progress)
        .and_then(|()| copy_side_files(input, &tmp, &fail))
        .and_then(|()| write_config(&dir, plan.fp8_left, &tmp))
        .and_then(|()| {
            std::fs::rename(&tmp, out).map_err(|e| fail(format!("renaming into place: {e}")))
        });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result.map(|()| ConvertReport {
        fused_experts_kept: plan.fused_kept,
    })
}

/// Units: one per routed expert (its three matrices), one per other tensor; scale tensors
/// of converted matrices are dropped (the conversion makes its own).
fn plan_units(dir: &ModelDir, opts: &ConvertOptions) -> Result<ConvertPlan> {
    let family = crate::families::lookup(dir.config.model_type()?)?;
    let mut model = (family.load)(dir)?;
    let mut role_of: HashMap<String, (LinearRole, Linear)> = model
        .linears_mut()
        .into_iter()
        .map(|(role, l)| (l.view().name.clone(), (role, l.clone())))
        .collect();
    drop(model);
    // A matrix read as row blocks `name[g]` of one tensor (DeepSeek-V4's grouped output
    // projection) is converted whole, under its own name.
    let blocks: Vec<String> = role_of
        .iter()
        .filter(|(n, (role, _))| !matches!(role, LinearRole::Expert { .. }) && n.ends_with(']'))
        .map(|(n, _)| n.clone())
        .collect();
    let mut whole: BTreeMap<String, (LinearRole, usize, usize)> = BTreeMap::new();
    for b in blocks {
        let Some((parent, _)) = b.strip_suffix(']').and_then(|x| x.rsplit_once('[')) else {
            continue;
        };
        if !dir.has(parent) {
            continue;
        }
        let (role, l) = role_of.remove(&b).expect("listed above");
        let e = whole.entry(parent.to_string()).or_insert((role, 0, l.cols));
        e.1 += l.rows;
    }
    for (parent, (role, rows, cols)) in whole {
        let l = Linear::load(dir, &parent, rows, cols)?;
        role_of.insert(parent, (role, l));
    }
    // An expert read as slice `[e]` of a tensor holding the whole layer's experts (but
    // input-major ones, which are written per expert below).
    let mut fused_kept: Vec<String> = role_of
        .iter()
        .filter(|(_, (role, l))| matches!(role, LinearRole::Expert { .. }) && !l.is_transposed())
        .filter_map(|(name, _)| name.strip_suffix(']')?.rsplit_once('[').map(|(t, _)| t))
        .filter(|t| dir.has(t))
        .map(str::to_string)
        .collect();
    fused_kept.sort();
    fused_kept.dedup();
    let mut dropped: Vec<String> = Vec::new();
    // Unquantized fused experts are written per expert, converted like any other expert.
    let mut renamed = HashMap::new();
    for (name, (role, l)) in &role_of {
        let split = if l.is_transposed() {
            split_transposed_name(name)
        } else {
            split_fused_name(name)
        };
        if let (LinearRole::Expert { .. }, Some((fused, out))) = (role, split) {
            dropped.push(fused);
            renamed.insert(name.clone(), out);
        }
    }
    let mut split: Vec<&str> = renamed.keys().map(String::as_str).collect();
    split.sort_unstable();
    for (name, (_, l)) in &role_of {
        if l.scales().is_some() {
            dropped.push(format!("{name}_scale_inv"));
            dropped.push(format!("{name}_scale"));
            // DeepSeek-V4's FP8 and FP4 scales: `{stem}.scale` beside `{stem}.weight`.
            if let Some(stem) = name.strip_suffix(".weight") {
                dropped.push(format!("{stem}.scale"));
            }
        }
    }
    dropped.sort_unstable();
    dropped.dedup();
    let mut experts: BTreeMap<(usize, usize), Unit> = BTreeMap::new();
    let mut others: Vec<Unit> = Vec::new();
    let mut fp8_left = false;
    for name in dir.tensor_names().into_iter().chain(split) {
        if dropped.binary_search_by(|d| d.as_str().cmp(name)).is_ok() {
            continue;
        }
        let role = role_of.get(name);
        let view = match role {
            Some((_, l)) if renamed.contains_key(name) => l.view().clone(),
            _ => dir.tensor(name)?,
        };
        let target = role.and_then(|(role, _)| match role {
            LinearRole::Expert { .. } => Some(opts.experts),
            LinearRole::Dense => Some(opts.dense),
            _ => None,
        });
        let (action, bytes) = match (target, role) {
            (Some(t), Some((_, l))) => (Action::Convert(t), converted_bytes(l.rows, l.cols, t)),
            _ => (Action::Copy, view.bytes().len() as u64),
        };
        if matches!(action, Action::Copy) && view.dtype_name == "F8_E4M3" {
            fp8_left = true;
        }
        match role.map(|r| r.0) {
            Some(LinearRole::Expert { layer, expert }) => {
                let u = experts.entry((layer, expert)).or_insert(Unit {
                    items: Vec::new(),
                    bytes: 0,
                });
                u.items.push((name.to_string(), action));
                u.bytes += bytes;
            }
            _ => others.push(Unit {
                items: vec![(name.to_string(), action)],
                bytes,
            }),
        }
    }
    Ok(ConvertPlan {
        role_of,
        units: others.into_iter().chain(experts.into_values()).collect(),
        fp8_left,
        fused_kept,
        renamed,
    })
}

impl ConvertPlan {
    /// The name an input matrix is written under.
    fn out_name<'a>(&'a self, name: &'a str) -> &'a str {
        self.renamed.get(name).map_or(name, String::as_str)
    }
}

/// Writes the units into shards of consecutive units up to the byte limit, and the index.
fn write_shards(
    dir: &ModelDir,
    plan: &ConvertPlan,
    opts: &ConvertOptions,
    tmp: &Path,
    mut progress: impl FnMut(u64, u64),
) -> Result<()> {
    let mut shards: Vec<Vec<&Unit>> = vec![Vec::new()];
    let mut in_shard = 0u64;
    for u in &plan.units {
        if in_shard > 0 && in_shard + u.bytes > opts.shard_bytes {
            shards.push(Vec::new());
            in_shard = 0;
        }
        shards.last_mut().expect("one shard").push(u);
        in_shard += u.bytes;
    }
    let total: u64 = plan.units.iter().map(|u| u.bytes).sum();
    let n = shards.len();
    let mut weight_map = BTreeMap::new();
    let mut done = 0u64;
    let meta: BTreeMap<String, String> = [
        ("format", "pt"),
        ("coli.format", FORMAT_VERSION),
        ("coli.experts", opts.experts.name()),
        ("coli.dense", opts.dense.name()),
        ("coli.int4_group_size", "64"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        let mut specs = BTreeMap::new();
        let mut source = HashMap::new();
        for unit in shard {
            for (name, action) in &unit.items {
                for (out, spec) in output_specs(dir, plan, name, *action)? {
                    weight_map.insert(out.clone(), file.clone());
                    source.insert(out.clone(), (name.as_str(), *action));
                    specs.insert(out, spec);
                }
            }
        }
        // Tensors are written one at a time in name order; a converted matrix's other
        // output (its scales) waits here until its turn.
        let mut waiting: HashMap<String, Vec<u8>> = HashMap::new();
        write_safetensors_streaming(&tmp.join(&file), &specs, &meta, |out, w| {
            let bytes = match waiting.remove(out) {
                Some(b) => b,
                None => {
                    let (name, action) = source[out];
                    let mut produced =
                        produce(dir, plan, name, action).map_err(std::io::Error::other)?;
                    let mine = produced.iter().position(|(n, _)| n == out).expect("listed");
                    let bytes = produced.swap_remove(mine).1;
                    waiting.extend(produced);
                    bytes
                }
            };
            w.write_all(&bytes)?;
            done += bytes.len() as u64;
            progress(done, total);
            Ok(())
        })?;
    }
    let index = serde_json::json!({
        "metadata": {"total_size": total, "coli.format": FORMAT_VERSION},
        "weight_map": weight_map,
    });
    let text = serde_json::to_string_pretty(&coli_core::write::sorted_keys(index)).expect("json");
    write_atomic(&tmp.join("model.safetensors.index.json"), |w| {
        use std::io::Write;
        w.write_all(text.as_bytes())
    })?;
    Ok(())
}

/// The output tensors of one input tensor and their specs: itself, or its conversion.
fn output_specs(
    dir: &ModelDir,
    plan: &ConvertPlan,
    name: &str,
    action: Action,
) -> Result<Vec<(String, TensorSpec)>> {
    Ok(match action {
        Action::Copy => {
            let v = dir.tensor(name)?;
            let spec = TensorSpec {
                dtype: v.dtype()?,
                shape: v.shape.clone(),
            };
            vec![(name.to_string(), spec)]
        }
        Action::Convert(t) => {
            let l = &plan.role_of[name].1;
            converted_specs(plan.out_name(name), l.rows, l.cols, t)
        }
    })
}

/// The bytes of the output tensors of one input tensor, named as [`output_specs`] names them.
fn produce(
    dir: &ModelDir,
    plan: &ConvertPlan,
    name: &str,
    action: Action,
) -> Result<Vec<(String, Vec<u8>)>> {
    Ok(match action {
        Action::Copy => vec![(name.to_string(), dir.tensor(name)?.bytes().to_vec())],
        Action::Convert(t) => {
            let l = &plan.role_of[name].1;
            // Streamed E8M0 scales were not read at load: a NaN among them is refused here.
            l.check_scales()?;
            let names = converted_specs(plan.out_name(name), l.rows, l.cols, t)
                .into_iter()
                .map(|(n, _)| n);
            names.zip(l.with_mat(|m| convert_matrix(&m, t))).collect()
        }
    })
}

/// Copies the model's other files (tokenizer, templates, …) but config and weights.
fn copy_side_files(input: &Path, tmp: &Path, fail: &dyn Fn(String) -> ModelError) -> Result<()> {
    for e in std::fs::read_dir(input).map_err(|e| fail(format!("{}: {e}", input.display())))? {
        let e = e.map_err(|e| fail(e.to_string()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let skip = name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
            || name == "config.json"
            || name.starts_with('.')
            || !e.path().is_file();
        if !skip {
            let bytes = std::fs::read(e.path()).map_err(|x| fail(format!("{name}: {x}")))?;
            write_atomic(&tmp.join(&name), |w| {
                use std::io::Write;
                w.write_all(&bytes)
            })?;
        }
    }
    Ok(())
}

/// The config, with `quantization_config` dropped when no FP8 tensor is left.
fn write_config(dir: &ModelDir, fp8_left: bool, tmp: &Path) -> Result<()> {
    let mut cfg = dir.config.as_written.clone();
    if let Some(o) = cfg.as_object_mut() {
        if !fp8_left {
            o.remove("quantization_config");
        }
        // Routed experts are always rewritten: DeepSeek-V4's FP4 ones are no longer FP4.
        o.remove("expert_dtype");
        if let Some(q) = o
            .get_mut("quantization_config")
            .and_then(|q| q.as_object_mut())
        {
            q.remove("expert_dtype");
        }
    }
    let text = serde_json::to_string_pretty(&coli_core::write::sorted_keys(cfg)).expect("json");
    write_atomic(&tmp.join("config.json"), |w| {
        use std::io::Write;
        w.write_all(text.as_bytes())
    })?;
    Ok(())
}

/// Removes `.{base}.coli-partial-PID` directories whose process is gone (an earlier
/// interrupted convert to the same place).
fn remove_stale_partials(parent: &Path, base: &str) {
    let prefix = format!(".{base}.coli-partial-");
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        {
            let alive = PathBuf::from(format!("/proc/{pid}")).exists();
            if !alive {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coli_kernels::WFormat;

    #[test]
    fn quantizers_round_trip_within_half_a_step() {
        let row: Vec<f32> = (0..150)
            .map(|i| ((i * 37) % 101) as f32 / 13.0 - 3.7)
            .collect();
        let mut q = vec![0u8; 150];
        let s = quantize_int8(&row, &mut q);
        for (i, &x) in row.iter().enumerate() {
            let back = WFormat::I8.load(&q, i) * s;
            assert!((back - x).abs() <= s * 0.5 + 1e-6, "{i}: {back} vs {x}");
        }
        let mut packed = vec![0u8; 75];
        let mut scales = vec![0.0f32; 3];
        quantize_int4(&row, &mut packed, &mut scales);
        for (i, &x) in row.iter().enumerate() {
            let s = scales[i / INT4_GROUP];
            let back = WFormat::I4.load(&packed, i) * s;
            assert!((back - x).abs() <= s * 0.5 + 1e-6, "{i}: {back} vs {x}");
        }
        // All-zero rows survive.
        let zeros = [0.0f32; 10];
        assert_eq!(quantize_int8(&zeros, &mut q[..10]), 1.0);
        assert!(q[..10].iter().all(|&b| b == 0));
    }
}
