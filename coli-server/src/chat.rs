//! Chat requests: messages through the model's chat template, `response_format` to a
//! constraint, tools and `tool_choice` to the prompt and (when a call is required) to a
//! grammar, and the model's answer back into an OpenAI message with `tool_calls`.
//!
//! Tools, two ways:
//! * **Native** (`tool_choice` `auto`, on a model whose template knows tools: Qwen3,
//!   DeepSeek-V3.1/V3.2, Kimi-K2, GLM-4.5/4.6, gpt-oss, MiniMax-M2, Llama 3.x): the tools
//!   and the conversation's calls and results go through the model's own template, and
//!   its answer is read back in its own call syntax (`coli_models::tool_calls`).
//! * **Generic** (a template that knows no tools, or `tool_choice` `required` / a named
//!   function on any model): the tools are described in a system message and the model
//!   answers with a JSON object, `{"tool_call": {"name": …, "arguments": {…}}}` or
//!   `{"response": "…"}`. When a call is required the answer is constrained by a JSON
//!   Schema built from the functions' `parameters`, so the arguments always parse and
//!   validate.

use serde_json::{json, Map, Value};

use coli_models::chat_template::ChatRequest;
use coli_models::tool_calls::{parse_with_tools, ToolCallFormat};
use coli_models::{Engine, OutputConstraint};

use crate::http::tokenizer;
use crate::openai::{self, ApiError};

/// What a chat request turns into.
#[derive(Clone, Debug)]
pub struct ChatPlan {
    /// The rendered prompt.
    pub prompt: String,
    /// What the output must match.
    pub constraint: OutputConstraint,
    /// How the answer's tool calls are read (None: no tools).
    pub tool_format: Option<ToolCallFormat>,
    /// The request's tools (for argument types when reading calls back).
    pub tools: Vec<Value>,
}

impl ChatPlan {
    /// Whether the answer is parsed for tool calls (then it is streamed at the end).
    pub fn parses_tools(&self) -> bool {
        self.tool_format.is_some()
    }

    /// Whether reading the answer needs its special tokens (native formats mark calls
    /// with them).
    pub fn needs_special_tokens(&self) -> bool {
        self.tool_format
            .is_some_and(|f| f != ToolCallFormat::Generic)
    }
}

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// Checks the messages' shape; 400 naming the message at fault.
fn check_messages(messages: &[Value]) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "messages is empty"));
    }
    for (i, m) in messages.iter().enumerate() {
        let param = format!("messages[{i}]");
        let bad = |msg: String| ApiError::invalid(Some(&param), msg);
        let Some(o) = m.as_object() else {
            return Err(bad(format!("{param} is not an object")));
        };
        match o.get("role").and_then(Value::as_str) {
            Some(r) if ROLES.contains(&r) => {}
            Some(r) => {
                return Err(bad(format!(
                    "{param}: unknown role {r:?} (expected one of {ROLES:?})"
                )))
            }
            None => return Err(bad(format!("{param} has no role"))),
        }
        match o.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                if let Some(p) = parts
                    .iter()
                    .find(|p| p.get("type").and_then(Value::as_str) != Some("text"))
                {
                    return Err(bad(format!(
                        "{param}: only text content parts are supported, got {p}"
                    )));
                }
            }
            Some(other) => {
                return Err(bad(format!(
                    "{param}: content must be a string, a list of text parts or null, got {other}"
                )))
            }
        }
    }
    Ok(())
}

/// A message's text content (text parts joined).
fn content_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Renders `messages` (and `tools`) through the model's chat template. Messages go to the
/// template as the client sent them (what `transformers`' `apply_chat_template` renders
/// byte for byte); with tools, they are described in a system message and tool calls and
/// results are written in the generic format.
pub fn render(
    engine: &Engine,
    messages: &[Value],
    tools: Option<&[Value]>,
    add_generation_prompt: bool,
    extra: Map<String, Value>,
) -> Result<String, ApiError> {
    let format = native_format(engine);
    render_as(
        engine,
        messages,
        tools,
        add_generation_prompt,
        extra,
        format,
    )
}

/// The model's own tool-call format, when its template renders tools.
fn native_format(engine: &Engine) -> Option<ToolCallFormat> {
    let tok = engine.tokenizer().ok()?;
    let template = tok.chat_template_for(true)?;
    let f = ToolCallFormat::detect(Some(template));
    (f != ToolCallFormat::Generic && template.contains("tools")).then_some(f)
}

