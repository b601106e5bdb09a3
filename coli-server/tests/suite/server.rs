//! The real server on an ephemeral port, over a tiny random-weight chat model, driven by a
//! real HTTP client: protocol, scheduling, security, templates, metrics and KV files.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;
use coli_server::ServeConfig;
use serde_json::{json, Value};

#[test]
fn streaming_equals_non_streaming_and_usage_is_reported() {
    let s = start(ServeConfig::default());
    let body = chat_body(
        "Tell me a story.",
        json!({"stream_options": {"include_usage": true}}),
    );
    let (status, whole) = post(&s, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{whole}");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = stream(&s, "/v1/chat/completions", &sb);
    let streamed: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"].get(0)?["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, content(&whole));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let last_choice = chunks
        .iter()
        .rev()
        .find(|c| !c["choices"].as_array().unwrap().is_empty())
        .unwrap();
    assert_eq!(
        last_choice["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 24);
    assert_eq!(
        usage["completion_tokens"],
        whole["usage"]["completion_tokens"]
    );
    assert_eq!(usage["prompt_tokens"], whole["usage"]["prompt_tokens"]);
    // The same prompt again: the slot holds it, all but its last token is reused.
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        prompt - 1
    );
    s.stop().unwrap();
}

#[test]
fn concurrent_requests_equal_serial_ones_byte_for_byte() {
    let s = start(ServeConfig {
        slots: 4,
        ..ServeConfig::default()
    });
    let bodies: Vec<Value> = (0..6)
        .map(|i| {
            let mut b = chat_body(
                &format!("Question number {i}: what is {i} + {i}?"),
                json!({"seed": i, "logprobs": true, "top_logprobs": 2}),
            );
            b["max_tokens"] = json!(16 + 4 * i);
            if i % 3 == 0 {
                b["temperature"] = json!(0.0);
            }
            b
        })
        .collect();
    let serial: Vec<Value> = bodies
        .iter()
        .map(|b| post(&s, "/v1/chat/completions", b).1)
        .collect();
    let rows_before = metric(&s, "coli_batch_rows_total");
    let steps_before = metric(&s, "coli_batch_steps_total");
    let concurrent: Vec<Value> = std::thread::scope(|sc| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| sc.spawn(|| post(&s, "/v1/chat/completions", b).1))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in serial.iter().zip(&concurrent).enumerate() {
        assert_eq!(content(a), content(b), "request {i}: text");
        assert_eq!(
            a["choices"][0]["logprobs"], b["choices"][0]["logprobs"],
            "request {i}: logprobs"
        );
        assert_eq!(
            a["usage"]["completion_tokens"],
            b["usage"]["completion_tokens"]
        );
    }
    // The requests really were decoded together: more rows than steps.
    let rows = metric(&s, "coli_batch_rows_total") - rows_before;
    let steps = metric(&s, "coli_batch_steps_total") - steps_before;
    assert!(rows > steps * 1.5, "mean batch {}", rows / steps);
    s.stop().unwrap();
}

#[test]
fn a_full_queue_answers_429_and_a_disconnect_frees_the_slot() {
    let s = start(ServeConfig {
        slots: 1,
        queue: 0,
        ..ServeConfig::default()
    });
    let mut long = chat_body("Go on for ever.", json!({"stream": true}));
    long["max_tokens"] = json!(400);
    let resp = agent()
        .post(format!("http://{}/v1/chat/completions", s.addr()))
        .send(long.to_string())
        .unwrap();
    let mut reader = BufReader::new(resp.into_body().into_reader());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("data: "), "{line}");
    let (status, err) = post(&s, "/v1/chat/completions", &chat_body("Me too", json!({})));
    assert_eq!(status, 429, "{err}");
    assert_eq!(err["error"]["type"], "rate_limit_error");
    drop(reader); // the client goes away mid-answer
    let t0 = Instant::now();
    while metric(&s, "coli_slots_busy") > 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the slot was never freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, ok) = post(&s, "/v1/chat/completions", &chat_body("Now me", json!({})));
    assert_eq!(status, 200, "{ok}");
    // The cancelled request did not run to its 400 tokens.
    assert!(metric(&s, "coli_generation_tokens_total") < 400.0 + 24.0);
    s.stop().unwrap();
}

