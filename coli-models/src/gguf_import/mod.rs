//! GGUF (llama.cpp) → a Hugging Face directory coli and `transformers` both load.
//!
//! Weights are dequantized and stored as bf16 safetensors; llama.cpp's Q/K row
//! permutation (interleaved RoPE pairs) is undone; the byte-level BPE tokenizer
//! and the chat template in the metadata become `tokenizer.json` and
//! `tokenizer_config.json`. The directory is built under a temp name and renamed
//! into place, so an interrupted import leaves nothing half-written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use coli_core::dtype::f32_to_bf16;
use coli_core::gguf::{GgufFile, GgufValue};
use coli_core::write::{write_atomic, write_safetensors, TensorData};
use coli_core::DType;
use serde_json::{json, Value};

use crate::error::{ModelError, Result};

fn err(path: &Path, msg: impl Into<String>) -> ModelError {
    ModelError::Import {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Undoes llama.cpp's permutation of Q/K rows: within each head, GGUF row `2j + i`
/// holds Hugging Face row `i * half + j` (i ∈ {0, 1}). `data` is `rows × cols`, row-major;
/// the rows must split into `n_heads` heads of an even size, else the error says why.
pub fn unpermute_rows(
    data: &[f32],
    n_heads: usize,
    rows: usize,
    cols: usize,
) -> std::result::Result<Vec<f32>, String> {
    if rows.checked_mul(cols) != Some(data.len()) {
        return Err(format!(
            "{} values do not form {rows} rows of {cols} columns",
            data.len()
        ));
    }
    if n_heads == 0 || !rows.is_multiple_of(n_heads) {
        return Err(format!(
            "{rows} rows do not split into {n_heads} heads of equal size"
        ));
    }
    let hd = rows / n_heads;
    if !hd.is_multiple_of(2) {
        return Err(format!(
            "head size {hd} ({rows} rows / {n_heads} heads) is odd; llama.cpp's RoPE permutation pairs rows"
        ));
    }
    let half = hd / 2;
    let mut out = vec![0.0; data.len()];
    for h in 0..n_heads {
        for i in 0..2 {
            for j in 0..half {
                let src = h * hd + 2 * j + i;
                let dst = h * hd + i * half + j;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    Ok(out)
}

/// Hugging Face name of a llama.cpp tensor name, for the Llama architecture.
pub fn hf_tensor_name(gguf_name: &str) -> Option<String> {
    let top = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, name) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf = match name {
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

fn meta_u(f: &GgufFile, key: &str) -> Result<usize> {
    f.meta(key)?
        .as_u64()
        .map(|v| v as usize)
        .ok_or_else(|| err(&f.path, format!("metadata \"{key}\" is not an integer")))
}

fn meta_str_list(f: &GgufFile, key: &str) -> Result<Vec<String>> {
    f.meta(key)?
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| {
            err(
                &f.path,
                format!("metadata \"{key}\" is not a list of strings"),
            )
        })
}

/// Builds `tokenizer.json` for a GGUF byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
pub fn tokenizer_json(f: &GgufFile) -> Result<Value> {
    let model = f.meta("tokenizer.ggml.model")?.as_str().unwrap_or("");
    if model != "gpt2" {
        return Err(err(
            &f.path,
            format!(
                "tokenizer model \"{model}\" is not supported (supported: gpt2 byte-level BPE)"
            ),
        ));
    }
    let tokens = meta_str_list(f, "tokenizer.ggml.tokens")?;
    let merges = meta_str_list(f, "tokenizer.ggml.merges")?;
    let types: Vec<i128> = match f.metadata.get("tokenizer.ggml.token_type") {
        Some(GgufValue::Array(a)) => a
            .iter()
            .map(|v| if let GgufValue::Int(i) = v { *i } else { 1 })
            .collect(),
        _ => vec![1; tokens.len()],
    };
    let pre = f
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(GgufValue::as_str)
        .unwrap_or("default");
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    // llama.cpp's pre-tokenizer types, as the equivalent `tokenizers` pipeline.
    let pre_tokenizer = match pre {
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level]}),
        "default" | "gpt-2" | "gpt2" => byte_level,
        other => {
            return Err(err(
                &f.path,
                format!("pre-tokenizer \"{other}\" is not supported (supported: smollm, gpt-2)"),
            ))
        }
    };
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    // Control (3) and user-defined (4) tokens are matched whole, before BPE.
    let added: Vec<Value> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(types.get(*i), Some(3) | Some(4)))
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                             "normalized": false, "special": types[i] == 3})
        })
        .collect();
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    }))
}

