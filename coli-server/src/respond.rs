//! From a checked request to its answer: queue the job, wait for its start, then collect
//! the scheduler's token events into a whole completion or a server-sent event stream
//! (stop strings, log-probabilities, tool calls, usage, the schema's verdict).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use coli_models::{
    Engine, FinishReason, GenerateRequest, OutputConstraint, Prompt, SamplingParams, SlotOptions,
    TokenEvent,
};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::chat::{self, ChatPlan};
use crate::http::{answer_error, AppState};
use crate::openai::{ApiError, Sampling};
use crate::scheduler::{Event, Finished, Job, Rejected};
use crate::stops::StopScanner;

/// Which API shape a generation answers in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// A checked generation, ready for the scheduler.
pub(crate) struct Plan {
    pub(crate) kind: Kind,
    pub(crate) prompt_ids: Vec<u32>,
    pub(crate) sampling: Sampling,
    pub(crate) constraint: OutputConstraint,
    pub(crate) logprobs: Option<usize>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) ignore_eos: bool,
    pub(crate) chat: Option<ChatPlan>,
}

/// Checks the prompt against the context, queues the job, waits for its start, then
/// answers with the whole completion or a stream.
pub(crate) async fn generate(st: Arc<AppState>, plan: Plan, endpoint: &'static str) -> Response {
    match start(&st, &plan).await {
        Ok((rx, started, cancel)) => {
            st.sched.shared.metrics.record_request(endpoint, 200);
            if plan.stream {
                stream(st, plan, rx, started, cancel).into_response()
            } else {
                whole(st, plan, rx, started, cancel).await
            }
        }
        Err(e) => answer_error(&st, endpoint, e),
    }
}

/// Prompt and cached tokens from the `Started` event.
#[derive(Clone, Copy)]
struct Started {
    prompt_tokens: usize,
    cached_tokens: usize,
}

async fn start(
    st: &AppState,
    plan: &Plan,
) -> Result<(UnboundedReceiver<Event>, Started, Arc<AtomicBool>), ApiError> {
    let ctx = st.cfg.ctx;
    let n = plan.prompt_ids.len();
    if n == 0 {
        return Err(ApiError::invalid(Some("prompt"), "the prompt is empty"));
    }
    if n >= ctx {
        return Err(ApiError::invalid(
            Some("messages"),
            format!("the prompt has {n} tokens; the context holds {ctx} (room for at least one new token is needed)"),
        )
        .code("context_length_exceeded"));
    }
    // Clamped to the context (a request never asks for more than the slot can hold).
    let max_tokens = plan.sampling.max_tokens.unwrap_or(usize::MAX).min(ctx - n);
    let seed = plan
        .sampling
        .seed
        .unwrap_or_else(|| st.seeds.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed));
    let req = GenerateRequest {
        prompt: Prompt::Ids(plan.prompt_ids.clone()),
        sampling: SamplingParams {
            temperature: plan.sampling.temperature,
            top_k: plan.sampling.top_k,
            top_p: plan.sampling.top_p,
            seed,
        },
        max_tokens,
        ignore_eos: plan.ignore_eos,
        constraint: plan.constraint.clone(),
        drafts: st.cfg.drafts.forced,
        lookup: st.cfg.drafts.lookup,
        mtp: st.cfg.drafts.mtp,
        mtp_depth: st.cfg.drafts.mtp_depth,
    };
    let (tx, mut rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job {
        req,
        opts: SlotOptions {
            logprobs: plan.logprobs,
        },
        events: tx,
        cancel: cancel.clone(),
    };
    match st.sched.submit(job) {
        Ok(()) => {}
        Err(Rejected::QueueFull) => {
            return Err(ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "every slot is busy and the queue is full; retry later",
                )
            })
        }
        Err(Rejected::Stopped) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the server is shutting down",
            ))
        }
    }
    match rx.recv().await {
        Some(Event::Started {
            prompt_tokens,
            cached_tokens,
        }) => Ok((
            rx,
            Started {
                prompt_tokens,
                cached_tokens,
            },
            cancel,
        )),
        Some(Event::Refused { param, message }) => Err(ApiError::invalid(param, message)),
        Some(Event::Error(msg)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            msg,
        )),
        _ => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the request ended before it started",
        )),
    }
}

/// Text assembled from token events, cut at stop strings, with log-probabilities.
struct Collector<'a> {
    engine: &'a Engine,
    stops: StopScanner,
    logprobs: Vec<Value>,
    want_logprobs: bool,
    cancel: Arc<AtomicBool>,
}

