//! Chat templates rendered by coli equal `transformers`' `apply_chat_template`, byte for
//! byte, on real templates (DeepSeek-V3.1/V3.2, Kimi-K2 and K2-Thinking, GLM-4.5/4.6, Qwen3, gpt-oss,
//! MiniMax-M2, Llama 3.2/3.3, SmolLM2) over conversations with system prompts, several
//! turns, tools, tool calls and results, and reasoning. Where transformers refuses a
//! conversation, coli refuses it too (with the template's own message when the template
//! raised it). Strings recorded by `oracle/chat_templates.py` (transformers 4.57.1).

use coli_tests::chat_cases::{first_difference, Recorded};

/// Cases where coli knowingly differs from transformers, with the reason. Each must
/// still differ (a fixed divergence has to leave this list).
const KNOWN_DIVERGENCES: &[(&str, &str, &str)] = &[(
    "kimi-k2",
    "tool_call_null_content",
    "`{% for c in message['content'] %}` over a null content: Python raises (None is not \
     iterable), minijinja iterates nothing and coli renders an empty content; minijinja has \
     no hook to make iterating none an error",
)];

#[test]
fn chat_templates_render_like_transformers() {
    let rec = Recorded::load();
    assert!(rec.cases.len() > 400, "too few cases: {}", rec.cases.len());
    let mut failures = Vec::new();
    let mut compiled = std::collections::HashMap::new();
    let (mut matched, mut refused) = (0, 0);
    for case in &rec.cases {
        let template = compiled
            .entry(case.template.clone())
            .or_insert_with(|| rec.compile(&case.template).expect("template compiles"));
        let got = rec.render(template, case);
        let known = KNOWN_DIVERGENCES
            .iter()
            .any(|(t, c, _)| *t == case.template && *c == case.conversation);
        let outcome = match (&case.expected, &got) {
            (Ok(want), Ok(got)) if want == got => Ok(()),
            (Ok(want), Ok(got)) => Err(first_difference(want, got)),
            (Ok(_), Err(e)) => Err(format!("transformers renders it, coli refuses: {e}")),
            (Err(want), Ok(_)) => Err(format!("transformers refuses ({want}), coli renders it")),
            (Err(want), Err(e)) => {
                // raise_exception's message comes from the template: coli must carry it.
                let message = want.trim_start_matches("TemplateError: ");
                if case.error_from_template && !e.to_string().contains(message) {
                    Err(format!("coli refuses with another message: {e}"))
                } else {
                    Ok(())
                }
            }
        };
        match (outcome, known) {
            (Ok(()), false) => {
                if case.expected.is_ok() {
                    matched += 1;
                } else {
                    refused += 1;
                }
            }
            (Ok(()), true) => failures.push(format!(
                "{}: listed in KNOWN_DIVERGENCES but now matches; remove it",
                case.id()
            )),
            (Err(_), true) => {}
            (Err(why), false) => failures.push(format!("{}: {why}", case.id())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from transformers:\n{}",
        failures.len(),
        rec.cases.len(),
        failures.join("\n")
    );
    eprintln!("{matched} renderings identical, {refused} refusals shared");
}

/// Every template of the suite is exercised with tools, tool calls and tool results,
/// and every one renders at least one tool call as transformers does.
#[test]
fn every_template_renders_tool_calls() {
    let rec = Recorded::load();
    let mut templates: Vec<&str> = rec.cases.iter().map(|c| c.template.as_str()).collect();
    templates.dedup();
    assert_eq!(templates.len(), 13, "{templates:?}");
    for t in templates {
        let with_calls = rec.cases.iter().filter(|c| {
            c.template == t
                && c.expected.is_ok()
                && c.messages.iter().any(|m| m.get("tool_calls").is_some())
                && c.messages.iter().any(|m| m["role"] == "tool")
        });
        assert!(
            with_calls.count() >= 2,
            "{t}: no successful tool-call rendering recorded"
        );
    }
}

/// The demo model's own template (imported from its GGUF) is the fixture the cases were
/// recorded on, and its tokenizer renders them as transformers does.
#[test]
fn demo_tokenizer_renders_like_transformers() {
    let dir = coli_models::demo::ensure_demo_model(|_, _| {}).expect("demo model");
    let tok = coli_models::TextTokenizer::load(&dir).unwrap();
    assert_eq!(
        tok.chat_template(),
        Some(Recorded::source("smollm2").as_str())
    );
    let rec = Recorded::load();
    for case in rec.cases.iter().filter(|c| c.template == "smollm2") {
        let got = tok.render_chat(&coli_models::chat_template::ChatRequest {
            messages: &case.messages,
            tools: case.tools.as_deref(),
            add_generation_prompt: case.add_generation_prompt,
            extra: &case.extra,
        });
        match (&case.expected, got) {
            (Ok(want), Ok(got)) => assert_eq!(&got, want, "{}", case.id()),
            (Err(_), Err(_)) => {}
            (want, got) => panic!("{}: transformers {want:?}, coli {got:?}", case.id()),
        }
    }
    use coli_models::tokenizer::ChatMessage;
    let typed = [
        ChatMessage::new("system", "You are a concise assistant."),
        ChatMessage::new("user", "What is 2+2?"),
        ChatMessage::new("assistant", "4."),
        ChatMessage::new("user", "And 3+3?"),
    ];
    assert_eq!(
        tok.apply_chat_template(&typed, true).unwrap(),
        rec.expected("smollm2", "system_multi_turn", true)
    );
}