/// The head size, after checking the head counts: both at least 1, the KV heads
/// dividing the query heads, `embedding_length` splitting into whole heads, and any
/// explicit `attention.key_length`/`value_length` agreeing (Llama has one head size).
fn head_dim(
    f: &GgufFile,
    k: &dyn Fn(&str) -> String,
    hidden: usize,
    n_heads: usize,
    n_kv: usize,
) -> Result<usize> {
    let bad = |msg: String| Err(err(&f.path, msg));
    if n_heads == 0 || n_kv == 0 {
        return bad(format!(
            "metadata \"{}\" = {n_heads}, \"{}\" = {n_kv}: expected at least 1 head each",
            k("attention.head_count"),
            k("attention.head_count_kv")
        ));
    }
    if !n_heads.is_multiple_of(n_kv) {
        return bad(format!(
            "metadata \"{}\" = {n_heads} is not a multiple of \"{}\" = {n_kv}",
            k("attention.head_count"),
            k("attention.head_count_kv")
        ));
    }
    if hidden == 0 || !hidden.is_multiple_of(n_heads) {
        return bad(format!(
            "metadata \"{}\" = {hidden} does not split into {n_heads} heads of equal, nonzero size",
            k("embedding_length")
        ));
    }
    let hd = hidden / n_heads;
    for key in ["attention.key_length", "attention.value_length"] {
        if let Some(v) = f.metadata.get(&k(key)) {
            if v.as_u64() != Some(hd as u64) {
                return bad(format!(
                    "metadata \"{}\" = {v:?}, expected {hd} (embedding_length / head_count; other head sizes are not supported)",
                    k(key)
                ));
            }
        }
    }
    Ok(hd)
}

/// Converts a Llama-architecture GGUF into a model directory at `out`, which must not exist.
/// `progress(done, total)` is called after each tensor.
pub fn import_gguf(gguf: &Path, out: &Path, mut progress: impl FnMut(usize, usize)) -> Result<()> {
    if out.exists() {
        return Err(err(out, "already exists; refusing to overwrite"));
    }
    let f = GgufFile::open(gguf)?;
    let llama = LlamaShape::read(&f, gguf)?;
    let (config, tok_json, tok_cfg) = llama_files(&f, &llama)?;
    let tensors = convert_tensors(&f, gguf, &llama, &mut progress)?;
    write_model_dir(
        gguf,
        out,
        &tensors,
        [
            ("config.json", &config),
            ("tokenizer.json", &tok_json),
            ("tokenizer_config.json", &tok_cfg),
        ],
    )
}

/// The shapes and settings of a Llama GGUF, checked.
struct LlamaShape {
    arch: String,
    hidden: usize,
    n_heads: usize,
    n_kv: usize,
    n_layers: usize,
    head_dim: usize,
    rms_norm_eps: f64,
    rope_theta: f64,
    context_length: usize,
}

