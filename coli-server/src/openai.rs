//! The OpenAI request shapes coli accepts, their validation, and the error shape
//! (`{"error": {"message", "type", "param", "code"}}`) every failure is answered with.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

/// An error answered in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, …).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (429).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// 400 about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
            retry_after: None,
        }
    }

    /// Any status.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// With a code.
    pub fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }});
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from(s));
        }
        r
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Add a last chunk with the usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and length fields shared by chat and completions.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    /// The model name (any value is accepted: one model is served).
    pub model: Option<String>,
    /// Most new tokens.
    pub max_tokens: Option<u64>,
    /// Most new tokens (the newer name).
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature, 0..=2 (default 1).
    pub temperature: Option<f32>,
    /// Nucleus mass, (0, 1].
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens (an extension).
    pub top_k: Option<usize>,
    /// RNG seed.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Completions wanted (only 1).
    pub n: Option<u32>,
    /// Stream with server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Not supported; refused when non-zero.
    pub frequency_penalty: Option<f32>,
    /// Not supported; refused when non-zero.
    pub presence_penalty: Option<f32>,
    /// Keep generating past end-of-sequence (an extension, for benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Value>,
    /// Sampling, length, streaming.
    #[serde(flatten)]
    pub common: Common,
    /// Return log-probabilities.
    #[serde(default)]
    pub logprobs: bool,
    /// Alternatives per token (0..=20), with `logprobs`.
    pub top_logprobs: Option<usize>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`.
    pub response_format: Option<Value>,
    /// Tools the model may call.
    pub tools: Option<Vec<Value>>,
    /// `auto`, `none`, `required` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<Value>,
    /// Extra chat-template variables (an extension, as llama-server's).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// A GBNF grammar the answer must match (an extension, as llama-server's).
    pub grammar: Option<String>,
}

/// A completions prompt: text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum CompletionPrompt {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// A batch of prompts (only one is accepted).
    Texts(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: CompletionPrompt,
    /// Sampling, length, streaming.
    #[serde(flatten)]
    pub common: Common,
    /// Alternatives per token (legacy completions: an integer).
    pub logprobs: Option<usize>,
}

/// Parses a JSON body into `T`, or a 400 naming the field.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let msg = e.to_string();
        let param = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.contains("field"))
            .map(str::to_string);
        ApiError {
            param,
            ..ApiError::invalid(None, format!("invalid request body: {msg}"))
        }
    })
}

/// The checked sampling settings of a request.
#[derive(Debug, Clone)]
pub struct Sampling {
    /// Temperature.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Top-k (0 = off).
    pub top_k: usize,
    /// Seed.
    pub seed: Option<u64>,
    /// Most new tokens asked for (None: as many as the context allows).
    pub max_tokens: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
}

impl Common {
    /// Checks the fields every endpoint shares.
    pub fn check(&self) -> Result<Sampling, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid(
                    Some("n"),
                    format!("n = {n}: coli returns one choice per request (n must be 1)"),
                ));
            }
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::invalid(
                    Some(name),
                    format!("{name} is not supported (only 0)"),
                ));
            }
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                Some("temperature"),
                format!("temperature {temperature} is outside 0..=2"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                Some("top_p"),
                format!("top_p {top_p} is outside (0, 1]"),
            ));
        }
        let max = self.max_completion_tokens.or(self.max_tokens);
        if max == Some(0) {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                "max_tokens must be at least 1",
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 16 {
            return Err(ApiError::invalid(Some("stop"), "at most 16 stop strings"));
        }
        Ok(Sampling {
            temperature,
            top_p,
            top_k: self.top_k.unwrap_or(0),
            seed: self.seed,
            max_tokens: max.map(|m| m.min(usize::MAX as u64) as usize),
            stop,
        })
    }
}
