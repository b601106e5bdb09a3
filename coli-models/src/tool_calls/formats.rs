//! One reader per format, each reading what its chat template writes (see the module
//! doc of [`super`]). Shared pieces: the `<think>` split, the block scanner that leaves
//! refused blocks in the content, and the XML-like tag walker.

use serde_json::{Map, Value};

use super::{ParsedOutput, ParsedToolCall};

/// The declared argument types of the request's tools, when known.
pub(super) struct ArgTypes<'a> {
    pub tools: Option<&'a [Value]>,
}

impl ArgTypes<'_> {
    /// Whether `function`'s parameter `arg` is declared as a string.
    fn is_string(&self, function: &str, arg: &str) -> bool {
        let Some(tools) = self.tools else {
            return false;
        };
        tools
            .iter()
            .map(|t| t.get("function").unwrap_or(t))
            .find(|f| f.get("name").and_then(Value::as_str) == Some(function))
            .and_then(|f| {
                f.pointer(&format!(
                    "/parameters/properties/{}/type",
                    escape_pointer(arg)
                ))
            })
            .is_some_and(|ty| ty == "string")
    }

    /// A bare value as an XML-like format writes it: strings as they are, everything
    /// else as JSON.
    fn value(&self, function: &str, arg: &str, raw: &str) -> Value {
        if self.is_string(function, arg) {
            return Value::String(raw.to_string());
        }
        serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_string()))
    }
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A call whose arguments are a JSON object (or a string holding one).
fn call(name: &str, arguments: &Value) -> Option<ParsedToolCall> {
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let object = match arguments {
        Value::Object(_) => arguments.clone(),
        Value::String(text) => serde_json::from_str::<Value>(text).ok()?,
        _ => return None,
    };
    object.is_object().then(|| ParsedToolCall {
        name: name.to_string(),
        arguments: object.to_string(),
    })
}

fn call_from_json_text(name: &str, text: &str) -> Option<ParsedToolCall> {
    call(name, &serde_json::from_str::<Value>(text.trim()).ok()?)
}

/// `<think>REASONING</think>REST`; the opening tag may be in the prompt already, and a
/// `<think>` never closed is reasoning cut short.
fn split_think(text: &str) -> (Option<String>, &str) {
    fn opened(s: &str) -> &str {
        let t = s.trim_start();
        t.strip_prefix("<think>").unwrap_or(t)
    }
    let (reasoning, rest) = match text.find("</think>") {
        Some(i) => (opened(&text[..i]), &text[i + "</think>".len()..]),
        None if text.trim_start().starts_with("<think>") => (opened(text), ""),
        None => return (None, text),
    };
    let reasoning = reasoning.trim();
    ((!reasoning.is_empty()).then(|| reasoning.to_string()), rest)
}

/// Walks `text` for `open … close` blocks. A block `parse_block` accepts becomes calls;
/// a refused block stays in the content. An unclosed last block is read to the end
/// when `unclosed_ok` (generation stopped on the closing token), else left as text.
fn scan_blocks(
    text: &str,
    open: &str,
    close: &str,
    unclosed_ok: bool,
    parse_block: impl Fn(&str) -> Option<Vec<ParsedToolCall>>,
) -> (String, Vec<ParsedToolCall>) {
    let (mut content, mut calls) = (String::new(), Vec::new());
    let mut pos = 0;
    while let Some(found) = text[pos..].find(open) {
        let start = pos + found;
        content.push_str(&text[pos..start]);
        let body_start = start + open.len();
        let (body, end) = match text[body_start..].find(close) {
            Some(i) => (
                &text[body_start..body_start + i],
                body_start + i + close.len(),
            ),
            None if unclosed_ok => (&text[body_start..], text.len()),
            None => {
                pos = start;
                break;
            }
        };
        match parse_block(body) {
            Some(found) => calls.extend(found),
            None => content.push_str(&text[start..end]),
        }
        pos = end;
    }
    content.push_str(&text[pos..]);
    (content, calls)
}

