//! Tool calls round-trip through the real chat templates: an assistant message with
//! tool calls is rendered by the model's own template (coli's rendering equals
//! transformers', `tests/tests/suite/chat_templates.rs`), the assistant's part of the prompt
//! is cut out — what the model was trained to write — and `tool_calls::parse` must give
//! back the same names and arguments. The template is the independent source of truth.

use coli_models::chat_template::ChatRequest;
use coli_models::tool_calls::{parse, parse_with_tools, ToolCallFormat};
use coli_tests::chat_cases::Recorded;
use serde_json::{json, Value};

/// A family: its template fixture, its format, how many calls one message may hold,
/// whether its template needs the arguments as a JSON string, and whether the
/// template renders the message's content and reasoning where the parser reads them.
struct Family {
    template: &'static str,
    format: ToolCallFormat,
    max_calls: usize,
    string_arguments: bool,
    content_back: bool,
    reasoning_back: bool,
}

const fn family(template: &'static str, format: ToolCallFormat, max_calls: usize) -> Family {
    Family {
        template,
        format,
        max_calls,
        string_arguments: false,
        content_back: true,
        reasoning_back: true,
    }
}

const FAMILIES: [Family; 10] = [
    family("qwen3", ToolCallFormat::Hermes, 3),
    Family {
        string_arguments: true,
        // V3.1 drops the reasoning of past turns; non-thinking output has none.
        reasoning_back: false,
        ..family("deepseek-v3.1", ToolCallFormat::DeepSeekV31, 3)
    },
    family("deepseek-v3.2", ToolCallFormat::DeepSeekV32, 3),
    family("kimi-k2-thinking", ToolCallFormat::KimiK2, 3),
    family("glm-4.5", ToolCallFormat::Glm45, 3),
    family("glm-4.6", ToolCallFormat::Glm45, 3),
    Family {
        // The template writes a tool-calling message's content on the analysis channel.
        content_back: false,
        reasoning_back: false,
        ..family("gpt-oss", ToolCallFormat::GptOss, 1)
    },
    family("minimax-m2", ToolCallFormat::MiniMaxM2, 3),
    Family {
        content_back: false,
        reasoning_back: false,
        ..family("llama-3.2", ToolCallFormat::Llama3Json, 1)
    },
    Family {
        content_back: false,
        reasoning_back: false,
        ..family("llama-3.3", ToolCallFormat::Llama3Json, 1)
    },
];

fn tools() -> Vec<Value> {
    let f = |name: &str, properties: Value| {
        json!({"type": "function", "function": {"name": name, "description": "A tool.",
            "parameters": {"type": "object", "properties": properties}}})
    };
    vec![
        f(
            "get_weather",
            json!({"city": {"type": "string"}, "unit": {"type": "string"}}),
        ),
        f(
            "search_docs",
            json!({"query": {"type": "string"}, "limit": {"type": "integer"},
                "tags": {"type": "array"}, "exact": {"type": "boolean"},
                "threshold": {"type": "number"}, "extra": {"type": "object"},
                "nested": {"type": "object"}, "code": {"type": "string"}}),
        ),
        f("ping", json!({})),
    ]
}

/// (name, arguments) sets: plain strings; quotes, newlines, backslashes, markup and
/// non-ASCII; numbers, booleans, null, arrays, nested objects; no arguments at all.
fn calls() -> Vec<(&'static str, Value)> {
    vec![
        ("get_weather", json!({"city": "Paris", "unit": "celsius"})),
        (
            "search_docs",
            json!({"query": "naïve \"quoted\" <tag> & co\nsecond line \\ done", "limit": 3,
                "tags": ["a", "b"], "exact": false, "threshold": 0.5, "extra": null,
                "nested": {"k": [1, 2.25, true], "s": "x"}}),
        ),
        ("ping", json!({})),
    ]
}

/// The assistant's turn as the template renders it: the rendering with the message,
/// past the prompt that asks for it, without the end-of-turn marker.
fn assistant_part(full: &str, prompt: &str) -> String {
    let common = full
        .char_indices()
        .zip(prompt.chars())
        .find(|((_, a), b)| a != b)
        .map_or(full.len().min(prompt.len()), |((i, _), _)| i);
    let mut part = &full[common..];
    for end in [
        "\n",
        "<|im_end|>",
        "<｜end▁of▁sentence｜>",
        "<|eot_id|>",
        "[e~[",
    ] {
        part = part.strip_suffix(end).unwrap_or(part);
    }
    part.to_string()
}

