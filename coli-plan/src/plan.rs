//! `coli plan`: will this model run here, how fast, with which settings — from the cached
//! analysis, the config, this machine's measured memory and disk bandwidth, and the
//! routing history when there is one.
//!
//! Memory: resident weights (dense, shared experts, indexer) + KV cache at the context
//! asked for (f32, exactly as coli allocates it) + working buffers + expert-store buffers
//! in flight + the family's measured process baseline; what remains of the RAM budget
//! becomes expert cache slots per layer. Speed: per token, the resident bytes a decode step
//! reads — at the slower of the measured memory bandwidth and the decode kernels' measured
//! rate for each stored dtype (dequantizing formats can be compute-bound) — plus the expert
//! bytes that miss the cache at the measured disk bandwidth; the largest term names the
//! bottleneck.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::analyze::analyze;
use crate::{PlanError, Result};

/// Version of the `--json` schema.
pub const PLAN_VERSION: u32 = 2;

/// Process baseline measured per family: peak RSS of `coli run` on the family's tiny oracle
/// fixture (weights < 0.5 MB), 4 tokens, 2026-11-30 — binary, libraries, thread stacks,
/// tokenizer-free runtime. A family missing here is refused: no plausible-looking zero.
const MEASURED_BASELINE: &[(&str, u64)] = &[
    ("Llama", 7 << 20),
    ("OLMoE", 9 << 20),
    ("Qwen2-MoE", 9 << 20),
    ("Qwen3-MoE", 10 << 20),
    ("Mixtral", 9 << 20),
    ("DeepSeek-V3", 8 << 20),
    ("GLM-4.5-MoE", 9 << 20),
    ("GLM-5", 11 << 20),
    // 2026-12-01: 8.4-8.6 MB on both gpt-oss fixtures.
    ("gpt-oss", 9 << 20),
    // 2026-12-01: 9.0-9.1 MB on both MiniMax-M2 fixtures.
    ("MiniMax-M2", 10 << 20),
    // 2026-12-01: 9.2-9.3 MiB on both fixtures of each.
    ("Qwen3-Next", 10 << 20),
    ("Qwen3.5-MoE", 10 << 20),
    // 2026-12-02: 9.3-9.7 MiB on both DeepSeek-V4 fixtures.
    ("DeepSeek-V4", 10 << 20),
];

/// Expert buffers beyond the cache: reads in flight (4 I/O threads) and the buffer arena's
/// granularity (8 per allocation).
const STORE_EXTRA_BUFFERS: u64 = 12;

/// Bandwidths of this machine (cached by [`probe`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Probe {
    /// Read bandwidth of RAM, GB/s (parallel sum over 512 MiB, best of 3).
    pub memory_gb_s: f64,
    /// O_DIRECT random 4 MiB reads from the model's largest shard, GB/s; `None` when the
    /// shard is sparse (a census) or cannot be read directly.
    pub disk_gb_s: Option<f64>,
    /// Where the disk figure was measured.
    pub disk_file: Option<String>,
    /// Weight bytes per second the decode kernels process, by stored dtype (one token,
    /// all threads, a 64 MiB matrix streamed from memory), GB/s.
    #[serde(default)]
    pub kernel_gb_s: std::collections::BTreeMap<String, f64>,
    /// The build that measured `kernel_gb_s` (its executable's path, size and mtime): a
    /// rebuilt or upgraded coli measures its kernels again, since their rates change
    /// with the code.
    #[serde(default)]
    pub kernels_build: Option<String>,
}

/// This executable's identity for [`Probe::kernels_build`]: path, size and mtime in
/// nanoseconds; `None` when the executable cannot be found.
fn this_build() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let exe = std::env::current_exe().ok()?;
    let m = std::fs::metadata(&exe).ok()?;
    Some(format!(
        "{} {} {}.{:09}",
        exe.display(),
        m.len(),
        m.mtime(),
        m.mtime_nsec()
    ))
}

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// RAM budget (default: MemAvailable).
    pub ram: Option<u64>,
    /// Context length to budget the KV cache for.
    pub ctx: usize,
    /// Concurrent sequences (KV caches).
    pub kv_slots: usize,
}

