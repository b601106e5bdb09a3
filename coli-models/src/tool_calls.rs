//! Tool calls out of a model's generated text, per model family.
//!
//! Each family writes calls the way its chat template renders an assistant's
//! `tool_calls` back into the prompt (the template is the spec: the model was trained
//! on that rendering), so each parser here reads exactly what its template writes, and
//! the round-trip test (`tests/tests/suite/tool_calls.rs`) renders calls through the real
//! templates and parses them back. [`ToolCallFormat::detect`] picks the format from
//! the template's own markers.
//!
//! The text must be decoded with special tokens kept (`<|channel|>`, `<｜tool▁sep｜>`…):
//! several formats are delimited by them. A call that does not parse (bad JSON, a
//! missing closing marker) is left in `content`, never dropped and never guessed.

mod formats;
#[cfg(test)]
mod tests;

use serde_json::Value;

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolCallFormat {
    /// Qwen3, Hermes-style models: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`.
    Hermes,
    /// DeepSeek-V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`
    /// (DeepSeek-V3/R1's `function<｜tool▁sep｜>NAME` + fenced JSON is read too).
    DeepSeekV31,
    /// DeepSeek-V3.2's DSML: `<｜DSML｜function_calls><｜DSML｜invoke name="N"><｜DSML｜parameter name="K" string="true|false">V</…>`.
    DeepSeekV32,
    /// Kimi-K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>…<|tool_calls_section_end|>`.
    KimiK2,
    /// GLM-4.5/4.6: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`.
    Glm45,
    /// gpt-oss (harmony): `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`,
    /// reasoning on the `analysis` channel, the answer on `final`.
    GptOss,
    /// MiniMax-M2: `<minimax:tool_call><invoke name="N"><parameter name="K">V</parameter></invoke></minimax:tool_call>`.
    MiniMaxM2,
    /// Llama 3.x: the whole answer is `{"name": …, "parameters": {…}}` (several separated by `;`).
    Llama3Json,
    /// coli's own, for templates that know no tools (as llama-server's generic format):
    /// the answer is `{"tool_calls": [{"name": …, "arguments": {…}}]}` or `{"response": "…"}`.
    Generic,
}

/// One tool call found in the text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ParsedToolCall {
    /// The function's name.
    pub name: String,
    /// The arguments as compact JSON text (an object, keys in the order written).
    pub arguments: String,
}

/// Generated text split into what the user reads, the reasoning and the tool calls.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ParsedOutput {
    /// The text outside reasoning and calls (trimmed).
    pub content: String,
    /// The reasoning (`<think>…</think>`, harmony's `analysis` channel), if any.
    pub reasoning: Option<String>,
    /// The calls, in the order written.
    pub tool_calls: Vec<ParsedToolCall>,
}

impl ToolCallFormat {
    /// Every format, for tests and listings.
    pub const ALL: [ToolCallFormat; 9] = [
        ToolCallFormat::Hermes,
        ToolCallFormat::DeepSeekV31,
        ToolCallFormat::DeepSeekV32,
        ToolCallFormat::KimiK2,
        ToolCallFormat::Glm45,
        ToolCallFormat::GptOss,
        ToolCallFormat::MiniMaxM2,
        ToolCallFormat::Llama3Json,
        ToolCallFormat::Generic,
    ];

    /// The format a chat template teaches, from the markers it renders tool calls with;
    /// [`ToolCallFormat::Generic`] when the template shows none (it knows no tools).
    pub fn detect(chat_template: Option<&str>) -> ToolCallFormat {
        let Some(t) = chat_template else {
            return ToolCallFormat::Generic;
        };
        let has = |marker: &str| t.contains(marker);
        if has("<｜tool▁calls▁begin｜>") || has("<｜tool▁call▁begin｜>") {
            ToolCallFormat::DeepSeekV31
        } else if has("｜DSML｜") {
            ToolCallFormat::DeepSeekV32
        } else if has("<|tool_calls_section_begin|>") || has("<|im_system|>tool_declare") {
            // Kimi-K2's first template declares tools but does not render calls; the
            // model writes them in its native section format all the same.
            ToolCallFormat::KimiK2
        } else if has("<arg_key>") {
            ToolCallFormat::Glm45
        } else if has("<minimax:tool_call>") {
            ToolCallFormat::MiniMaxM2
        } else if has("to=functions") || has("<|channel|>") {
            ToolCallFormat::GptOss
        } else if has("<tool_call>") {
            ToolCallFormat::Hermes
        } else if has("<|python_tag|>") || (has("\"parameters\"") && has("<|start_header_id|>")) {
            ToolCallFormat::Llama3Json
        } else {
            ToolCallFormat::Generic
        }
    }

    /// The text that opens a call (to build a grammar that forces one).
    pub fn call_prefix(&self) -> &str {
        match self {
            ToolCallFormat::Hermes => "<tool_call>",
            ToolCallFormat::DeepSeekV31 => "<｜tool▁calls▁begin｜>",
            ToolCallFormat::DeepSeekV32 => "<｜DSML｜function_calls>",
            ToolCallFormat::KimiK2 => "<|tool_calls_section_begin|>",
            ToolCallFormat::Glm45 => "<tool_call>",
            ToolCallFormat::GptOss => "<|channel|>commentary to=functions.",
            ToolCallFormat::MiniMaxM2 => "<minimax:tool_call>",
            ToolCallFormat::Llama3Json => "{\"name\": \"",
            ToolCallFormat::Generic => "{\"tool_calls\": [",
        }
    }

    /// A short name (`hermes`, `deepseek-v3.1`, …) for logs and flags.
    pub fn as_str(&self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::DeepSeekV31 => "deepseek-v3.1",
            ToolCallFormat::DeepSeekV32 => "deepseek-v3.2",
            ToolCallFormat::KimiK2 => "kimi-k2",
            ToolCallFormat::Glm45 => "glm-4.5",
            ToolCallFormat::GptOss => "gpt-oss",
            ToolCallFormat::MiniMaxM2 => "minimax-m2",
            ToolCallFormat::Llama3Json => "llama3-json",
            ToolCallFormat::Generic => "generic",
        }
    }
}

/// Splits `text` into content, reasoning and tool calls as `format` writes them.
/// Never panics; a malformed call stays in `content`.
pub fn parse(format: ToolCallFormat, text: &str) -> ParsedOutput {
    parse_with_tools(format, text, None)
}

/// [`parse`], reading each argument's declared type from `tools` (OpenAI tool objects):
/// the XML-like formats (GLM, MiniMax, DeepSeek-V3.2) write a string argument bare, so
/// `42` is the string `"42"` when the schema says string, the number 42 otherwise.
pub fn parse_with_tools(
    format: ToolCallFormat,
    text: &str,
    tools: Option<&[Value]>,
) -> ParsedOutput {
    let schema = formats::ArgTypes { tools };
    match format {
        ToolCallFormat::Hermes => formats::hermes(text),
        ToolCallFormat::DeepSeekV31 => formats::deepseek_v31(text),
        ToolCallFormat::DeepSeekV32 => formats::deepseek_v32(text, &schema),
        ToolCallFormat::KimiK2 => formats::kimi_k2(text),
        ToolCallFormat::Glm45 => formats::glm45(text, &schema),
        ToolCallFormat::GptOss => formats::gpt_oss(text),
        ToolCallFormat::MiniMaxM2 => formats::minimax_m2(text, &schema),
        ToolCallFormat::Llama3Json => formats::llama3_json(text),
        ToolCallFormat::Generic => formats::generic(text),
    }
}