struct Rendered {
    text: String,
    want: Vec<(&'static str, Value)>,
}

fn render_turn(
    rec: &Recorded,
    fam: &Family,
    want: &[(&'static str, Value)],
    content: &str,
) -> Rendered {
    let template = rec.compile(fam.template).unwrap();
    let special = rec.special_tokens(fam.template);
    let tool_calls: Vec<Value> = want
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            let arguments = if fam.string_arguments {
                Value::String(args.to_string())
            } else {
                args.clone()
            };
            // Kimi's ids carry the name: `functions.NAME:INDEX`.
            json!({"id": format!("functions.{name}:{i}"), "type": "function",
                "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    let user = json!({"role": "user", "content": "Do it."});
    let assistant = json!({"role": "assistant", "content": content,
        "reasoning_content": "I will call the tools.", "tool_calls": tool_calls});
    let tools = tools();
    let extra = serde_json::Map::new();
    let render = |messages: &[Value], add_generation_prompt| {
        let req = ChatRequest {
            messages,
            tools: Some(&tools),
            add_generation_prompt,
            extra: &extra,
        };
        template.render(&special, &req).unwrap()
    };
    let full = render(&[user.clone(), assistant], false);
    let prompt = render(&[user], true);
    Rendered {
        text: assistant_part(&full, &prompt),
        want: want.to_vec(),
    }
}

fn check(fam: &Family, r: &Rendered, content: &str, schema: bool) -> Result<(), String> {
    let tools = tools();
    let out = if schema {
        parse_with_tools(fam.format, &r.text, Some(&tools))
    } else {
        parse(fam.format, &r.text)
    };
    let got: Vec<(&str, &str)> = out
        .tool_calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect();
    let want: Vec<(&str, String)> = r.want.iter().map(|(n, a)| (*n, a.to_string())).collect();
    let want: Vec<(&str, &str)> = want.iter().map(|(n, a)| (*n, a.as_str())).collect();
    if got != want {
        return Err(format!("calls {got:?}, want {want:?}"));
    }
    if fam.content_back && out.content != content {
        return Err(format!("content {:?}, want {content:?}", out.content));
    }
    if fam.reasoning_back && out.reasoning.as_deref() != Some("I will call the tools.") {
        return Err(format!("reasoning {:?}", out.reasoning));
    }
    Ok(())
}

#[test]
fn tool_calls_round_trip_through_the_real_templates() {
    let rec = Recorded::load();
    let all = calls();
    let mut failures = Vec::new();
    for fam in &FAMILIES {
        let source = Recorded::source(fam.template);
        assert_eq!(
            ToolCallFormat::detect(Some(&source)),
            fam.format,
            "{}",
            fam.template
        );
        let mut sets: Vec<Vec<(&'static str, Value)>> =
            all.iter().map(|c| vec![c.clone()]).collect();
        if fam.max_calls > 1 {
            sets.push(all.clone());
        }
        for set in &sets {
            for content in ["", "Let me check."] {
                let r = render_turn(&rec, fam, set, content);
                for schema in [false, true] {
                    if let Err(e) = check(fam, &r, content, schema) {
                        failures.push(format!(
                            "{} ({content:?}, schema {schema}): {e}\n  text: {:?}",
                            fam.template, r.text
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A string argument that reads as JSON (`"42"`, `"true"`) survives the formats that
/// write strings bare only when the tool's schema says it is a string.
#[test]
fn bare_string_arguments_need_the_schema() {
    let rec = Recorded::load();
    let want = vec![("search_docs", json!({"code": "42", "query": "true"}))];
    for fam in FAMILIES
        .iter()
        .filter(|f| matches!(f.format, ToolCallFormat::Glm45 | ToolCallFormat::MiniMaxM2))
    {
        let r = render_turn(&rec, fam, &want, "");
        check(fam, &r, "", true).unwrap_or_else(|e| panic!("{}: {e}", fam.template));
        assert!(check(fam, &r, "", false).is_err(), "{}", fam.template);
    }
}

/// The templates that render no tool calls still name a format: Kimi-K2's first
/// template (the model writes its section format) and SmolLM2's (coli's generic).
#[test]
fn formats_of_the_other_templates() {
    let detect = |name| ToolCallFormat::detect(Some(&Recorded::source(name)));
    assert_eq!(detect("kimi-k2"), ToolCallFormat::KimiK2);
    assert_eq!(detect("smollm2"), ToolCallFormat::Generic);
}