/// [`render`] through the native format `format`, or the generic one when `None`.
fn render_as(
    engine: &Engine,
    messages: &[Value],
    tools: Option<&[Value]>,
    add_generation_prompt: bool,
    extra: Map<String, Value>,
    format: Option<ToolCallFormat>,
) -> Result<String, ApiError> {
    check_messages(messages)?;
    let tok = tokenizer(engine)?;
    if !tok.has_chat_template() {
        return Err(ApiError::invalid(
            None,
            "the model's tokenizer_config.json has no chat_template (use /v1/completions)",
        ));
    }
    let tools = tools.filter(|t| !t.is_empty());
    let uses_tools = tools.is_some()
        || messages
            .iter()
            .any(|m| m["role"] == "tool" || m.get("tool_calls").is_some_and(|c| !c.is_null()));
    if uses_tools && format.is_some() {
        // The template renders tools, calls and results itself; arguments sent as JSON
        // text (OpenAI's shape) become objects, which is what templates iterate.
        let msgs: Vec<Value> = messages.iter().map(arguments_as_objects).collect();
        let req = ChatRequest {
            messages: &msgs,
            tools,
            add_generation_prompt,
            extra: &extra,
        };
        return tok
            .render_chat(&req)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()));
    }
    let msgs: Vec<Value> = if uses_tools {
        let mut msgs = Vec::new();
        if let Some(tools) = tools {
            msgs.push(json!({"role": "system", "content": generic_tools_prompt(tools)}));
        }
        msgs.extend(messages.iter().map(generic_message));
        msgs
    } else {
        messages.to_vec()
    };
    let req = ChatRequest {
        messages: &msgs,
        tools: None,
        add_generation_prompt,
        extra: &extra,
    };
    tok.render_chat(&req)
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))
}

/// `tool_calls[].function.arguments` parsed from JSON text into objects.
fn arguments_as_objects(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for c in calls {
            if let Some(args) = c.get_mut("function").and_then(|f| f.get_mut("arguments")) {
                if let Some(v) = args
                    .as_str()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                {
                    *args = v;
                }
            }
        }
    }
    m
}

/// A message in the generic tool format: tool results become user messages, assistant
/// tool calls their JSON.
fn generic_message(m: &Value) -> Value {
    let mut content = content_text(m);
    let role = match m["role"].as_str().unwrap_or("user") {
        "tool" => {
            let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
            content = json!({"tool_result": {"tool_call_id": id, "content": content}}).to_string();
            "user"
        }
        "assistant" => {
            for c in m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let f = &c["function"];
                let args = match &f["arguments"] {
                    Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
                    other => other.clone(),
                };
                content +=
                    &json!({"tool_call": {"name": f["name"], "arguments": args}}).to_string();
            }
            "assistant"
        }
        r => r,
    };
    json!({"role": role, "content": content})
}

fn generic_tools_prompt(tools: &[Value]) -> String {
    let list: Vec<Value> = tools
        .iter()
        .map(|t| t.get("function").cloned().unwrap_or(t.clone()))
        .collect();
    format!(
        "You can call these tools:\n{}\n\nTo call a tool, answer with only a JSON object {{\"tool_call\": {{\"name\": <tool name>, \"arguments\": <arguments object>}}}}. Otherwise answer with {{\"response\": <your answer>}}.",
        serde_json::to_string_pretty(&list).unwrap_or_default()
    )
}

/// The functions of `tools`, checked: each `{"type": "function", "function": {"name", "parameters"?}}`.
fn functions(tools: &[Value]) -> Result<Vec<(String, Value)>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let param = format!("tools[{i}]");
            let f = t
                .get("function")
                .filter(|_| t.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        Some(&param),
                        format!(
                            "{param}: expected {{\"type\": \"function\", \"function\": {{...}}}}"
                        ),
                    )
                })?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    ApiError::invalid(Some(&param), format!("{param}: the function has no name"))
                })?;
            let params = f
                .get("parameters")
                .cloned()
                .unwrap_or(json!({"type": "object"}));
            Ok((name.to_string(), params))
        })
        .collect()
}

/// The JSON Schema of a generic-format answer calling one of `fns`.
fn call_schema(fns: &[(String, Value)]) -> Value {
    let calls: Vec<Value> = fns
        .iter()
        .map(|(name, params)| {
            json!({"type": "object",
                   "properties": {"name": {"const": name}, "arguments": params},
                   "required": ["name", "arguments"]})
        })
        .collect();
    json!({"type": "object", "properties": {"tool_call": {"anyOf": calls}}, "required": ["tool_call"]})
}

