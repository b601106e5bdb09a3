//! Chat templates rendered byte for byte as `transformers`' `apply_chat_template`
//! renders them: the template of `tokenizer_config.json` over OpenAI-shaped messages
//! and tools, with the special tokens the tokenizer passes and any extra kwargs.
//!
//! transformers runs jinja2 with `trim_blocks`, `lstrip_blocks`, the `loopcontrols`
//! extension, its own `tojson` (`json.dumps` without HTML escaping, `ensure_ascii=False`),
//! `raise_exception` and `strftime_now`; jinja2 prints values with Python's `str()`
//! (`None`, `True`, `{'a': 1}`) and templates call Python string and dict methods.
//! minijinja is configured to do the same (`chat_template/python.rs` holds the Python
//! spellings). The test `tests/tests/suite/chat_templates.rs` holds coli to strings recorded
//! from transformers on real templates (`oracle/chat_templates.py`).

mod clock;
mod python;

use std::collections::BTreeMap;
use std::sync::Arc;

use minijinja::value::{from_args, Kwargs, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use serde::{Deserialize, Serialize};

pub use clock::LocalTime;

use crate::error::{ModelError, Result};

/// What to render: the conversation, the tools, and the template's other inputs.
#[derive(Clone, Copy, Debug)]
pub struct ChatRequest<'a> {
    /// OpenAI-shaped message objects (`role`, `content`, `tool_calls`, `tool_call_id`,
    /// `reasoning_content`, …), passed to the template as they are.
    pub messages: &'a [serde_json::Value],
    /// OpenAI tool objects (`{"type": "function", "function": {...}}`); `None` renders
    /// as transformers renders `tools=None` (the variable is defined and none).
    pub tools: Option<&'a [serde_json::Value]>,
    /// Whether to open the assistant's turn at the end.
    pub add_generation_prompt: bool,
    /// Extra template kwargs (e.g. `enable_thinking`, `date_string`,
    /// `reasoning_effort`); they override special tokens of the same name.
    pub extra: &'a serde_json::Map<String, serde_json::Value>,
}

/// The special tokens a tokenizer passes to its template (transformers'
/// `special_tokens_map`: only the tokens that are set).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialTokens {
    /// `bos_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token: Option<String>,
    /// `eos_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token: Option<String>,
    /// `unk_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unk_token: Option<String>,
    /// `sep_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sep_token: Option<String>,
    /// `pad_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token: Option<String>,
    /// `cls_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cls_token: Option<String>,
    /// `mask_token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_token: Option<String>,
    /// `additional_special_tokens` (passed only when not empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_special_tokens: Vec<String>,
}

/// A token entry of `tokenizer_config.json`: a string or an `AddedToken` object.
fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
    .filter(|s| !s.is_empty())
}

impl SpecialTokens {
    /// Reads the special tokens of a `tokenizer_config.json` (or `special_tokens_map.json`).
    pub fn from_config(cfg: &serde_json::Value) -> SpecialTokens {
        let get = |key: &str| token_string(cfg.get(key));
        SpecialTokens {
            bos_token: get("bos_token"),
            eos_token: get("eos_token"),
            unk_token: get("unk_token"),
            sep_token: get("sep_token"),
            pad_token: get("pad_token"),
            cls_token: get("cls_token"),
            mask_token: get("mask_token"),
            additional_special_tokens: cfg
                .get("additional_special_tokens")
                .and_then(serde_json::Value::as_array)
                .map(|list| list.iter().filter_map(|t| token_string(Some(t))).collect())
                .unwrap_or_default(),
        }
    }

    /// Fills the tokens this set lacks from `other`.
    pub fn or(self, other: SpecialTokens) -> SpecialTokens {
        SpecialTokens {
            bos_token: self.bos_token.or(other.bos_token),
            eos_token: self.eos_token.or(other.eos_token),
            unk_token: self.unk_token.or(other.unk_token),
            sep_token: self.sep_token.or(other.sep_token),
            pad_token: self.pad_token.or(other.pad_token),
            cls_token: self.cls_token.or(other.cls_token),
            mask_token: self.mask_token.or(other.mask_token),
            additional_special_tokens: if self.additional_special_tokens.is_empty() {
                other.additional_special_tokens
            } else {
                self.additional_special_tokens
            },
        }
    }
}

/// One chat message, typed; [`ChatMessage::to_value`] gives the OpenAI-shaped object a
/// template sees (absent fields are left out, as a client would leave them out).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The assistant's tool calls (`{"id", "type": "function", "function": {"name", "arguments"}}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// For a `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The author's or the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The assistant's reasoning, for templates that render it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message with a role and text only.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }

    /// The OpenAI-shaped object for [`ChatRequest::messages`].
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a ChatMessage serializes")
    }
}

/// The names transformers passes itself; an extra kwarg may not reuse them.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

fn template_error(e: &Error) -> ModelError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        msg.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    ModelError::Template(msg)
}

impl ChatTemplate {
    /// Compiles `source` with `strftime_now` reading the machine's local clock.
    pub fn new(source: &str) -> Result<ChatTemplate> {
        ChatTemplate::with_clock(source, Arc::new(LocalTime::now))
    }