/// The plan (`--json` schema version [`PLAN_VERSION`]).
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// Schema version.
    pub version: u32,
    /// Family and type.
    pub family: String,
    /// `model_type`.
    pub model_type: String,
    /// RAM budget used.
    pub ram_bytes: u64,
    /// Dense + shared experts + indexer (+ the MTP layer when it drafts), as stored.
    pub resident_weight_bytes: u64,
    /// The MTP layer's bytes when `--draft auto` drafts by it (every expert stays in RAM
    /// with the layer budgeted), else 0.
    pub mtp_bytes: u64,
    /// KV cache at `ctx` for `kv_slots` sequences.
    pub kv_bytes: u64,
    /// Scratch of a decode step at `ctx`.
    pub working_bytes: u64,
    /// Measured process baseline plus expert buffers in flight.
    pub runtime_reserve_bytes: u64,
    /// Everything but the expert cache.
    pub resident_bytes: u64,
    /// Bytes left for cached experts.
    pub expert_cache_bytes: u64,
    /// Layers with routed experts.
    pub moe_layers: usize,
    /// Experts per MoE layer.
    pub experts_per_layer: usize,
    /// Largest expert.
    pub expert_bytes: u64,
    /// Cache slots per layer the budget allows.
    pub cap_per_layer: usize,
    /// Experts per token per layer (`num_experts_per_tok`).
    pub top_k: usize,
    /// Projected share of expert requests served from RAM.
    pub projected_hit_rate: f64,
    /// How the hit rate was projected: "all cached", "routing history" or "uniform routing".
    pub hit_rate_basis: String,
    /// Bytes a decode step reads from RAM.
    pub ram_bytes_per_token: u64,
    /// Expert bytes a decode step reads from disk.
    pub disk_bytes_per_token: u64,
    /// "memory", "compute" or "disk".
    pub bottleneck: String,
    /// Projected decode tokens/s (`None` when the disk rate is unknown and experts miss).
    pub projected_decode_tok_s: Option<f64>,
    /// The measurements used.
    pub probe: Probe,
    /// `coli run` flags this plan would apply.
    pub settings: Vec<String>,
    /// Whether the model can run within the budget at all.
    pub fits: bool,
    /// Why not, or what to know.
    pub notes: Vec<String>,
}

/// Memory a model needs besides its weights, from its config alone (no tensor is read):
/// the KV cache per position as the family lays it out
/// ([`coli_models::families::Family::kv_layout`], which loading checks against the
/// blocks), and an upper bound of one decode step's scratch
/// ([`coli_models::arch::scratch::decode_bytes_bound`]).
pub struct MemoryShape {
    /// KV cache bytes per position, all layers.
    pub kv_bytes_per_token: u64,
    /// Bytes one sequence keeps whatever its length: recurrent states (linear-attention
    /// layers) and the rings of DeepSeek-V4 and sliding-window layers.
    pub state_bytes_per_sequence: u64,
    /// Scratch bytes of one decode step (an upper bound).
    pub working_bytes: u64,
}

impl MemoryShape {
    /// The shape of the model in `dir` at a context of `ctx` positions.
    pub fn of(dir: &Path, ctx: usize) -> Result<MemoryShape> {
        let md = coli_core::ModelDir::config_only(dir)?;
        let family = coli_models::families::lookup(md.config.model_type()?)?;
        let layout = (family.kv_layout)(&md)?;
        Ok(MemoryShape {
            kv_bytes_per_token: layout.bytes_per_position() as u64,
            state_bytes_per_sequence: layout.state_bytes(ctx) as u64,
            working_bytes: coli_models::arch::scratch::decode_bytes_bound(&md.config, ctx) as u64,
        })
    }
}

fn probe_path() -> PathBuf {
    let base = std::env::var_os("COLI_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("coli")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/coli")))
        .unwrap_or_else(|| PathBuf::from(".coli-cache"));
    base.join("probe.json")
}

fn memory_gb_s() -> f64 {
    use rayon::prelude::*;
    // XOR of 64-bit words: vectorizes, so the loop runs at memory speed, not add latency.
    let v = vec![1u64; 64 << 20];
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let s: u64 = v
            .par_chunks(1 << 15)
            .map(|c| c.iter().fold(0u64, |a, &x| a ^ x))
            .reduce(|| 0, |a, b| a ^ b);
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max(v.len() as f64 * 8.0 / secs / 1e9);
    }
    best
}