#[test]
fn api_key_and_host_guard() {
    let s = start(ServeConfig {
        api_key: Some("sekret".into()),
        allow_hosts: vec!["coli.example".into()],
        ..ServeConfig::default()
    });
    let body = chat_body("hi", json!({"max_tokens": 2}));
    let (status, err) = post(&s, "/v1/chat/completions", &body);
    assert_eq!(status, 401);
    assert_eq!(err["error"]["type"], "authentication_error");
    let (status, _) = post_with(
        &s,
        "/v1/chat/completions",
        &body.to_string(),
        &[("authorization", "Bearer wrong")],
    );
    assert_eq!(status, 401);
    let (status, _) = post_with(
        &s,
        "/v1/chat/completions",
        &body.to_string(),
        &[("authorization", "Bearer sekret")],
    );
    assert_eq!(status, 200);
    assert_eq!(get(&s, "/health").0, 200, "health needs no key");
    // Raw requests, to set the Host header freely.
    let raw = |host: &str| -> u16 {
        let mut c = TcpStream::connect(s.addr()).unwrap();
        write!(c, "GET /v1/models HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer sekret\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        text.split(' ').nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(raw("evil.example"), 403);
    assert_eq!(raw("evil.example:80"), 403);
    assert_eq!(raw(&format!("localhost:{}", s.addr().port())), 200);
    assert_eq!(raw("127.0.0.1"), 200);
    assert_eq!(raw("coli.example:443"), 200);
    // No CORS headers unless asked for.
    let mut c = TcpStream::connect(s.addr()).unwrap();
    write!(c, "GET /health HTTP/1.1\r\nHost: localhost\r\nOrigin: http://a.example\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    assert!(
        !text
            .to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{text}"
    );
    s.stop().unwrap();
    let s = start(ServeConfig {
        cors_origin: Some("http://a.example".into()),
        api_key: Some("sekret".into()),
        ..ServeConfig::default()
    });
    let mut c = TcpStream::connect(s.addr()).unwrap();
    write!(c, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: http://a.example\r\nAccess-Control-Request-Method: POST\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let lower = text.to_ascii_lowercase();
    assert!(text.starts_with("HTTP/1.1 204"), "{text}");
    assert!(
        lower.contains("access-control-allow-origin: http://a.example"),
        "{text}"
    );
    assert!(
        lower.contains("access-control-allow-headers: authorization, content-type"),
        "{text}"
    );
    s.stop().unwrap();
}

#[test]
fn bad_bodies_get_openai_errors() {
    let s = start(ServeConfig {
        body_limit: 4000,
        ..ServeConfig::default()
    });
    let check = |body: &str, status: u16, needle: &str| {
        let (st, v) = post_with(&s, "/v1/chat/completions", body, &[]);
        assert_eq!(st, status, "{body}: {v}");
        let msg = v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("error shape: {v}"));
        assert!(msg.contains(needle), "{body}: {msg}");
        assert!(
            v["error"].get("type").is_some()
                && v["error"].get("param").is_some()
                && v["error"].get("code").is_some()
        );
        v
    };
    check("{not json", 400, "invalid request body");
    check(r#"{"messages": "hi"}"#, 400, "invalid type");
    check(r#"{"max_tokens": 3}"#, 400, "messages");
    check(r#"{"messages": []}"#, 400, "empty");
    check(
        r#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
        400,
        "unknown role",
    );
    let v = check(
        r#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#,
        400,
        "n must be 1",
    );
    assert_eq!(v["error"]["param"], "n");
    check(
        r#"{"messages": [{"role": "user", "content": "x"}], "temperature": 9}"#,
        400,
        "temperature",
    );
    check(
        r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}"#,
        400,
        "logprobs",
    );
    check(
        r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}"#,
        400,
        "response_format",
    );
    let big = format!(
        r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "x".repeat(6000)
    );
    let (st, _) = post_with(&s, "/v1/chat/completions", &big, &[]);
    assert_eq!(st, 413);
    // A schema keyword coli cannot honour is a 400 naming it.
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        &chat_body(
            "x",
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}}),
        ),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "response_format");
    // A prompt longer than the context is refused; max_tokens beyond it is clamped.
    let long = "word ".repeat(600);
    let (st, v) = post(&s, "/v1/chat/completions", &chat_body(&long, json!({})));
    assert_eq!(st, 400);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        &chat_body("x", json!({"max_tokens": 100000})),
    );
    assert_eq!(st, 200);
    let used = v["usage"]["total_tokens"].as_u64().unwrap();
    assert!(used <= 512, "{used}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    s.stop().unwrap();
}