impl LlamaShape {
    fn read(f: &GgufFile, gguf: &Path) -> Result<LlamaShape> {
        let arch = f
            .meta("general.architecture")?
            .as_str()
            .unwrap_or("")
            .to_string();
        if arch != "llama" {
            return Err(err(
                gguf,
                format!("architecture \"{arch}\" is not supported for import (supported: llama)"),
            ));
        }
        let k = |s: &str| format!("{arch}.{s}");
        let hidden = meta_u(f, &k("embedding_length"))?;
        let n_heads = meta_u(f, &k("attention.head_count"))?;
        let n_kv = f
            .metadata
            .get(&k("attention.head_count_kv"))
            .and_then(GgufValue::as_u64)
            .map(|v| v as usize)
            .unwrap_or(n_heads);
        let n_layers = meta_u(f, &k("block_count"))?;
        let head_dim = head_dim(f, &k, hidden, n_heads, n_kv)?;
        // A float key may be absent (the Llama default applies) but not malformed.
        let get_f = |key: &str, default: f64, ok: fn(f64) -> bool, want: &str| -> Result<f64> {
            match f.metadata.get(&k(key)) {
                None => Ok(default),
                Some(v) => v.as_f64().filter(|x| ok(*x)).ok_or_else(|| {
                    err(
                        gguf,
                        format!("metadata \"{}\" = {v:?}, expected {want}", k(key)),
                    )
                }),
            }
        };
        let rms_norm_eps = get_f(
            "attention.layer_norm_rms_epsilon",
            1e-5,
            |x| x.is_finite() && x > 0.0,
            "a finite number > 0",
        )?;
        let rope_theta = get_f(
            "rope.freq_base",
            10000.0,
            |x| x.is_finite() && x > 1.0,
            "a finite number > 1",
        )?;
        let context_length = match f.metadata.get(&k("context_length")) {
            None => 2048,
            Some(_) => meta_u(f, &k("context_length"))?,
        };
        Ok(LlamaShape {
            arch,
            hidden,
            n_heads,
            n_kv,
            n_layers,
            head_dim,
            rms_norm_eps,
            rope_theta,
            context_length,
        })
    }
}

/// `config.json`, `tokenizer.json` and `tokenizer_config.json` of the imported model.
fn llama_files(f: &GgufFile, l: &LlamaShape) -> Result<(Value, Value, Value)> {
    let k = |s: &str| format!("{}.{s}", l.arch);
    let tokens = meta_str_list(f, "tokenizer.ggml.tokens")?;
    let tied = f.tensor("output.weight").is_none();
    let tok_id = |key: &str| f.metadata.get(key).and_then(GgufValue::as_u64);
    let (bos, eos) = (
        tok_id("tokenizer.ggml.bos_token_id"),
        tok_id("tokenizer.ggml.eos_token_id"),
    );
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": l.hidden,
        "intermediate_size": meta_u(f, &k("feed_forward_length"))?,
        "num_hidden_layers": l.n_layers,
        "num_attention_heads": l.n_heads,
        "num_key_value_heads": l.n_kv,
        "head_dim": l.head_dim,
        "vocab_size": tokens.len(),
        "max_position_embeddings": l.context_length,
        // f32 metadata widened to f64 would print as 9.999999747378752e-06; keep the f32 value's shortest form.
        "rms_norm_eps": (l.rms_norm_eps as f32).to_string().parse::<f64>().unwrap_or(l.rms_norm_eps),
        "rope_theta": l.rope_theta,
        "tie_word_embeddings": tied,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "attention_bias": false,
        "mlp_bias": false,
        "torch_dtype": "bfloat16",
    });
    let tok_json = tokenizer_json(f)?;
    let tok_cfg = tokenizer_config(f, &config["max_position_embeddings"])?;
    Ok((config, tok_json, tok_cfg))
}

/// `tokenizer_config.json` from the metadata: the special tokens by name, whether a BOS
/// is added, the chat template (`tokenizer.chat_template`) when the file has one.
pub fn tokenizer_config(f: &GgufFile, max_len: &Value) -> Result<Value> {
    let tokens = meta_str_list(f, "tokenizer.ggml.tokens")?;
    let tok_id = |key: &str| f.metadata.get(key).and_then(GgufValue::as_u64);
    let name_of = |id: Option<u64>| id.and_then(|i| tokens.get(i as usize)).cloned();
    let mut tok_cfg = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": f.metadata.get("tokenizer.ggml.add_bos_token").and_then(GgufValue::as_bool).unwrap_or(false),
        "bos_token": name_of(tok_id("tokenizer.ggml.bos_token_id")),
        "eos_token": name_of(tok_id("tokenizer.ggml.eos_token_id")),
        "pad_token": name_of(tok_id("tokenizer.ggml.padding_token_id")),
        "unk_token": name_of(tok_id("tokenizer.ggml.unknown_token_id")),
        "clean_up_tokenization_spaces": false,
        "model_max_length": max_len,
    });
    if let Some(t) = f
        .metadata
        .get("tokenizer.chat_template")
        .and_then(GgufValue::as_str)
    {
        tok_cfg["chat_template"] = json!(t);
    }
    Ok(tok_cfg)
}