/// Decode-kernel throughput per stored dtype (weights in GB/s): a 64 MiB matrix (larger
/// than the caches, so memory streaming is part of it) times one token, repeated for
/// ~100 ms, on the current thread pool.
/// The stored dtypes the kernel probe rates (`U8` is coli int4; `MXFP4` the e2m1
/// blocks of gpt-oss, which the analysis names so).
const PROBED: [&str; 7] = ["BF16", "F16", "F32", "I8", "U8", "F8_E4M3", "MXFP4"];

/// The GGUF block types probed too (read in place, under their ggml names): what the
/// common quantizations are made of.
const GGML_PROBED: [coli_core::gguf::GgmlType; 9] = {
    use coli_core::gguf::GgmlType::*;
    [Q8_0, Q4_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS]
};

/// Every dtype name a valid probe has a rate for.
fn probed_names() -> impl Iterator<Item = &'static str> {
    PROBED
        .into_iter()
        .chain(GGML_PROBED.into_iter().map(|t| t.name()))
}

fn kernel_gb_s() -> std::collections::BTreeMap<String, f64> {
    use coli_kernels::matmul::{matmul, BlockScales};
    use coli_kernels::{MatRef, WFormat};
    let cols = 4096usize;
    let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1).collect();
    let mut rates = std::collections::BTreeMap::new();
    let formats = [
        (WFormat::BF16, None),
        (WFormat::F16, None),
        (WFormat::F32, None),
        (WFormat::I8, Some((1, cols))),
        (WFormat::I4, Some((1, 64))),
        (WFormat::F8E4M3, Some((128, 128))),
        (WFormat::F4E2M1, Some((1, 32))),
    ];
    let all = PROBED.into_iter().zip(formats).chain(
        GGML_PROBED
            .into_iter()
            .map(|t| (t.name(), (WFormat::Ggml(t), None))),
    );
    for (name, (fmt, block)) in all {
        let rows = (64usize << 20) / fmt.row_bytes(cols);
        let mut out = vec![0.0f32; rows];
        let bytes = vec![0x11u8; rows * fmt.row_bytes(cols)];
        let scales: Vec<f32> = match block {
            Some((br, bc)) => vec![0.01; rows.div_ceil(br) * cols.div_ceil(bc)],
            None => Vec::new(),
        };
        let mut m = MatRef::new(fmt, &bytes, rows, cols);
        if let Some((br, bc)) = block {
            m = m.with_scales(BlockScales {
                scales: (&scales).into(),
                block_rows: br,
                block_cols: bc,
            });
        }
        let t = std::time::Instant::now();
        let mut n = 0u64;
        while t.elapsed().as_secs_f64() < 0.1 || n < 2 {
            matmul(&m, &x, 1, &mut out);
            n += 1;
        }
        rates.insert(
            name.to_string(),
            bytes.len() as f64 * n as f64 / t.elapsed().as_secs_f64() / 1e9,
        );
    }
    rates
}