impl<'a> Collector<'a> {
    fn new(engine: &'a Engine, plan: &Plan, cancel: Arc<AtomicBool>) -> Collector<'a> {
        Collector {
            engine,
            stops: StopScanner::new(plan.sampling.stop.clone()),
            logprobs: Vec::new(),
            want_logprobs: plan.logprobs.is_some(),
            cancel,
        }
    }

    /// The text a token adds (after stop-string holdback).
    fn push(&mut self, e: &TokenEvent) -> String {
        if self.want_logprobs {
            if let Some(lp) = &e.logprob {
                let entry = |id: u32, logprob: f64| {
                    let text = self
                        .engine
                        .tokenizer()
                        .ok()
                        .and_then(|t| t.decode(&[id], false).ok())
                        .unwrap_or_default();
                    json!({"token": text, "logprob": logprob, "bytes": text.as_bytes(), "id": id})
                };
                let mut head = entry(e.id, lp.logprob);
                head["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
                self.logprobs.push(head);
            }
        }
        let out = self.stops.push(&e.text);
        if self.stops.hit() {
            self.cancel.store(true, Ordering::SeqCst);
        }
        out
    }
}

/// The answer with its special tokens (native tool formats mark calls with them), without
/// a final end-of-sequence token; empty when the plan does not need it.
fn raw_text(engine: &Engine, plan: Option<&ChatPlan>, f: &Finished) -> String {
    if !plan.is_some_and(ChatPlan::needs_special_tokens) {
        return String::new();
    }
    let mut ids = &f.generated[..];
    if f.finish == FinishReason::Stop && !f.cancelled {
        if let Some((last, rest)) = ids.split_last() {
            if engine.eos_ids().contains(last) {
                ids = rest;
            }
        }
    }
    engine
        .tokenizer()
        .ok()
        .and_then(|t| t.decode(ids, false).ok())
        .unwrap_or_default()
}

fn finish_reason(f: &Finished, stops: &StopScanner) -> &'static str {
    if stops.hit() {
        return "stop";
    }
    match f.finish {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// OpenAI's usage object; the draft tokens the model confirmed and refused are reported
/// under the names OpenAI uses for predicted outputs.
fn usage(started: Started, f: &Finished) -> Value {
    let st = &f.stats;
    json!({
        "prompt_tokens": started.prompt_tokens,
        "completion_tokens": f.generated.len(),
        "total_tokens": started.prompt_tokens + f.generated.len(),
        "prompt_tokens_details": {"cached_tokens": started.cached_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": st.drafted_tokens,
            "rejected_prediction_tokens": st.draft_proposed - st.drafted_tokens,
        },
    })
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn request_id(kind: Kind) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let prefix = if kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    format!(
        "{prefix}-{:x}{:06x}",
        now(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn whole(
    st: Arc<AppState>,
    plan: Plan,
    mut rx: UnboundedReceiver<Event>,
    started: Started,
    cancel: Arc<AtomicBool>,
) -> Response {
    let mut c = Collector::new(&st.engine, &plan, cancel);
    let mut text = String::new();
    let finished = loop {
        match rx.recv().await {
            Some(Event::Token(e)) => text += &c.push(&e),
            Some(Event::Done(f)) => break f,
            Some(Event::Error(msg)) => {
                return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg)
                    .into_response()
            }
            Some(Event::Started { .. }) | Some(Event::Refused { .. }) => {}
            None => {
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "generation stopped without an answer",
                )
                .into_response()
            }
        }
    };
    text += &c.stops.finish();
    if let Some(v) = &finished.violation {
        return ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_response_error",
            v.clone(),
        )
        .code("schema_violation")
        .into_response();
    }
    let reason = finish_reason(&finished, &c.stops);
    let id = request_id(plan.kind);
    let mut body = match plan.kind {
        Kind::Chat => {
            let raw = raw_text(&st.engine, plan.chat.as_ref(), &finished);
            let (message, reason) = chat::message(plan.chat.as_ref(), &text, &raw, reason);
            let mut choice = json!({"index": 0, "message": message, "finish_reason": reason});
            choice["logprobs"] = if plan.logprobs.is_some() {
                json!({ "content": c.logprobs })
            } else {
                Value::Null
            };
            json!({"id": id, "object": "chat.completion", "created": now(), "model": st.model_id, "choices": [choice]})
        }
        Kind::Completion => {
            let logprobs = plan.logprobs.map(|_| json!({ "content": c.logprobs }));
            json!({"id": id, "object": "text_completion", "created": now(), "model": st.model_id,
                   "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}]})
        }
    };
    body["usage"] = usage(started, &finished);
    if !finished.warnings.is_empty() {
        body["warnings"] = json!(finished.warnings);
    }
    Json(body).into_response()
}

/// The final chunk's JSON (no delta, a finish reason).
fn chunk_json(plan: &Plan, id: &str, created: u64, model: &str, reason: &str) -> String {
    match plan.kind {
        Kind::Chat => {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": reason, "logprobs": null}]})
        }
        Kind::Completion => {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": "", "finish_reason": reason, "logprobs": null}]})
        }
    }
    .to_string()
}

fn stream(
    st: Arc<AppState>,
    plan: Plan,
    mut rx: UnboundedReceiver<Event>,
    started: Started,
    cancel: Arc<AtomicBool>,
) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    let (out, events) = unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let id = request_id(plan.kind);
        let created = now();
        let model = st.model_id.clone();
        let chunk = |delta: Value, reason: Option<&str>, logprobs: Option<Value>| -> SseEvent {
            let body = match plan.kind {
                Kind::Chat => {
                    json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": logprobs}]})
                }
                Kind::Completion => {
                    json!({"id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")), "finish_reason": reason, "logprobs": logprobs}]})
                }
            };
            SseEvent::default().data(body.to_string())
        };
        let mut c = Collector::new(&st.engine, &plan, cancel);
        // Tool calls are parsed from the whole text: with tools, content is sent at the end.
        let buffer_all = plan.chat.as_ref().is_some_and(ChatPlan::parses_tools);
        let mut held = String::new();
        if plan.kind == Kind::Chat
            && out
                .send(Ok(chunk(
                    json!({"role": "assistant", "content": ""}),
                    None,
                    None,
                )))
                .is_err()
        {
            return;
        }
        let finished = loop {
            match rx.recv().await {
                Some(Event::Token(e)) => {
                    let before = c.logprobs.len();
                    let piece = c.push(&e);
                    let lp = (c.want_logprobs && c.logprobs.len() > before)
                        .then(|| json!({"content": c.logprobs[before..].to_vec()}));
                    if buffer_all {
                        held += &piece;
                        continue;
                    }
                    if (!piece.is_empty() || lp.is_some())
                        && out
                            .send(Ok(chunk(json!({ "content": piece }), None, lp)))
                            .is_err()
                    {
                        return; // the client left: dropping `rx` cancels the request
                    }
                }
                Some(Event::Done(f)) => break f,
                Some(Event::Error(msg)) => {
                    let _ = out.send(Ok(SseEvent::default().data(json!({"error": {"message": msg, "type": "server_error", "param": null, "code": null}}).to_string())));
                    return;
                }
                Some(Event::Started { .. }) | Some(Event::Refused { .. }) => {}
                None => return,
            }
        };
        let rest = c.stops.finish();
        let mut reason = finish_reason(&finished, &c.stops);
        if buffer_all {
            held += &rest;
            let raw = raw_text(&st.engine, plan.chat.as_ref(), &finished);
            let (message, r) = chat::message(plan.chat.as_ref(), &held, &raw, reason);
            reason = r;
            let mut delta = message;
            delta.as_object_mut().map(|o| o.remove("role"));
            if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for (i, call) in calls.iter_mut().enumerate() {
                    call["index"] = json!(i);
                }
            }
            let _ = out.send(Ok(chunk(delta, None, None)));
        } else if !rest.is_empty() {
            let _ = out.send(Ok(chunk(json!({ "content": rest }), None, None)));
        }
        if let Some(v) = &finished.violation {
            let _ = out.send(Ok(SseEvent::default().data(json!({"error": {"message": v, "type": "invalid_response_error", "param": null, "code": "schema_violation"}}).to_string())));
            return;
        }
        let _ = out.send(Ok(if finished.warnings.is_empty() {
            chunk(json!({}), Some(reason), None)
        } else {
            // What the schema's conversion ignored or relaxed, as the whole answer says it.
            let mut last: Value =
                serde_json::from_str(&chunk_json(&plan, &id, created, &model, reason))
                    .unwrap_or_default();
            last["warnings"] = json!(finished.warnings);
            SseEvent::default().data(last.to_string())
        }));
        if plan.include_usage {
            let body = json!({"id": id, "object": if plan.kind == Kind::Chat {"chat.completion.chunk"} else {"text_completion"},
                "created": created, "model": model, "choices": [], "usage": usage(started, &finished)});
            let _ = out.send(Ok(SseEvent::default().data(body.to_string())));
        }
        let _ = out.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Sse::new(tokio_stream::wrappers::UnboundedReceiverStream::new(events))
        .keep_alive(KeepAlive::default())
}