fn output(
    reasoning: Option<String>,
    (content, tool_calls): (String, Vec<ParsedToolCall>),
) -> ParsedOutput {
    ParsedOutput {
        content: content.trim().to_string(),
        reasoning,
        tool_calls,
    }
}

/// Consecutive `OPEN ATTRS>INNER CLOSE` items (whitespace between them), e.g.
/// `<invoke name="f">…</invoke>`: each as (attributes, inner). `None` if anything else
/// is there.
fn tagged_items<'a>(mut body: &'a str, open: &str, close: &str) -> Option<Vec<(&'a str, &'a str)>> {
    let mut items = Vec::new();
    loop {
        body = body.trim_start();
        if body.is_empty() {
            return Some(items);
        }
        let rest = body.strip_prefix(open)?;
        let gt = rest.find('>')?;
        let inner_and_more = &rest[gt + 1..];
        let end = inner_and_more.find(close)?;
        items.push((&rest[..gt], &inner_and_more[..end]));
        body = &inner_and_more[end + close.len()..];
    }
}

/// The value of the attribute that opens a tag (`f"` of `<invoke name="f">`), and the rest.
fn first_attribute(attrs: &str) -> Option<(&str, &str)> {
    let end = attrs.find('"')?;
    Some((&attrs[..end], &attrs[end + 1..]))
}

/// `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` (Qwen3's template).
pub(super) fn hermes(text: &str) -> ParsedOutput {
    let (reasoning, rest) = split_think(text);
    let blocks = scan_blocks(rest, "<tool_call>", "</tool_call>", true, |body| {
        let v: Value = serde_json::from_str(body.trim()).ok()?;
        let args = v.get("arguments").or_else(|| v.get("parameters"))?;
        Some(vec![call(v.get("name")?.as_str()?, args)?])
    });
    output(reasoning, blocks)
}

/// DeepSeek-V3.1's sections; DeepSeek-V3/R1 wrote `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` instead.
pub(super) fn deepseek_v31(text: &str) -> ParsedOutput {
    let (reasoning, rest) = split_think(text);
    let blocks = scan_blocks(
        rest,
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        true,
        |body| {
            let items = tagged_items_plain(body, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")?;
            items
                .into_iter()
                .map(|item| {
                    let (name, args) = item.split_once("<｜tool▁sep｜>")?;
                    if let (true, Some((fn_name, fenced))) =
                        (name.trim() == "function", args.split_once('\n'))
                    {
                        let json = fenced
                            .trim()
                            .strip_prefix("```json")?
                            .trim_end()
                            .strip_suffix("```")?;
                        return call_from_json_text(fn_name, json);
                    }
                    call_from_json_text(name, args)
                })
                .collect()
        },
    );
    output(reasoning, blocks)
}

/// Consecutive `OPEN INNER CLOSE` items with only whitespace between them.
fn tagged_items_plain<'a>(mut body: &'a str, open: &str, close: &str) -> Option<Vec<&'a str>> {
    let mut items = Vec::new();
    loop {
        body = body.trim_start();
        if body.is_empty() {
            return Some(items);
        }
        let rest = body.strip_prefix(open)?;
        let end = rest.find(close)?;
        items.push(&rest[..end]);
        body = &rest[end + close.len()..];
    }
}

