//! Streams a chat answer from a model directory using only coli-models' public API.
//!
//! `cargo run --release -p coli-models --example chat -- MODEL_DIR "your question"`

use std::io::Write;

use coli_models::experts::Placement;
use coli_models::tokenizer::ChatMessage;
use coli_models::{Engine, GenerateRequest, Prompt};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(dir), question) = (args.next(), args.next()) else {
        eprintln!("usage: chat MODEL_DIR [QUESTION]");
        std::process::exit(2);
    };
    let engine = Engine::open(dir.as_ref(), &Placement::default())?;
    let request = GenerateRequest {
        prompt: Prompt::Chat(vec![ChatMessage::new(
            "user",
            question.unwrap_or_else(|| "What is the capital of France?".into()),
        )]),
        max_tokens: 64,
        ..GenerateRequest::default()
    };
    let mut out = std::io::stdout().lock();
    let answer = engine.generate(&request, |_id, text| {
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    })?;
    println!(
        "\n[{} tokens, finish {}, {:.1} tok/s]",
        answer.generated_ids.len(),
        answer.finish_reason.as_str(),
        answer.decode_tok_s()
    );
    Ok(())
}
