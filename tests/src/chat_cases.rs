//! The chat-template cases recorded from `transformers` by `oracle/chat_templates.py`
//! (`tests/fixtures/chat_templates/expected.json`), and coli's rendering of each.

use std::path::PathBuf;
use std::sync::Arc;

use coli_models::chat_template::{ChatRequest, ChatTemplate, LocalTime, SpecialTokens};
use serde_json::{Map, Value};

/// `tests/fixtures/chat_templates`.
pub fn dir() -> PathBuf {
    crate::fixtures_dir().join("chat_templates")
}

/// One recorded rendering.
#[derive(Clone, Debug)]
pub struct Case {
    /// The template's fixture name (`<name>.jinja`).
    pub template: String,
    /// The conversation's name in the generator.
    pub conversation: String,
    /// OpenAI-shaped messages.
    pub messages: Vec<Value>,
    /// OpenAI tools, or none.
    pub tools: Option<Vec<Value>>,
    /// Whether the assistant's turn is opened.
    pub add_generation_prompt: bool,
    /// Extra template kwargs.
    pub extra: Map<String, Value>,
    /// transformers' output, or its error (`Err("TypeError: …")`).
    pub expected: Result<String, String>,
    /// The error came from the template's own `raise_exception`.
    pub error_from_template: bool,
}

impl Case {
    /// A short name for messages: `template/conversation/agp=…/extra`.
    pub fn id(&self) -> String {
        format!(
            "{}/{}/agp={}/{}",
            self.template,
            self.conversation,
            self.add_generation_prompt,
            Value::Object(self.extra.clone())
        )
    }
}

/// Every recorded case, with the special tokens of each template and the pinned clock.
pub struct Recorded {
    /// The cases, in the generator's order.
    pub cases: Vec<Case>,
    special: Map<String, Value>,
    now: LocalTime,
}

fn parse_now(text: &str) -> LocalTime {
    let n: Vec<u32> = text
        .split(['-', 'T', ':'])
        .map(|p| p.parse().expect("ISO date"))
        .collect();
    LocalTime {
        year: n[0] as i32,
        month: n[1],
        day: n[2],
        hour: n[3],
        minute: n[4],
        second: n[5],
    }
}

impl Recorded {
    /// Reads `expected.json`.
    pub fn load() -> Recorded {
        let path = dir().join("expected.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let json: Value = serde_json::from_str(&text).expect("expected.json is JSON");
        let cases = json["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .map(|c| Case {
                template: c["template"].as_str().unwrap().to_string(),
                conversation: c["conversation_name"].as_str().unwrap().to_string(),
                messages: c["messages"].as_array().unwrap().clone(),
                tools: c["tools"].as_array().cloned(),
                add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(),
                extra: c["extra_kwargs"].as_object().unwrap().clone(),
                expected: match (c.get("expected"), c.get("error")) {
                    (Some(Value::String(s)), None) => Ok(s.clone()),
                    (None, Some(Value::String(e))) => Err(e.clone()),
                    _ => panic!("case needs expected or error: {c}"),
                },
                error_from_template: c["error_from_template"].as_bool().unwrap_or(false),
            })
            .collect();
        Recorded {
            cases,
            special: json["special_tokens"].as_object().unwrap().clone(),
            now: parse_now(json["now"].as_str().unwrap()),
        }
    }

    /// The template's source, byte for byte as the generator read it.
    pub fn source(name: &str) -> String {
        let path = dir().join(format!("{name}.jinja"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The special tokens the model's tokenizer passes.
    pub fn special_tokens(&self, template: &str) -> SpecialTokens {
        serde_json::from_value(self.special[template].clone()).expect("special tokens")
    }

    /// The template compiled with the recording's clock.
    pub fn compile(&self, template: &str) -> coli_models::Result<ChatTemplate> {
        let now = self.now;
        ChatTemplate::with_clock(&Recorded::source(template), Arc::new(move || now))
    }

    /// coli's rendering of `case`.
    pub fn render(&self, template: &ChatTemplate, case: &Case) -> coli_models::Result<String> {
        template.render(
            &self.special_tokens(&case.template),
            &ChatRequest {
                messages: &case.messages,
                tools: case.tools.as_deref(),
                add_generation_prompt: case.add_generation_prompt,
                extra: &case.extra,
            },
        )
    }

    /// transformers' rendering of a conversation without extra kwargs.
    pub fn expected(&self, template: &str, conversation: &str, agp: bool) -> &str {
        self.cases
            .iter()
            .find(|c| {
                c.template == template
                    && c.conversation == conversation
                    && c.add_generation_prompt == agp
                    && c.extra.is_empty()
            })
            .and_then(|c| c.expected.as_deref().ok())
            .unwrap_or_else(|| panic!("no recorded rendering for {template}/{conversation}/{agp}"))
    }
}

/// Where two strings first differ, with some context of each (for failure messages).
pub fn first_difference(want: &str, got: &str) -> String {
    let (a, b) = (want.as_bytes(), got.as_bytes());
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let context = |s: &[u8]| {
        let lo = at.saturating_sub(60);
        let hi = (at + 60).min(s.len());
        format!("{:?}", String::from_utf8_lossy(&s[lo..hi]))
    };
    format!(
        "first difference at byte {at} (lengths {} vs {}):\n  transformers: {}\n  coli:         {}",
        a.len(),
        b.len(),
        context(a),
        context(b)
    )
}
