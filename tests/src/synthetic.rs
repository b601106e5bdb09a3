//! Synthetic models with the real tensor names and config of a family and random weights
//! (1/sqrt(fan_in) scale), written at test or bench time — never committed. Routed experts
//! can be written directly as coli int8 containers (what `coli convert --experts int8`
//! produces), so a multi-GB streaming benchmark model takes one pass to make.

use std::collections::BTreeMap;
use std::path::Path;

use coli_core::write::{write_atomic, write_safetensors, TensorData};
use coli_core::DType;

mod deepseek;
pub use deepseek::{write_deepseek_v3, DeepseekSpec};

/// Shape of a synthetic OLMoE-architecture model.
#[derive(Clone, Debug)]
pub struct OlmoeSpec {
    /// Decoder layers.
    pub layers: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Residual width.
    pub hidden: usize,
    /// Expert width.
    pub inter: usize,
    /// Attention heads (head_dim = hidden / heads).
    pub heads: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Experts stored as coli int8 (per-row scales) instead of bf16.
    pub int8_experts: bool,
    /// Seed of the weights.
    pub seed: u64,
}

impl OlmoeSpec {
    /// OLMoE-1B-7B's geometry (16 layers, 64 experts, top-8, hidden 2048, experts 1024
    /// wide), int8 experts: about 6.4 GB of experts.
    pub fn olmoe_geometry() -> OlmoeSpec {
        OlmoeSpec {
            layers: 16,
            experts: 64,
            top_k: 8,
            hidden: 2048,
            inter: 1024,
            heads: 16,
            vocab: 50304,
            int8_experts: true,
            seed: 1,
        }
    }

    /// A small one for tests.
    pub fn small() -> OlmoeSpec {
        OlmoeSpec {
            layers: 4,
            experts: 16,
            top_k: 4,
            hidden: 128,
            inter: 96,
            heads: 4,
            vocab: 512,
            int8_experts: false,
            seed: 7,
        }
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn bf16_matrix(rng: &mut Rng, rows: usize, cols: usize, gain: f32) -> TensorData {
    // Uniform with standard deviation gain / sqrt(cols).
    let a = gain * 3f32.sqrt() / (cols as f32).sqrt();
    let mut bytes = Vec::with_capacity(rows * cols * 2);
    for _ in 0..rows * cols {
        bytes.extend_from_slice(&half::bf16::from_f32(rng.unit() * a).to_bits().to_le_bytes());
    }
    TensorData {
        dtype: DType::BF16,
        shape: vec![rows, cols],
        bytes,
    }
}

fn norm(rng: &mut Rng, n: usize) -> TensorData {
    let mut bytes = Vec::with_capacity(n * 2);
    for _ in 0..n {
        bytes.extend_from_slice(
            &half::bf16::from_f32(1.0 + 0.1 * rng.unit())
                .to_bits()
                .to_le_bytes(),
        );
    }
    TensorData {
        dtype: DType::BF16,
        shape: vec![n],
        bytes,
    }
}

/// Random int8 values with one scale per row: the same distribution as [`bf16_matrix`].
fn int8_matrix(rng: &mut Rng, rows: usize, cols: usize) -> (TensorData, TensorData) {
    let a = 3f32.sqrt() / (cols as f32).sqrt();
    let mut q = vec![0u8; rows * cols];
    for chunk in q.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        for (o, b) in chunk.iter_mut().zip(r) {
            // -127..=127
            *o = ((b as i32 % 255) - 127) as i8 as u8;
        }
    }
    let mut scales = Vec::with_capacity(rows * 4);
    for _ in 0..rows {
        scales.extend_from_slice(&(a / 127.0).to_le_bytes());
    }
    (
        TensorData {
            dtype: DType::I8,
            shape: vec![rows, cols],
            bytes: q,
        },
        TensorData {
            dtype: DType::F32,
            shape: vec![rows, 1],
            bytes: scales,
        },
    )
}

/// Writes the model into `dir` (created): one shard for the embeddings and head, one per
/// layer, `model.safetensors.index.json`, `config.json`. Reports `(layers done, layers)`.
pub fn write_olmoe(
    dir: &Path,
    spec: &OlmoeSpec,
    mut progress: impl FnMut(usize, usize),
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = Rng(spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (h, n) = (spec.hidden, spec.layers);
    let container: &[(&str, &str)] = if spec.int8_experts {
        &[("coli.format", "1"), ("coli.experts", "int8")]
    } else {
        &[]
    };
    let mut shards = Shards::new(dir, n + 1, container);
    let mut t = BTreeMap::new();
    t.insert(
        "model.embed_tokens.weight".into(),
        bf16_matrix(&mut rng, spec.vocab, h, (h as f32).sqrt()),
    );
    t.insert(
        "lm_head.weight".into(),
        bf16_matrix(&mut rng, spec.vocab, h, 4.0),
    );
    t.insert("model.norm.weight".into(), norm(&mut rng, h));
    shards.write(0, &t)?;
    for l in 0..n {
        let p = format!("model.layers.{l}");
        let mut t = BTreeMap::new();
        for w in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            t.insert(
                format!("{p}.self_attn.{w}.weight"),
                bf16_matrix(&mut rng, h, h, 1.0),
            );
        }
        t.insert(format!("{p}.self_attn.q_norm.weight"), norm(&mut rng, h));
        t.insert(format!("{p}.self_attn.k_norm.weight"), norm(&mut rng, h));
        t.insert(format!("{p}.input_layernorm.weight"), norm(&mut rng, h));
        t.insert(
            format!("{p}.post_attention_layernorm.weight"),
            norm(&mut rng, h),
        );
        t.insert(
            format!("{p}.mlp.gate.weight"),
            bf16_matrix(&mut rng, spec.experts, h, 1.0),
        );
        for e in 0..spec.experts {
            for (w, rows, cols) in [
                ("gate_proj", spec.inter, h),
                ("up_proj", spec.inter, h),
                ("down_proj", h, spec.inter),
            ] {
                let name = format!("{p}.mlp.experts.{e}.{w}.weight");
                if spec.int8_experts {
                    let (q, s) = int8_matrix(&mut rng, rows, cols);
                    t.insert(format!("{name}_scale"), s);
                    t.insert(name, q);
                } else {
                    t.insert(name, bf16_matrix(&mut rng, rows, cols, 1.0));
                }
            }
        }
        shards.write(l + 1, &t)?;
        progress(l + 1, n);
    }
    shards.write_index()?;
    let config = serde_json::json!({
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "vocab_size": spec.vocab,
        "hidden_size": h,
        "intermediate_size": spec.inter,
        "num_hidden_layers": n,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "num_experts": spec.experts,
        "num_experts_per_tok": spec.top_k,
        "norm_topk_prob": false,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "coli_synthetic": true,
    });
    write_json(&dir.join("config.json"), &config)
}

/// Writes `v` as pretty JSON to `path`, atomically.
/// A synthetic model's shards, `model-{i}-of-{count}.safetensors`, and the index naming
/// each tensor's shard.
struct Shards<'a> {
    dir: &'a Path,
    count: usize,
    meta: BTreeMap<String, String>,
    weight_map: BTreeMap<String, String>,
}

