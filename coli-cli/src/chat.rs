//! `coli chat`: an interactive terminal chat. The conversation lives in one slot, so each
//! turn only computes what is new (the previous turns' KV is reused); answers stream as
//! they are generated; Ctrl-C stops the current answer without leaving.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use coli_models::tokenizer::ChatMessage;
use coli_models::{Batch, Engine, GenerateRequest, Prompt, SamplingParams, SlotOptions};
use rustyline::error::ReadlineError;

use crate::args::ChatArgs;
use crate::Outcome;

const HELP: &str = "commands: /reset (forget the conversation), /system TEXT (set the system prompt and reset), /stats (last answer's figures), /save FILE (the conversation as JSON), /quit. End a line with \\ to continue it on the next.";

/// Figures of one answer.
#[derive(Default)]
struct AnswerStats {
    tokens: usize,
    ttft_s: f64,
    decode_tok_s: f64,
    cached: usize,
    prompt: usize,
    hit_rate: Option<f64>,
    disk_mb_s: Option<f64>,
}

impl AnswerStats {
    fn line(&self) -> String {
        let mut s = format!(
            "[{} tokens, {:.1} tok/s, TTFT {:.0} ms, prompt {} ({} reused)",
            self.tokens,
            self.decode_tok_s,
            self.ttft_s * 1e3,
            self.prompt,
            self.cached
        );
        if let (Some(h), Some(d)) = (self.hit_rate, self.disk_mb_s) {
            s += &format!(", expert hit rate {:.1}%, disk {d:.1} MB/s", h * 100.0);
        }
        s + "]"
    }
}

pub(crate) fn chat(a: ChatArgs) -> Outcome {
    let engine = crate::run::open(&a.m, coli_models::MtpDrafting::Auto)?;
    let tok = engine.tokenizer().map_err(|e| e.to_string())?;
    if !tok.has_chat_template() {
        return Err(format!(
            "{}: tokenizer_config.json has no chat_template; use `coli run` for plain text",
            engine.dir().display()
        ));
    }
    let max_ctx = engine.model().info.max_position_embeddings.max(2);
    let ctx = a.ctx.unwrap_or(max_ctx.min(8192));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // While an answer streams the terminal is in cooked mode and Ctrl-C is a signal;
        // at the prompt the line editor reads it as a key.
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .map_err(|e| format!("cannot catch Ctrl-C: {e}"))?;
    }
    let mut editor = rustyline::DefaultEditor::new().map_err(|e| e.to_string())?;
    let mut system = a.system.clone();
    let mut history: Vec<ChatMessage> = Vec::new();
    let mut slot = engine.slot(ctx);
    let mut last = AnswerStats::default();
    eprintln!(
        "coli chat: {} ({ctx} positions). {HELP}",
        engine.dir().display()
    );
    loop {
        let line = match read_message(&mut editor) {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => return Err(e),
        };
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(cmd) = trimmed.strip_prefix('/') {
            let (name, arg) = cmd.split_once(' ').unwrap_or((cmd, ""));
            match name {
                "quit" | "exit" => break,
                "reset" => {
                    history.clear();
                    eprintln!("(conversation cleared)");
                }
                "system" => {
                    system = (!arg.trim().is_empty()).then(|| arg.trim().to_string());
                    history.clear();
                    eprintln!("(system prompt set; conversation cleared)");
                }
                "stats" => eprintln!("{}", last.line()),
                "save" if !arg.trim().is_empty() => {
                    match save(arg.trim(), system.as_deref(), &history) {
                        Ok(()) => eprintln!("(saved to {})", arg.trim()),
                        Err(e) => eprintln!("coli: {e}"),
                    }
                }
                _ => eprintln!("{HELP}"),
            }
            continue;
        }
        history.push(ChatMessage::new("user", line.clone()));
        let mut messages = Vec::new();
        if let Some(s) = &system {
            messages.push(ChatMessage::new("system", s.clone()));
        }
        messages.extend(history.iter().cloned());
        stop.store(false, Ordering::SeqCst);
        match answer(&engine, &mut slot, &a, messages, &stop) {
            Ok((text, stats)) => {
                eprintln!("\n{}", stats.line());
                history.push(ChatMessage::new("assistant", text));
                last = stats;
            }
            Err(e) => {
                eprintln!("\ncoli: {e}");
                history.pop();
            }
        }
    }
    if !a.m.no_usage {
        let _ = engine.save_usage();
    }
    Ok(0)
}