/// DeepSeek-V3.2's DSML: parameters marked `string="true"` are bare strings, others JSON.
pub(super) fn deepseek_v32(text: &str, types: &ArgTypes) -> ParsedOutput {
    const DSML: &str = "｜DSML｜";
    let (reasoning, rest) = split_think(text);
    let open = format!("<{DSML}function_calls>");
    let close = format!("</{DSML}function_calls>");
    let invoke = (format!("<{DSML}invoke name=\""), format!("</{DSML}invoke>"));
    let param = (
        format!("<{DSML}parameter name=\""),
        format!("</{DSML}parameter>"),
    );
    let blocks = scan_blocks(rest, &open, &close, true, |body| {
        let invokes = tagged_items(body, &invoke.0, &invoke.1)?;
        invokes
            .into_iter()
            .map(|(attrs, inner)| {
                let (name, _) = first_attribute(attrs)?;
                let mut args = Map::new();
                for (attrs, raw) in tagged_items(inner, &param.0, &param.1)? {
                    let (key, more) = first_attribute(attrs)?;
                    let value = if more.contains("string=\"true\"") {
                        Value::String(raw.to_string())
                    } else {
                        types.value(name, key, raw)
                    };
                    args.insert(key.to_string(), value);
                }
                call(name, &Value::Object(args))
            })
            .collect()
    });
    output(reasoning, blocks)
}

/// Kimi-K2: the call id is `functions.NAME:INDEX`.
pub(super) fn kimi_k2(text: &str) -> ParsedOutput {
    let (reasoning, rest) = split_think(text);
    let blocks = scan_blocks(
        rest,
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        true,
        |body| {
            let items = tagged_items_plain(body, "<|tool_call_begin|>", "<|tool_call_end|>")?;
            items
                .into_iter()
                .map(|item| {
                    let (id, args) = item.split_once("<|tool_call_argument_begin|>")?;
                    let id = id.trim();
                    let id = id.strip_prefix("functions.").unwrap_or(id);
                    let name = match id.rsplit_once(':') {
                        Some((name, index)) if index.bytes().all(|b| b.is_ascii_digit()) => name,
                        _ => id,
                    };
                    call_from_json_text(name, args)
                })
                .collect()
        },
    );
    output(reasoning, blocks)
}

/// GLM-4.5/4.6: `<tool_call>NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs.
pub(super) fn glm45(text: &str, types: &ArgTypes) -> ParsedOutput {
    let (reasoning, rest) = split_think(text);
    let blocks = scan_blocks(rest, "<tool_call>", "</tool_call>", true, |body| {
        let (name, mut pairs) = match body.find("<arg_key>") {
            Some(i) => (body[..i].trim(), &body[i..]),
            None => (body.trim(), ""),
        };
        if name.is_empty() || name.contains(char::is_whitespace) || name.contains('<') {
            return None;
        }
        let mut args = Map::new();
        loop {
            pairs = pairs.trim_start();
            if pairs.is_empty() {
                break;
            }
            let rest = pairs.strip_prefix("<arg_key>")?;
            let (key, rest) = rest.split_once("</arg_key>")?;
            let rest = rest.trim_start().strip_prefix("<arg_value>")?;
            let (raw, rest) = rest.split_once("</arg_value>")?;
            args.insert(key.trim().to_string(), types.value(name, key.trim(), raw));
            pairs = rest;
        }
        Some(vec![call(name, &Value::Object(args))?])
    });
    output(reasoning, blocks)
}

/// MiniMax-M2: `<invoke name="N">` with `<parameter name="K">V</parameter>` inside.
pub(super) fn minimax_m2(text: &str, types: &ArgTypes) -> ParsedOutput {
    let (reasoning, rest) = split_think(text);
    let blocks = scan_blocks(
        rest,
        "<minimax:tool_call>",
        "</minimax:tool_call>",
        true,
        |body| {
            let invokes = tagged_items(body, "<invoke name=\"", "</invoke>")?;
            invokes
                .into_iter()
                .map(|(attrs, inner)| {
                    let (name, _) = first_attribute(attrs)?;
                    let mut args = Map::new();
                    for (attrs, raw) in tagged_items(inner, "<parameter name=\"", "</parameter>")? {
                        let (key, _) = first_attribute(attrs)?;
                        args.insert(key.to_string(), types.value(name, key, raw));
                    }
                    call(name, &Value::Object(args))
                })
                .collect()
        },
    );
    output(reasoning, blocks)
}