    /// Compiles `source` with `strftime_now` reading `clock` (tests pin the date).
    pub fn with_clock(
        source: &str,
        clock: Arc<dyn Fn() -> LocalTime + Send + Sync>,
    ) -> Result<ChatTemplate> {
        let mut env = python_like_environment();
        env.add_function("strftime_now", move |format: &str| clock().strftime(format));
        // jinja2 reads every newline sequence as "\n" before lexing.
        let source = source.replace("\r\n", "\n").replace('\r', "\n");
        env.add_template_owned("chat_template", source)
            .map_err(|e| template_error(&e))?;
        Ok(ChatTemplate { env })
    }

    /// Renders the template over `req`, with `special` as the tokenizer's special tokens.
    pub fn render(&self, special: &SpecialTokens, req: &ChatRequest) -> Result<String> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        let tokens = serde_json::to_value(special).expect("special tokens serialize");
        for (key, value) in tokens.as_object().into_iter().flatten() {
            ctx.insert(key.clone(), Value::from_serialize(value));
        }
        for (key, value) in req.extra {
            if RESERVED.contains(&key.as_str()) {
                return Err(ModelError::Template(format!(
                    "extra template kwarg \"{key}\" collides with the argument of that name"
                )));
            }
            ctx.insert(key.clone(), Value::from_serialize(value));
        }
        ctx.insert("messages".into(), Value::from_serialize(req.messages));
        ctx.insert(
            "tools".into(),
            req.tools.map_or(Value::from(()), Value::from_serialize),
        );
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(req.add_generation_prompt),
        );
        let template = self
            .env
            .get_template("chat_template")
            .map_err(|e| template_error(&e))?;
        template.render(ctx).map_err(|e| template_error(&e))
    }
}

/// Renders `template` over `req` (compiling it each time; [`ChatTemplate`] keeps it).
pub fn render_template(
    template: &str,
    special: &SpecialTokens,
    req: &ChatRequest,
) -> Result<String> {
    ChatTemplate::new(template)?.render(special, req)
}

fn python_like_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(python_methods);
    env.set_formatter(|out, _state, value| {
        let text = python::str(value)?;
        out.write_str(&text)
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "formatting failed"))
    });
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_filter("tojson", tojson);
    env.add_filter("string", |v: &Value| python::str(v).map(Value::from));
    // jinja2's trim is `str(value).strip(chars)`: a list is printed, then stripped.
    env.add_filter("trim", |v: &Value, chars: Option<&str>| {
        python::str(v).map(|s| python::strip(&s, chars, true, true).to_string())
    });
    env.add_filter("join", join);
    env.add_filter("items", |v: &Value| match v.kind() {
        ValueKind::Undefined => Ok(Value::from(Vec::<Value>::new())),
        _ => python::items(v).map(Value::from),
    });
    // jinja2: strings, sequences, mappings and undefined iterate; none and numbers do not.
    env.add_test("iterable", |v: &Value| {
        !matches!(
            v.kind(),
            ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Plain
        )
    });
    env
}

/// Python's `str` methods where minijinja-contrib's differ (whitespace, `split`), then
/// minijinja-contrib's pycompat for the rest (`startswith`, `replace`, `dict.items`, …).
fn python_methods(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let strip = |left, right| -> Result<Value, Error> {
            let (chars,): (Option<&str>,) = from_args(args)?;
            Ok(Value::from(python::strip(s, chars, left, right)))
        };
        match method {
            "strip" => return strip(true, true),
            "lstrip" => return strip(true, false),
            "rstrip" => return strip(false, true),
            "title" => {
                let () = from_args(args)?;
                return Ok(Value::from(python::title(s)));
            }
            "split" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
                return python::split(s, sep, maxsplit.unwrap_or(-1)).map(Value::from);
            }
            _ => {}
        }
    }
    if value.kind() == ValueKind::Map && method == "items" {
        let () = from_args(args)?;
        return python::items(value).map(Value::from);
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, positional or by keyword.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut given: [Value; 4] = Default::default();
    for (slot, arg) in given.iter_mut().zip(args.iter()) {
        *slot = arg.clone();
    }
    for (slot, name) in given.iter_mut().zip(NAMES) {
        if kwargs.has(name) {
            *slot = kwargs.get::<Value>(name)?;
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let indent = match indent.kind() {
        ValueKind::Undefined | ValueKind::None => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_string()),
        _ => Some(" ".repeat(indent.as_i64().unwrap_or(0).max(0) as usize)),
    };
    let separators = match separators.kind() {
        ValueKind::Undefined | ValueKind::None => {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        }
        _ => {
            let parts: Vec<String> = separators
                .try_iter()?
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .filter(|p: &Vec<String>| p.len() == 2)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    )
                })?;
            (parts[0].clone(), parts[1].clone())
        }
    };
    let opts = python::JsonOptions {
        ensure_ascii: ensure_ascii.is_true(),
        indent,
        separators,
        sort_keys: sort_keys.is_true(),
    };
    python::json_dumps(value, &opts).map(Value::from)
}

/// jinja2's `join`: each item as Python's `str()`.
fn join(value: &Value, sep: Option<&str>) -> Result<String, Error> {
    let items: Result<Vec<String>, Error> = value.try_iter()?.map(|v| python::str(&v)).collect();
    Ok(items?.join(sep.unwrap_or("")))
}
