//! Shared by the server test binaries: a tiny random-weight chat model (synthetic OLMoE
//! with the demo model's tokenizer and chat template), the real server on an ephemeral
//! port, and a real HTTP client.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use coli_models::experts::{CacheSize, Placement};
use coli_models::Engine;
use coli_server::{ServeConfig, Server};
use serde_json::{json, Value};

pub fn model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("coli-server-test-{}", std::process::id()));
        if !dir.join("config.json").is_file() {
            coli_tests::synthetic::write_chat_model(&dir).expect("chat model");
        }
        dir
    })
}

pub fn engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        // One cached expert per layer: every step reads experts through the store.
        let p = Placement {
            cache: CacheSize::Slots(1),
            ..Placement::default()
        };
        Arc::new(Engine::open(model_dir(), &p).expect("engine"))
    })
    .clone()
}

pub fn start(cfg: ServeConfig) -> Server {
    Server::start(
        engine(),
        ServeConfig {
            port: 0,
            ctx: 512,
            ..cfg
        },
    )
    .expect("server starts")
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

/// POSTs JSON; returns the status and the parsed body.
pub fn post(s: &Server, path: &str, body: &Value) -> (u16, Value) {
    post_with(s, path, &body.to_string(), &[])
}

pub fn post_with(s: &Server, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = agent()
        .post(format!("http://{}{path}", s.addr()))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut resp = req.send(body).expect("request");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub fn get(s: &Server, path: &str) -> (u16, String) {
    let mut resp = agent()
        .get(format!("http://{}{path}", s.addr()))
        .call()
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().expect("body"))
}

/// A streamed request's `data:` payloads, up to `[DONE]`.
pub fn stream(s: &Server, path: &str, body: &Value) -> Vec<Value> {
    let resp = agent()
        .post(format!("http://{}{path}", s.addr()))
        .header("content-type", "application/json")
        .send(body.to_string())
        .expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    let reader = BufReader::new(resp.into_body().into_reader());
    let mut out = Vec::new();
    for line in reader.lines() {
        let line = line.expect("line");
        if let Some(data) = line.strip_prefix("data: ") {
            if data == "[DONE]" {
                return out;
            }
            out.push(serde_json::from_str(data).expect("chunk is JSON"));
        }
    }
    panic!("the stream ended without [DONE]");
}

pub fn chat_body(content: &str, extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 24,
                       "temperature": 1.0, "seed": 3, "ignore_eos": true});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

pub fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn metric(s: &Server, name: &str) -> f64 {
    let (_, text) = get(s, "/metrics");
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}