/// gpt-oss (harmony): messages `<|channel|>C [to=R] [<|constrain|>json]<|message|>BODY`
/// ended by `<|end|>`, `<|call|>` or `<|return|>` (or the end of the text, when
/// generation stopped on that token), separated by `<|start|>assistant`.
pub(super) fn gpt_oss(text: &str) -> ParsedOutput {
    let (mut content, mut reasoning, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for segment in text.split("<|start|>") {
        let Some((header, body)) = segment.split_once("<|message|>") else {
            // A message header cut short (`assistant`, `assistant<|channel|>final`) says nothing.
            if segment.trim() != "assistant" && !segment.contains("<|channel|>") {
                content.push(segment);
            }
            continue;
        };
        let body = ["<|end|>", "<|call|>", "<|return|>"]
            .iter()
            .filter_map(|end| body.find(end))
            .min()
            .map_or(body, |i| &body[..i]);
        let word_after = |marker: &str| {
            header.split_once(marker).map(|(_, after)| {
                let end = after
                    .find(|c: char| c.is_whitespace() || c == '<')
                    .unwrap_or(after.len());
                &after[..end]
            })
        };
        let channel = word_after("<|channel|>");
        match word_after("to=").and_then(|r| r.strip_prefix("functions.")) {
            Some(name) => match call_from_json_text(name, body) {
                Some(c) => calls.push(c),
                None => content.push(segment),
            },
            None if channel == Some("analysis") => reasoning.push(body.trim()),
            None => content.push(body),
        }
    }
    let reasoning = reasoning.join("\n");
    ParsedOutput {
        content: content.concat().trim().to_string(),
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        tool_calls: calls,
    }
}

/// Llama 3.x: the answer is one or more `{"name": …, "parameters": {…}}` separated by `;`.
pub(super) fn llama3_json(text: &str) -> ParsedOutput {
    let plain = || ParsedOutput {
        content: text.trim().to_string(),
        ..ParsedOutput::default()
    };
    let body = text.trim();
    let mut rest = body.strip_prefix("<|python_tag|>").unwrap_or(body);
    if !rest.trim_start().starts_with('{') {
        return plain();
    }
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start().trim_start_matches(';').trim_start();
        if rest.is_empty() {
            break;
        }
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let Some(Ok(v)) = stream.next() else {
            return plain();
        };
        let found = v
            .get("name")
            .and_then(Value::as_str)
            .and_then(|name| call(name, v.get("parameters").or_else(|| v.get("arguments"))?));
        match found {
            Some(c) => calls.push(c),
            None => return plain(),
        }
        rest = &rest[stream.byte_offset()..];
    }
    ParsedOutput {
        tool_calls: calls,
        ..ParsedOutput::default()
    }
}

/// coli's generic format: `{"tool_calls": [{"name", "arguments"}]}`, `{"tool_call": {…}}`
/// or `{"response": "…"}`; anything else is plain content.
pub(super) fn generic(text: &str) -> ParsedOutput {
    let plain = ParsedOutput {
        content: text.trim().to_string(),
        ..ParsedOutput::default()
    };
    let Ok(Value::Object(v)) = serde_json::from_str::<Value>(text.trim()) else {
        return plain;
    };
    let one = |c: &Value| call(c.get("name")?.as_str()?, c.get("arguments")?);
    if let Some(list) = v.get("tool_calls").and_then(Value::as_array) {
        return match list.iter().map(one).collect::<Option<Vec<_>>>() {
            Some(tool_calls) => ParsedOutput {
                tool_calls,
                ..ParsedOutput::default()
            },
            None => plain,
        };
    }
    if let Some(c) = v.get("tool_call").and_then(one) {
        return ParsedOutput {
            tool_calls: vec![c],
            ..ParsedOutput::default()
        };
    }
    match v.get("response") {
        Some(Value::String(s)) => ParsedOutput {
            content: s.clone(),
            ..ParsedOutput::default()
        },
        _ => plain,
    }
}
