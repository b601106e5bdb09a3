//! Test and fuzzing support: a tiny Llama GGUF maker and the import entry point shared by
//! the cargo-fuzz target and the stable seeded test.
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