#[test]
fn template_tokenize_detokenize_models_and_metrics() {
    let s = start(ServeConfig::default());
    let msgs =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]);
    let (st, v) = post(&s, "/apply-template", &json!({"messages": msgs}));
    assert_eq!(st, 200);
    let e = engine();
    let tok = e.tokenizer().unwrap();
    let want = tok
        .apply_chat_template(
            &[
                coli_models::tokenizer::ChatMessage::new("system", "Be brief."),
                coli_models::tokenizer::ChatMessage::new("user", "Hi"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(v["prompt"], want);
    let (_, ids) = post(&s, "/tokenize", &json!({"content": "naïve café"}));
    let (_, text) = post(&s, "/detokenize", &json!({"tokens": ids["tokens"]}));
    assert_eq!(text["content"], "naïve café");
    let (st, _) = post(&s, "/detokenize", &json!({"tokens": [99999999]}));
    assert_eq!(st, 400);
    let (st, models) = get(&s, "/v1/models");
    assert_eq!(st, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["object"], "model");
    // A completion from token ids.
    let (st, v) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": true, "temperature": 0}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    // The gateway protocol's gauges, by name and type.
    let (_, text) = get(&s, "/metrics");
    for (name, kind) in [
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:num_requests_running", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:cache_config_info", "gauge"),
        ("coli_requests_total", "counter"),
        ("coli_generation_tokens_total", "counter"),
        ("coli_queue_depth", "gauge"),
        ("coli_expert_hit_rate", "gauge"),
        ("coli_expert_disk_bytes_per_token", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind}"
        );
    }
    assert!(text.contains("vllm:cache_config_info{block_size=\"1\""));
    let usage = metric(&s, "vllm:kv_cache_usage_perc");
    assert!(usage > 0.0 && usage <= 1.0, "{usage}");
    s.stop().unwrap();
}

#[test]
fn kv_slots_survive_a_restart() {
    let kv = tempfile::tempdir().unwrap();
    let cfg = ServeConfig {
        slots: 2,
        kv_dir: Some(kv.path().to_path_buf()),
        ..ServeConfig::default()
    };
    let first = chat_body("Remember the number 42.", json!({"temperature": 0.0}));
    let s = start(cfg.clone());
    let (_, a) = post(&s, "/v1/chat/completions", &first);
    s.stop().unwrap();
    assert!(
        std::fs::read_dir(kv.path()).unwrap().count() >= 1,
        "a slot file was written"
    );
    // The conversation continues after a restart.
    let mut next = first.clone();
    next["messages"] = json!([{"role": "user", "content": "Remember the number 42."},
                              {"role": "assistant", "content": content(&a)},
                              {"role": "user", "content": "Which number?"}]);
    let s = start(cfg.clone());
    let (_, resumed) = post(&s, "/v1/chat/completions", &next);
    s.stop().unwrap();
    let cached = resumed["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 20, "restored KV reused: {cached}");
    // Without the files: the same tokens, nothing cached.
    let s = start(ServeConfig {
        kv_dir: None,
        ..cfg.clone()
    });
    let (_, fresh) = post(&s, "/v1/chat/completions", &next);
    s.stop().unwrap();
    assert_eq!(content(&resumed), content(&fresh));
    assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // A corrupt file is ignored (warned about), never trusted.
    for f in std::fs::read_dir(kv.path()).unwrap() {
        let p = f.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xFF;
        std::fs::write(&p, bytes).unwrap();
    }
    let s = start(cfg);
    let (_, after) = post(&s, "/v1/chat/completions", &next);
    s.stop().unwrap();
    assert_eq!(after["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(content(&after), content(&fresh));
}

#[test]
fn an_evicted_conversation_comes_back_from_the_kv_dir() {
    let kv = tempfile::tempdir().unwrap();
    let turn = |history: &[(&str, String)], next: &str| {
        let mut msgs: Vec<Value> = history
            .iter()
            .flat_map(|(q, a)| {
                [
                    json!({"role": "user", "content": q}),
                    json!({"role": "assistant", "content": a}),
                ]
            })
            .collect();
        msgs.push(json!({"role": "user", "content": next}));
        let mut b = chat_body(next, json!({"temperature": 0.0}));
        b["messages"] = json!(msgs);
        b
    };
    let run = |kv_dir: Option<PathBuf>| {
        // One slot: conversation B evicts A; A's second turn then needs its KV back.
        let s = start(ServeConfig {
            slots: 1,
            kv_dir,
            ..ServeConfig::default()
        });
        let (_, a1) = post(
            &s,
            "/v1/chat/completions",
            &turn(&[], "Conversation A begins here."),
        );
        let (_, _b1) = post(
            &s,
            "/v1/chat/completions",
            &turn(&[], "Something else entirely, B."),
        );
        let a2_body = turn(
            &[("Conversation A begins here.", content(&a1))],
            "And A goes on.",
        );
        let (_, a2) = post(&s, "/v1/chat/completions", &a2_body);
        s.stop().unwrap();
        a2
    };
    let with = run(Some(kv.path().to_path_buf()));
    let without = run(None);
    assert_eq!(
        content(&with),
        content(&without),
        "restored KV, same tokens"
    );
    let cached = with["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let plain = without["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > plain + 5,
        "A's KV came back from disk: {cached} vs {plain}"
    );
}