fn disk_gb_s(file: &Path) -> Option<f64> {
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    let meta = std::fs::metadata(file).ok()?;
    if meta.blocks() * 512 < meta.len() / 2 {
        return None; // sparse: reads of holes measure nothing
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .ok()?;
    const CHUNK: usize = 4 << 20;
    let n_chunks = (meta.len() as usize / CHUNK).max(1);
    let mut buf = memmap2::MmapMut::map_anon(CHUNK).ok()?;
    let (mut bytes, t, mut i) = (0u64, std::time::Instant::now(), 0usize);
    while t.elapsed().as_secs_f64() < 0.3 && i < 256 {
        let off = ((i * 7919) % n_chunks * CHUNK) as u64;
        let got = f.read_at(&mut buf[..], off).ok()?;
        if got == 0 {
            break;
        }
        bytes += got as u64;
        i += 1;
    }
    Some(bytes as f64 / t.elapsed().as_secs_f64() / 1e9)
}

/// The machine's bandwidths, measured once and cached (per largest-shard file for the disk).
pub fn probe(analysis_dir: &Path, remeasure: bool) -> Probe {
    let largest = coli_core::model_files(analysis_dir).ok().and_then(|files| {
        files
            .into_iter()
            .max_by_key(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
    });
    let path = probe_path();
    let build = this_build();
    let cached = std::fs::read(&path)
        .ok()
        .and_then(|t| serde_json::from_slice::<Probe>(&t).ok())
        .filter(|_| !remeasure);
    let disk_file = largest.as_ref().map(|l| l.to_string_lossy().into_owned());
    // Kernel rates belong to the build that measured them, and only count when they
    // cover every probed format (an older version rated fewer).
    let kernels_valid = |p: &Probe| {
        p.kernels_build == build && probed_names().all(|d| p.kernel_gb_s.contains_key(d))
    };
    if let Some(p) = &cached {
        if p.disk_file == disk_file && kernels_valid(p) {
            return p.clone();
        }
    }
    // The memory rate belongs to the machine and the kernel rates to the machine and
    // the build: reuse what still holds; the disk figure belongs to where this model
    // lives.
    let memory_gb_s = match &cached {
        Some(p) => p.memory_gb_s,
        None => memory_gb_s(),
    };
    let kernel_gb_s = match cached {
        Some(p) if kernels_valid(&p) => p.kernel_gb_s,
        _ => kernel_gb_s(),
    };
    let p = Probe {
        memory_gb_s,
        disk_gb_s: largest.as_deref().and_then(disk_gb_s),
        disk_file,
        kernel_gb_s,
        kernels_build: build,
    };
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
        let bytes = serde_json::to_vec(&p).unwrap_or_default();
        let _ = coli_core::write::write_atomic(&path, |w| {
            use std::io::Write;
            w.write_all(&bytes)
        });
    }
    p
}

/// Builds the plan for `dir`.
pub fn plan(dir: &Path, req: &PlanRequest, remeasure: bool) -> Result<Plan> {
    let (a, _) = analyze(dir)?;
    let family = a.family()?;
    let baseline = MEASURED_BASELINE
        .iter()
        .find(|(f, _)| *f == family.display_name)
        .map(|(_, b)| *b)
        .ok_or(PlanError::NoBaseline {
            family: family.display_name,
        })?;
    let config = coli_core::ModelDir::config_only(dir)?.config;
    let ctx = req.ctx.max(1);
    let shape = MemoryShape::of(dir, ctx)?;
    let kv = (shape.kv_bytes_per_token * ctx as u64 + shape.state_bytes_per_sequence)
        * req.kv_slots.max(1) as u64;
    let working = shape.working_bytes;
    let top_k = config
        .value
        .get("num_experts_per_tok")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0) as usize;
    let moe_layers = a.expert_layers.len();
    let experts_per_layer = a.expert_layers.iter().map(|l| l.experts).max().unwrap_or(0);
    let expert_bytes = a.max_expert_bytes;
    let reserve = baseline
        + if moe_layers > 0 {
            STORE_EXTRA_BUFFERS * expert_bytes
        } else {
            0
        };
    let resident = a.resident_bytes() + kv + working + reserve;
    let ram = req
        .ram
        .or_else(coli_models::experts::available_memory)
        .ok_or(PlanError::UnknownMemory)?;
    let mut notes = Vec::new();
    // The MTP layer drafts under `--draft auto` when every routed expert still stays in RAM
    // with the layer's own bytes (dense and experts) taken first, as
    // `coli_models::generate::mtp_fits` decides at load; then it is budgeted here.
    let per_slot = (moe_layers as u64 * expert_bytes).max(1);
    // A dense model always keeps it, as the engine does.
    let mtp_drafting = a.mtp_bytes > 0
        && (moe_layers == 0 || {
            let with = resident + a.mtp_bytes;
            with <= ram && ((ram - with) / per_slot) as usize >= experts_per_layer
        });
    let mtp_bytes = if mtp_drafting { a.mtp_bytes } else { 0 };
    if a.mtp_bytes > 0 {
        notes.push(if mtp_drafting {
            format!(
                "the MTP layer ({:.2} GB) is budgeted: --draft auto drafts by it",
                a.mtp_bytes as f64 / 1e9
            )
        } else {
            format!(
                "the MTP layer ({:.2} GB) is not budgeted: beside it not every expert fits, so --draft auto leaves it unloaded",
                a.mtp_bytes as f64 / 1e9
            )
        });
    }
    let resident = resident + mtp_bytes;
    let fits =
        resident <= ram && (moe_layers == 0 || ram - resident >= moe_layers as u64 * expert_bytes);
    if !fits {
        notes.push(format!(
            "needs at least {:.2} GB (resident {:.2} GB + one expert slot per layer); budget {:.2} GB",
            (resident + moe_layers as u64 * expert_bytes) as f64 / 1e9,
            resident as f64 / 1e9,
            ram as f64 / 1e9
        ));
    }
    let cache_bytes = ram.saturating_sub(resident);
    let cap = ((cache_bytes / per_slot) as usize).min(experts_per_layer);
    // Hit rate: every expert cached; else the routing history's top-`cap` share per layer;
    // else uniform routing.
    let (hit, basis) = if moe_layers == 0 || cap >= experts_per_layer {
        (1.0, "all cached".to_string())
    } else {
        let history = coli_models::experts::usage::read(dir);
        if history.is_empty() {
            (
                cap as f64 / experts_per_layer.max(1) as f64,
                "uniform routing".into(),
            )
        } else {
            let mut covered = 0u64;
            let mut total = 0u64;
            for l in &a.expert_layers {
                let mut counts: Vec<u64> = history
                    .iter()
                    .filter(|((layer, _), _)| *layer == l.layer)
                    .map(|(_, &c)| c)
                    .collect();
                counts.sort_unstable_by(|x, y| y.cmp(x));
                total += counts.iter().sum::<u64>();
                covered += counts.iter().take(cap).sum::<u64>();
            }
            (
                covered as f64 / total.max(1) as f64,
                "routing history (.coli_usage)".into(),
            )
        }
    };
    // A decode step reads every resident weight but an untied embedding table (one row).
    let active_experts = (top_k * moe_layers) as u64 * expert_bytes;
    let ram_per_token = a.resident_read_bytes() + active_experts;
    let disk_per_token = ((1.0 - hit) * active_experts as f64) as u64;
    let probe = probe(dir, remeasure);
    let t_mem = ram_per_token as f64 / (probe.memory_gb_s * 1e9);
    // Compute: the bytes a step processes per stored dtype at the kernels' measured rate
    // (resident weights minus the embedding table, plus the active experts' share).
    let rate = |d: &str| {
        probe
            .kernel_gb_s
            .get(d)
            .copied()
            .unwrap_or(probe.memory_gb_s)
            * 1e9
    };
    let resident_total = a.resident_dtype_bytes.values().sum::<u64>().max(1) as f64;
    let expert_total = a.expert_dtype_bytes.values().sum::<u64>().max(1) as f64;
    let resident_read = a.resident_read_bytes() as f64;
    let t_compute: f64 = a
        .resident_dtype_bytes
        .iter()
        .map(|(d, &b)| resident_read * (b as f64 / resident_total) / rate(d))
        .sum::<f64>()
        + a.expert_dtype_bytes
            .iter()
            .map(|(d, &b)| active_experts as f64 * (b as f64 / expert_total) / rate(d))
            .sum::<f64>();
    let t_ram = t_mem.max(t_compute);
    let t_disk = probe.disk_gb_s.map(|d| disk_per_token as f64 / (d * 1e9));
    let bottleneck = match t_disk {
        Some(td) if td > t_ram => "disk",
        None if disk_per_token > 0 => "disk",
        _ if t_compute > t_mem => "compute",
        _ => "memory",
    };
    let tok_s = match t_disk {
        Some(td) => Some(1.0 / (t_ram + td)),
        None if disk_per_token == 0 => Some(1.0 / t_ram),
        None => {
            notes.push(
                "disk bandwidth unknown (sparse or unreadable shards): no speed projection".into(),
            );
            None
        }
    };
    let mut settings = vec![];
    if moe_layers > 0 {
        settings.push(format!("--cap {}", cap.max(1)));
        if cap < experts_per_layer {
            settings.push("--direct".into());
            settings.push("--prefetch on".into());
        }
    }
    Ok(Plan {
        version: PLAN_VERSION,
        family: family.display_name.to_string(),
        model_type: a.model_type.clone(),
        ram_bytes: ram,
        resident_weight_bytes: a.resident_bytes() + mtp_bytes,
        mtp_bytes,
        kv_bytes: kv,
        working_bytes: working,
        runtime_reserve_bytes: reserve,
        resident_bytes: resident,
        expert_cache_bytes: if moe_layers > 0 {
            cap as u64 * per_slot
        } else {
            0
        },
        moe_layers,
        experts_per_layer,
        expert_bytes,
        cap_per_layer: cap,
        top_k,
        projected_hit_rate: hit,
        hit_rate_basis: basis,
        ram_bytes_per_token: ram_per_token,
        disk_bytes_per_token: disk_per_token,
        bottleneck: bottleneck.into(),
        projected_decode_tok_s: if fits { tok_s } else { None },
        probe,
        settings,
        fits,
        notes,
    })
}