/// The prompt and constraint of a chat request.
pub fn plan(engine: &Engine, r: &openai::ChatRequest) -> Result<ChatPlan, ApiError> {
    let choice = match &r.tool_choice {
        None => "auto".to_string(),
        Some(Value::String(s)) if ["auto", "none", "required"].contains(&s.as_str()) => s.clone(),
        Some(Value::Object(o)) => {
            match o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            {
                Some(name) => format!("function:{name}"),
                None => return Err(ApiError::invalid(
                    Some("tool_choice"),
                    "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )),
            }
        }
        Some(other) => {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                format!("tool_choice: expected auto, none, required or a function, got {other}"),
            ))
        }
    };
    let tools = r
        .tools
        .as_deref()
        .filter(|t| !t.is_empty() && choice != "none");
    if tools.is_none() && (choice == "required" || choice.starts_with("function:")) {
        return Err(ApiError::invalid(
            Some("tool_choice"),
            "tool_choice asks for a tool call but no tools are given",
        ));
    }
    let mut fns = match tools {
        Some(t) => functions(t)?,
        None => Vec::new(),
    };
    if let Some(name) = choice.strip_prefix("function:") {
        fns.retain(|(n, _)| n == name);
        if fns.is_empty() {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                format!("tool_choice names {name:?}, which is not among the tools"),
            ));
        }
    }
    let extra = r.chat_template_kwargs.clone().unwrap_or_default();
    let required = choice == "required" || choice.starts_with("function:");
    // A required call is constrained by a grammar over the generic format (on every
    // model); otherwise the model's own format when its template knows tools.
    let native = if required {
        None
    } else {
        native_format(engine)
    };
    let prompt = render_as(engine, &r.messages, tools, true, extra, native)?;
    let from_format = match (&r.grammar, response_format(r.response_format.as_ref())?) {
        (None, f) => f,
        (Some(g), OutputConstraint::None) => OutputConstraint::Gbnf(g.clone()),
        (Some(_), _) => {
            return Err(ApiError::invalid(
                Some("grammar"),
                "grammar and response_format cannot be combined",
            ))
        }
    };
    let constraint = if tools.is_some() && required {
        if !matches!(from_format, OutputConstraint::None) {
            return Err(ApiError::invalid(
                Some("response_format"),
                "response_format cannot be combined with a required tool call",
            ));
        }
        OutputConstraint::JsonSchema(call_schema(&fns).to_string())
    } else {
        from_format
    };
    Ok(ChatPlan {
        prompt,
        constraint,
        tool_format: tools.map(|_| native.unwrap_or(ToolCallFormat::Generic)),
        tools: tools.map(<[Value]>::to_vec).unwrap_or_default(),
    })
}

/// `response_format` as a constraint.
fn response_format(f: Option<&Value>) -> Result<OutputConstraint, ApiError> {
    let Some(f) = f else {
        return Ok(OutputConstraint::None);
    };
    let bad = |m: &str| ApiError::invalid(Some("response_format"), m.to_string());
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(OutputConstraint::None),
        Some("json_object") => Ok(OutputConstraint::JsonSchema(
            json!({"type": "object"}).to_string(),
        )),
        Some("json_schema") => {
            let schema = f
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| {
                    bad("response_format: json_schema needs {\"json_schema\": {\"schema\": {...}}}")
                })?;
            Ok(OutputConstraint::JsonSchema(schema.to_string()))
        }
        _ => Err(bad(
            "response_format: type must be text, json_object or json_schema",
        )),
    }
}

fn call_id(text: &str) -> String {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "call_{n:08x}{:08x}",
        crate::kvfile::fnv(text.as_bytes()) as u32
    )
}

/// The assistant message for `text` (and `raw`, the same answer with its special tokens,
/// which native formats read), with tool calls parsed when the request had tools, and
/// the finish reason (`tool_calls` when the model called one).
pub fn message(
    plan: Option<&ChatPlan>,
    text: &str,
    raw: &str,
    reason: &'static str,
) -> (Value, &'static str) {
    let plain = (json!({"role": "assistant", "content": text}), reason);
    let Some((plan, format)) = plan.and_then(|p| Some((p, p.tool_format?))) else {
        return plain;
    };
    if format != ToolCallFormat::Generic {
        let out = parse_with_tools(format, raw, Some(&plan.tools));
        let mut m = json!({"role": "assistant", "content": out.content});
        if let Some(r) = out.reasoning {
            m["reasoning_content"] = json!(r);
        }
        if out.tool_calls.is_empty() {
            return (m, reason);
        }
        let calls: Vec<Value> = out
            .tool_calls
            .iter()
            .map(|c| json!({"id": call_id(raw), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        if m["content"].as_str().is_some_and(|c| c.trim().is_empty()) {
            m["content"] = Value::Null;
        }
        m["tool_calls"] = json!(calls);
        return (m, "tool_calls");
    }
    let Ok(v) = serde_json::from_str::<Value>(text.trim()) else {
        return plain;
    };
    if let Some(call) = v.get("tool_call") {
        let (Some(name), Some(args)) = (
            call.get("name").and_then(Value::as_str),
            call.get("arguments"),
        ) else {
            return plain;
        };
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!(
            "call_{n:08x}{:08x}",
            crate::kvfile::fnv(text.as_bytes()) as u32
        );
        let calls = json!([{"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]);
        return (
            json!({"role": "assistant", "content": null, "tool_calls": calls}),
            "tool_calls",
        );
    }
    match v.get("response").and_then(Value::as_str) {
        Some(r) => (json!({"role": "assistant", "content": r}), reason),
        None => plain,
    }
}