/// One message: lines ending with `\` continue. `None` at end of input.
fn read_message(editor: &mut rustyline::DefaultEditor) -> Result<Option<String>, String> {
    let mut text = String::new();
    loop {
        let prompt = if text.is_empty() { "> " } else { ". " };
        match editor.readline(prompt) {
            Ok(line) => {
                if let Some(cont) = line.strip_suffix('\\') {
                    text += cont;
                    text.push('\n');
                    continue;
                }
                text += &line;
                let _ = editor.add_history_entry(text.as_str());
                return Ok(Some(text));
            }
            // Ctrl-C at the prompt clears the line; Ctrl-D leaves.
            Err(ReadlineError::Interrupted) => text.clear(),
            Err(ReadlineError::Eof) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn answer<'e>(
    engine: &'e Engine,
    slot: &mut coli_models::Slot<'e>,
    a: &ChatArgs,
    messages: Vec<ChatMessage>,
    stop: &AtomicBool,
) -> Result<(String, AnswerStats), String> {
    let req = GenerateRequest {
        prompt: Prompt::Chat(messages),
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: 0,
            top_p: a.top_p,
            seed: a.seed,
        },
        max_tokens: a.max_tokens,
        ..GenerateRequest::default()
    };
    let store = || engine.model().store.as_ref().map(|s| s.stats());
    let t0 = Instant::now();
    let mut d = engine
        .begin(slot, &req, &SlotOptions::default())
        .map_err(|e| e.to_string())?;
    let before = store();
    let t_decode = Instant::now();
    let mut batch = Batch::new();
    let mut out = std::io::stdout().lock();
    loop {
        if let Some(e) = d.take_event() {
            let _ = out.write_all(e.text.as_bytes());
            let _ = out.flush();
        }
        if stop.load(Ordering::SeqCst) {
            d.cancel();
            let _ = write!(out, " [stopped]");
        }
        if d.finish().is_some() {
            break;
        }
        engine
            .step(&mut batch, &mut [(&mut *slot, &mut d)])
            .map_err(|e| e.to_string())?;
    }
    let decode_s = t_decode.elapsed().as_secs_f64();
    let text = d.decode(d.generated()).unwrap_or_default();
    let mut stats = AnswerStats {
        tokens: d.generated().len(),
        ttft_s: d.stats().ttft_s,
        decode_tok_s: d.generated().len().saturating_sub(1) as f64 / decode_s.max(1e-9),
        cached: d.cached_tokens(),
        prompt: d.prompt_tokens(),
        ..AnswerStats::default()
    };
    if let (Some(b), Some(now)) = (before, store()) {
        let (hits, misses) = (now.hits - b.hits, now.misses - b.misses);
        stats.hit_rate = Some(if hits + misses == 0 {
            1.0
        } else {
            hits as f64 / (hits + misses) as f64
        });
        stats.disk_mb_s = Some((now.bytes_read - b.bytes_read) as f64 / 1e6 / decode_s.max(1e-9));
    }
    let _ = t0;
    Ok((text, stats))
}

fn save(path: &str, system: Option<&str>, history: &[ChatMessage]) -> Result<(), String> {
    let mut messages: Vec<&ChatMessage> = Vec::new();
    let sys = system.map(|s| ChatMessage::new("system", s));
    messages.extend(sys.as_ref());
    messages.extend(history);
    let text = serde_json::to_string_pretty(&serde_json::json!({ "messages": messages }))
        .map_err(|e| e.to_string())?;
    // Written beside the target and renamed: never a half-written file.
    let tmp = format!("{path}.tmp");
    std::fs::write(&tmp, text + "\n").map_err(|e| format!("{tmp}: {e}"))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{path}: {e}"))
}