/// Every tensor dequantized, Q/K rows put back in Hugging Face order, as bf16.
fn convert_tensors(
    f: &GgufFile,
    gguf: &Path,
    l: &LlamaShape,
    progress: &mut impl FnMut(usize, usize),
) -> Result<BTreeMap<String, TensorData>> {
    let mut tensors = BTreeMap::new();
    let total = f.tensors.len();
    for (i, t) in f.tensors.iter().enumerate() {
        let name = hf_tensor_name(&t.name).ok_or_else(|| {
            err(
                gguf,
                format!("tensor \"{}\" has no Llama equivalent", t.name),
            )
        })?;
        if tensors.contains_key(&name) {
            let first = f.tensors[..i]
                .iter()
                .find(|o| hf_tensor_name(&o.name).as_deref() == Some(name.as_str()))
                .map_or("another tensor", |o| o.name.as_str());
            return Err(err(
                gguf,
                format!(
                    "tensors \"{first}\" and \"{}\" both map to \"{name}\"",
                    t.name
                ),
            ));
        }
        let shape = t.shape();
        let data = unpermute_attention(f.dequantize(t)?, t, &shape, gguf, l)?;
        let bytes = data
            .iter()
            .flat_map(|&x| f32_to_bf16(x).to_le_bytes())
            .collect();
        tensors.insert(
            name,
            TensorData {
                dtype: DType::BF16,
                shape,
                bytes,
            },
        );
        progress(i + 1, total);
    }
    Ok(tensors)
}

/// `attn_q`/`attn_k` rows back from llama.cpp's interleaved-RoPE order (others as they are).
fn unpermute_attention(
    data: Vec<f32>,
    t: &coli_core::gguf::GgufTensor,
    shape: &[usize],
    gguf: &Path,
    l: &LlamaShape,
) -> Result<Vec<f32>> {
    let heads = if t.name.ends_with("attn_q.weight") {
        Some((l.n_heads, "head_count"))
    } else if t.name.ends_with("attn_k.weight") {
        Some((l.n_kv, "head_count_kv"))
    } else {
        None
    };
    let Some((heads, key)) = heads else {
        return Ok(data);
    };
    let bad = |msg: String| err(gguf, format!("tensor \"{}\": {msg}", t.name));
    let [rows, cols] = shape[..] else {
        return Err(bad(format!(
            "expected 2 dims [rows, cols], found shape {shape:?}"
        )));
    };
    if rows != heads * l.head_dim {
        return Err(bad(format!(
            "expected {} rows ({}.attention.{key} {heads} × head size {}), found {rows}",
            heads * l.head_dim,
            l.arch,
            l.head_dim
        )));
    }
    unpermute_rows(&data, heads, rows, cols).map_err(bad)
}

/// Writes the model directory beside `out` and renames it into place (nothing half-way).
fn write_model_dir(
    gguf: &Path,
    out: &Path,
    tensors: &BTreeMap<String, TensorData>,
    files: [(&str, &Value); 3],
) -> Result<()> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| err(parent, e.to_string()))?;
    let tmp: PathBuf = coli_core::write::temp_path_for(out);
    std::fs::create_dir(&tmp).map_err(|e| err(&tmp, e.to_string()))?;
    let result = (|| -> Result<()> {
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        meta.insert(
            "coli.source".to_string(),
            format!(
                "gguf:{}",
                gguf.file_name()
                    .map(|s| s.to_string_lossy())
                    .unwrap_or_default()
            ),
        );
        write_safetensors(&tmp.join("model.safetensors"), tensors, &meta)?;
        for (name, v) in files {
            let text = serde_json::to_string_pretty(v).expect("json");
            write_atomic(&tmp.join(name), |w| {
                std::io::Write::write_all(w, text.as_bytes())
            })?;
        }
        std::fs::rename(&tmp, out).map_err(|e| err(out, e.to_string()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod tests;