impl<'a> Shards<'a> {
    /// `count` shards in `dir`, each stamped with `meta` beside `format: pt`.
    fn new(dir: &'a Path, count: usize, meta: &[(&str, &str)]) -> Shards<'a> {
        let mut m: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        m.extend(meta.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Shards {
            dir,
            count,
            meta: m,
            weight_map: BTreeMap::new(),
        }
    }

    /// Writes shard `i` (from 0).
    fn write(&mut self, i: usize, tensors: &BTreeMap<String, TensorData>) -> std::io::Result<()> {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, self.count);
        for k in tensors.keys() {
            self.weight_map.insert(k.clone(), file.clone());
        }
        write_safetensors(&self.dir.join(file), tensors, &self.meta)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Writes `model.safetensors.index.json`.
    fn write_index(&self) -> std::io::Result<()> {
        let index = serde_json::json!({"metadata": {}, "weight_map": self.weight_map});
        write_json(&self.dir.join("model.safetensors.index.json"), &index)
    }
}

fn write_json(path: &Path, v: &serde_json::Value) -> std::io::Result<()> {
    write_atomic(path, |w| {
        use std::io::Write;
        w.write_all(serde_json::to_string_pretty(v).expect("json").as_bytes())
    })
    .map_err(|e| std::io::Error::other(e.to_string()))
}

/// Shape of a synthetic gpt-oss model (MXFP4 experts as the release stores them).
#[derive(Clone, Debug)]
pub struct GptOssSpec {
    /// Decoder layers (alternating sliding and full attention).
    pub layers: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Residual width.
    pub hidden: usize,
    /// Expert width.
    pub inter: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Seed of the weights.
    pub seed: u64,
}

impl GptOssSpec {
    /// gpt-oss-20b's layer geometry (hidden 2880, 32 experts of 2880, top-4, 64 query and
    /// 8 KV heads of 64, vocabulary 201,088) with `layers` layers (the release has 24).
    pub fn gpt_oss_20b(layers: usize) -> GptOssSpec {
        GptOssSpec {
            layers,
            experts: 32,
            top_k: 4,
            hidden: 2880,
            inter: 2880,
            heads: 64,
            kv_heads: 8,
            head_dim: 64,
            vocab: 201_088,
            seed: 3,
        }
    }
}

/// Random MXFP4 weights `[experts, rows, cols]` as `_blocks` and `_scales`: random nibbles,
/// E8M0 scales near 1 / (2.25 sqrt(cols)) (the mean |e2m1| is 2.25).
fn mxfp4_experts(
    rng: &mut Rng,
    experts: usize,
    rows: usize,
    cols: usize,
) -> (TensorData, TensorData) {
    let groups = cols / 32;
    let mut blocks = vec![0u8; experts * rows * cols / 2];
    for chunk in blocks.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    let e = (127.0 - (2.25 * (cols as f64).sqrt()).log2()).round() as i32;
    let scales: Vec<u8> = (0..experts * rows * groups)
        .map(|_| (e + (rng.next() % 3) as i32 - 1) as u8)
        .collect();
    (
        TensorData {
            dtype: DType::U8,
            shape: vec![experts, rows, groups, 16],
            bytes: blocks,
        },
        TensorData {
            dtype: DType::U8,
            shape: vec![experts, rows, groups],
            bytes: scales,
        },
    )
}

/// Small random bf16 values of `shape` (biases, sinks).
fn bf16_small(rng: &mut Rng, shape: Vec<usize>, scale: f32) -> TensorData {
    let n: usize = shape.iter().product();
    let mut bytes = Vec::with_capacity(n * 2);
    for _ in 0..n {
        bytes.extend_from_slice(
            &half::bf16::from_f32(scale * rng.unit())
                .to_bits()
                .to_le_bytes(),
        );
    }
    TensorData {
        dtype: DType::BF16,
        shape,
        bytes,
    }
}

/// Writes a synthetic gpt-oss model into `dir` (created): one shard for the embeddings
/// and head, one per layer, the index and `config.json`. Reports `(layers done, layers)`.
pub fn write_gpt_oss(
    dir: &Path,
    spec: &GptOssSpec,
    mut progress: impl FnMut(usize, usize),
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = Rng(spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (h, n, e) = (spec.hidden, spec.layers, spec.experts);
    let (qd, kvd) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
    let mut shards = Shards::new(dir, n + 1, &[]);
    let mut t = BTreeMap::new();
    t.insert(
        "model.embed_tokens.weight".into(),
        bf16_matrix(&mut rng, spec.vocab, h, (h as f32).sqrt()),
    );
    t.insert(
        "lm_head.weight".into(),
        bf16_matrix(&mut rng, spec.vocab, h, 4.0),
    );
    t.insert("model.norm.weight".into(), norm(&mut rng, h));
    shards.write(0, &t)?;
    for l in 0..n {
        let p = format!("model.layers.{l}");
        let mut t = BTreeMap::new();
        for (w, rows, cols) in [
            ("q_proj", qd, h),
            ("k_proj", kvd, h),
            ("v_proj", kvd, h),
            ("o_proj", h, qd),
        ] {
            t.insert(
                format!("{p}.self_attn.{w}.weight"),
                bf16_matrix(&mut rng, rows, cols, 1.0),
            );
            t.insert(
                format!("{p}.self_attn.{w}.bias"),
                bf16_small(&mut rng, vec![rows], 0.1),
            );
        }
        t.insert(
            format!("{p}.self_attn.sinks"),
            bf16_small(&mut rng, vec![spec.heads], 1.0),
        );
        t.insert(format!("{p}.input_layernorm.weight"), norm(&mut rng, h));
        t.insert(
            format!("{p}.post_attention_layernorm.weight"),
            norm(&mut rng, h),
        );
        t.insert(
            format!("{p}.mlp.router.weight"),
            bf16_matrix(&mut rng, e, h, 1.0),
        );
        t.insert(
            format!("{p}.mlp.router.bias"),
            bf16_small(&mut rng, vec![e], 0.1),
        );
        for (w, rows, cols) in [
            ("gate_up_proj", 2 * spec.inter, h),
            ("down_proj", h, spec.inter),
        ] {
            let x = format!("{p}.mlp.experts.{w}");
            let (b, s) = mxfp4_experts(&mut rng, e, rows, cols);
            t.insert(format!("{x}_blocks"), b);
            t.insert(format!("{x}_scales"), s);
            t.insert(
                format!("{x}_bias"),
                bf16_small(&mut rng, vec![e, rows], 0.1),
            );
        }
        shards.write(l + 1, &t)?;
        progress(l + 1, n);
    }
    shards.write_index()?;
    let layer_types: Vec<&str> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let config = serde_json::json!({
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": spec.vocab,
        "hidden_size": h,
        "intermediate_size": spec.inter,
        "num_hidden_layers": n,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "num_local_experts": e,
        "num_experts_per_tok": spec.top_k,
        "experts_per_token": spec.top_k,
        "sliding_window": 128,
        "layer_types": layer_types,
        "swiglu_limit": 7.0,
        "rms_norm_eps": 1e-5,
        "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": false, "original_max_position_embeddings": 4096},
        "max_position_embeddings": 131072,
        "attention_bias": true,
        "tie_word_embeddings": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "quantization_config": {"quant_method": "mxfp4"},
        "coli_synthetic": true,
    });
    write_json(&dir.join("config.json"), &config)
}

/// Writes a synthetic Qwen3-Next model into `dir` (created): the release's layer geometry
/// (`crate::census`'s tensor list: hidden 2048, every 4th layer gated attention, Gated
/// DeltaNet elsewhere, top-10 of BF16 experts of width 512 plus a shared expert) with
/// `layers` layers of `experts` experts, random weights; one shard per layer. Reports
/// `(layers done, layers)`.
pub fn write_qwen3_next(
    dir: &Path,
    layers: usize,
    experts: usize,
    mut progress: impl FnMut(usize, usize),
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (h, vocab) = (2048usize, 151_936usize);
    let mut rng = Rng(0x5EED_0F0E_57D0_0001);
    let mut entries = Vec::new();
    crate::census::hybrid_layers(&mut entries, "model", layers, experts, h, false);
    let fill = |rng: &mut Rng, name: &str, shape: &[usize]| -> TensorData {
        let cols = *shape.last().expect("shape");
        let n: usize = shape.iter().product();
        let value = |rng: &mut Rng| -> f32 {
            if name.ends_with("A_log") {
                (0.02 + 0.15 * (rng.unit() + 1.0)).ln()
            } else if name.ends_with("linear_attn.norm.weight") {
                1.0 + 0.1 * rng.unit()
            } else if name.ends_with("norm.weight") || name.ends_with("dt_bias") {
                // Zero-centred norms scale by 1 + w.
                0.1 * rng.unit()
            } else {
                rng.unit() * 3f32.sqrt() / (cols as f32).sqrt()
            }
        };
        if name.ends_with("A_log") {
            let bytes = (0..n).flat_map(|_| value(rng).to_le_bytes()).collect();
            return TensorData {
                dtype: DType::F32,
                shape: shape.to_vec(),
                bytes,
            };
        }
        let mut bytes = Vec::with_capacity(n * 2);
        for _ in 0..n {
            bytes.extend_from_slice(&half::bf16::from_f32(value(rng)).to_bits().to_le_bytes());
        }
        TensorData {
            dtype: DType::BF16,
            shape: shape.to_vec(),
            bytes,
        }
    };
    let mut shards = Shards::new(dir, layers + 1, &[]);
    let mut t = BTreeMap::new();
    t.insert(
        "model.embed_tokens.weight".into(),
        bf16_matrix(&mut rng, vocab, h, (h as f32).sqrt()),
    );
    t.insert(
        "lm_head.weight".into(),
        bf16_matrix(&mut rng, vocab, h, 4.0),
    );
    t.insert(
        "model.norm.weight".into(),
        fill(&mut rng, "model.norm.weight", &[h]),
    );
    shards.write(0, &t)?;
    for l in 0..layers {
        let p = format!("model.layers.{l}.");
        let t: BTreeMap<String, TensorData> = entries
            .iter()
            .filter(|(n, _, _)| n.starts_with(&p))
            .map(|(n, _, shape)| (n.clone(), fill(&mut rng, n, shape)))
            .collect();
        shards.write(l + 1, &t)?;
        progress(l + 1, layers);
    }
    shards.write_index()?;
    let mut config = crate::census::hybrid_text_config(layers, experts, 10, vocab);
    config["model_type"] = "qwen3_next".into();
    config["architectures"] = serde_json::json!(["Qwen3NextForCausalLM"]);
    config["norm_topk_prob"] = true.into();
    config["bos_token_id"] = 1.into();
    config["eos_token_id"] = 2.into();
    config["coli_synthetic"] = true.into();
    write_json(&dir.join("config.json"), &config)
}

/// DeepSeek-V4-Flash's layer geometry (hidden 4096, 64 heads of 512, hyper-connections of
/// 4 streams, CSA and HCA layers, 3 hash-routed layers first) with `layers` layers and
/// `experts` BF16 experts each, the release's tensor names and config spelling, random
/// weights. Reports `(layers done, layers)`.
pub fn write_deepseek_v4(
    dir: &Path,
    layers: usize,
    experts: usize,
    mut progress: impl FnMut(usize, usize),
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = Rng(0x5EED_0F0E_57D0_0004);
    let mut entries = crate::census::v4_top();
    crate::census::v4_layers(&mut entries, layers, experts);
    let fill = |rng: &mut Rng, name: &str, dtype: &str, shape: &[usize]| -> TensorData {
        let cols = *shape.last().expect("shape");
        let n: usize = shape.iter().product();
        if name.ends_with("tid2eid") {
            // `cols` distinct experts per token.
            let mut bytes = Vec::with_capacity(n * 4);
            for _ in 0..shape[0] {
                let mut row: Vec<i32> = Vec::with_capacity(cols);
                while row.len() < cols {
                    let e = (rng.next() % experts as u64) as i32;
                    if !row.contains(&e) {
                        row.push(e);
                    }
                }
                bytes.extend(row.iter().flat_map(|e| e.to_le_bytes()));
            }
            return TensorData {
                dtype: DType::I32,
                shape: shape.to_vec(),
                bytes,
            };
        }
        let value = |rng: &mut Rng| -> f32 {
            if name.ends_with("norm.weight") || name.ends_with("_scale") {
                1.0 + 0.1 * rng.unit()
            } else if name.ends_with("_base") || name.ends_with(".ape") {
                0.5 * rng.unit()
            } else if name.ends_with("attn_sink") {
                rng.unit()
            } else if name.ends_with("gate.bias") {
                0.1 * rng.unit()
            } else {
                rng.unit() * 3f32.sqrt() / (cols as f32).sqrt()
            }
        };
        let (dtype, bytes) = if dtype == "F32" {
            let b = (0..n).flat_map(|_| value(rng).to_le_bytes()).collect();
            (DType::F32, b)
        } else {
            let mut b = Vec::with_capacity(n * 2);
            for _ in 0..n {
                b.extend_from_slice(&half::bf16::from_f32(value(rng)).to_bits().to_le_bytes());
            }
            (DType::BF16, b)
        };
        TensorData {
            dtype,
            shape: shape.to_vec(),
            bytes,
        }
    };
    let mut shards = Shards::new(dir, layers + 1, &[]);
    let top: BTreeMap<String, TensorData> = entries
        .iter()
        .filter(|(n, _, _)| !n.starts_with("layers."))
        .map(|(n, d, shape)| (n.clone(), fill(&mut rng, n, d, shape)))
        .collect();
    shards.write(0, &top)?;
    drop(top);
    for l in 0..layers {
        let p = format!("layers.{l}.");
        let t: BTreeMap<String, TensorData> = entries
            .iter()
            .filter(|(n, _, _)| n.starts_with(&p))
            .map(|(n, d, shape)| (n.clone(), fill(&mut rng, n, d, shape)))
            .collect();
        shards.write(l + 1, &t)?;
        progress(l + 1, layers);
    }
    shards.write_index()?;
    let mut config = crate::census::v4_flash_config(layers, experts);
    config["coli_synthetic"] = true.into();
    write_json(&dir.join("config.json"), &config)
}

/// A tiny random-weight chat model: a 2-layer synthetic OLMoE (8 experts, top-2) with the
/// demo model's tokenizer and chat template (fetched on first use). For server and chat
/// tests: real tokenization and templates, random tokens.
pub fn write_chat_model(dir: &Path) -> Result<(), String> {
    let demo = coli_models::demo::ensure_demo_model(|_, _| {})?;
    let tok = coli_models::TextTokenizer::load(&demo).map_err(|e| e.to_string())?;
    let spec = OlmoeSpec {
        layers: 2,
        experts: 8,
        top_k: 2,
        hidden: 64,
        inter: 64,
        heads: 4,
        vocab: tok.token_bytes().len(),
        int8_experts: false,
        seed: 5,
    };
    write_olmoe(dir, &spec, |_, _| {}).map_err(|e| e.to_string())?;
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(demo.join(f), dir.join(f)).map_err(|e| format!("{f}: {e}"))?;
    }
    Ok(())
}
