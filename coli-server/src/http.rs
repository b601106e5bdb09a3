//! The HTTP endpoints. Handlers check and translate requests; `respond` hands them to the
//! scheduler and translates its events back into OpenAI's shapes (JSON, or server-sent
//! events).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coli_models::{Engine, OutputConstraint};
use serde_json::{json, Value};

use crate::chat;
use crate::openai::{parse, ApiError, ChatRequest, CompletionPrompt, CompletionRequest};
use crate::respond::{self, Kind, Plan};
use crate::scheduler::Scheduler;
use crate::{guard, ServeConfig};

/// What every handler sees.
pub struct AppState {
    /// The model.
    pub engine: Arc<Engine>,
    /// The scheduler's handle.
    pub sched: Scheduler,
    /// The server's settings.
    pub cfg: ServeConfig,
    /// The name `/v1/models` lists.
    pub model_id: String,
    pub(crate) seeds: AtomicU64,
}

impl AppState {
    /// The state of a server over `engine`.
    pub fn new(engine: Arc<Engine>, sched: Scheduler, cfg: ServeConfig) -> AppState {
        let model_id = engine
            .dir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "coli".into());
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        AppState {
            engine,
            sched,
            cfg,
            model_id,
            seeds: AtomicU64::new(seed),
        }
    }
}

type St = State<Arc<AppState>>;

/// A request body, or why axum could not read it (too large).
type RawBody = Result<Bytes, axum::extract::rejection::BytesRejection>;

/// The router with every endpoint, the body limit, the Host guard and auth.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.body_limit;
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/apply-template", post(apply_template))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint",
    )
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn models(State(st): St) -> Json<Value> {
    let info = &st.engine.model().info;
    Json(json!({"object": "list", "data": [{
        "id": st.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "coli",
        "meta": {
            "model_type": info.model_type,
            "vocab_size": info.vocab_size,
            "context_per_slot": st.cfg.ctx,
            "slots": st.cfg.slots,
        }
    }]}))
}

async fn metrics(State(st): St) -> Response {
    let sh = &st.sched.shared;
    let g = crate::metrics::Gauges {
        waiting: sh.waiting.load(Ordering::Relaxed),
        running: sh.running.load(Ordering::Relaxed),
        slots: sh.slots,
        ctx: sh.ctx,
        kv_tokens: sh.kv_tokens.load(Ordering::Relaxed),
        grammar_hits: sh.grammar_hits.load(Ordering::Relaxed),
        grammar_misses: sh.grammar_misses.load(Ordering::Relaxed),
    };
    (
        [("content-type", "text/plain; version=0.0.4")],
        sh.metrics.render(&g),
    )
        .into_response()
}

/// The body, or 413 when it is over the limit.
fn body(b: RawBody) -> Result<Bytes, ApiError> {
    b.map_err(|e| {
        let status = e.status();
        ApiError::new(status, "invalid_request_error", e.body_text())
    })
}

async fn apply_template(State(st): St, b: RawBody) -> Result<Json<Value>, ApiError> {
    #[derive(serde::Deserialize)]
    struct Req {
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
        add_generation_prompt: Option<bool>,
        chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    }
    let r: Req = parse(&body(b)?)?;
    let prompt = chat::render(
        &st.engine,
        &r.messages,
        r.tools.as_deref(),
        r.add_generation_prompt.unwrap_or(true),
        r.chat_template_kwargs.unwrap_or_default(),
    )?;
    Ok(Json(json!({ "prompt": prompt })))
}

async fn tokenize(State(st): St, b: RawBody) -> Result<Json<Value>, ApiError> {
    #[derive(serde::Deserialize)]
    struct Req {
        content: String,
    }
    let r: Req = parse(&body(b)?)?;
    let tok = tokenizer(&st.engine)?;
    let ids = tok
        .encode(&r.content)
        .map_err(|e| ApiError::invalid(Some("content"), e.to_string()))?;
    Ok(Json(json!({ "tokens": ids })))
}

async fn detokenize(State(st): St, b: RawBody) -> Result<Json<Value>, ApiError> {
    #[derive(serde::Deserialize)]
    struct Req {
        tokens: Vec<u32>,
    }
    let r: Req = parse(&body(b)?)?;
    let vocab = st.engine.model().info.vocab_size;
    if let Some(t) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            Some("tokens"),
            format!("token {t} is outside the vocabulary (size {vocab})"),
        ));
    }
    let text = tokenizer(&st.engine)?
        .decode(&r.tokens, false)
        .map_err(|e| ApiError::invalid(Some("tokens"), e.to_string()))?;
    Ok(Json(json!({ "content": text })))
}

/// The engine's tokenizer, or a 400 saying the model has none.
pub fn tokenizer(engine: &Engine) -> Result<&coli_models::TextTokenizer, ApiError> {
    engine
        .tokenizer()
        .map_err(|e| ApiError::invalid(None, format!("the model has no tokenizer: {e}")))
}

async fn chat_completions(State(st): St, b: RawBody) -> Response {
    let result = async {
        let r: ChatRequest = parse(&body(b)?)?;
        let sampling = r.common.check()?;
        let logprobs = match (r.logprobs, r.top_logprobs) {
            (_, Some(n)) if n > 20 => {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "top_logprobs is at most 20",
                ))
            }
            (true, n) => Some(n.unwrap_or(0)),
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "top_logprobs needs logprobs: true",
                ))
            }
            (false, None) => None,
        };
        let plan = chat::plan(&st.engine, &r)?;
        let prompt_ids = tokenizer(&st.engine)?
            .encode(&plan.prompt)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        Ok(Plan {
            kind: Kind::Chat,
            prompt_ids,
            sampling,
            constraint: plan.constraint.clone(),
            logprobs,
            stream: r.common.stream,
            include_usage: r
                .common
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            ignore_eos: r.common.ignore_eos,
            chat: Some(plan),
        })
    }
    .await;
    match result {
        Ok(plan) => respond::generate(st, plan, "chat").await,
        Err(e) => answer_error(&st, "chat", e),
    }
}

async fn completions(State(st): St, b: RawBody) -> Response {
    let result = (|| {
        let r: CompletionRequest = parse(&body(b)?)?;
        let sampling = r.common.check()?;
        if r.logprobs.is_some_and(|n| n > 20) {
            return Err(ApiError::invalid(
                Some("logprobs"),
                "logprobs is at most 20",
            ));
        }
        let prompt_ids = match r.prompt {
            CompletionPrompt::Ids(ids) => ids,
            CompletionPrompt::Text(t) => tokenizer(&st.engine)?
                .encode(&t)
                .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?,
            CompletionPrompt::Texts(v) if v.len() == 1 => tokenizer(&st.engine)?
                .encode(&v[0])
                .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?,
            CompletionPrompt::Texts(_) => {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    "one prompt per request (send a string or a list of token ids)",
                ))
            }
        };
        Ok(Plan {
            kind: Kind::Completion,
            prompt_ids,
            sampling,
            constraint: OutputConstraint::None,
            logprobs: r.logprobs,
            stream: r.common.stream,
            include_usage: r
                .common
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            ignore_eos: r.common.ignore_eos,
            chat: None,
        })
    })();
    match result {
        Ok(plan) => respond::generate(st, plan, "completions").await,
        Err(e) => answer_error(&st, "completions", e),
    }
}

pub(crate) fn answer_error(st: &AppState, endpoint: &'static str, e: ApiError) -> Response {
    st.sched
        .shared
        .metrics
        .record_request(endpoint, e.status.as_u16());
    e.into_response()
}
