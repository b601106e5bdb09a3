//! Structured output and tools through the real server: schema output and the per-slot
//! compile cache, required tool calls constrained by their schemas, and a model whose own
//! template renders tools (Qwen3's) answering in its own call syntax.

use std::sync::{Arc, OnceLock};

use crate::common::*;
use coli_models::experts::Placement;
use coli_models::Engine;
use coli_server::{ServeConfig, Server};
use serde_json::{json, Value};

#[test]
fn structured_output_validates_and_the_slot_cache_hits_on_a_resent_schema() {
    let s = start(ServeConfig::default());
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]});
    let body = |turn: &str| {
        chat_body(
            turn,
            json!({"max_tokens": 120, "ignore_eos": false, "temperature": 0.7,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}}}),
        )
    };
    let misses0 = metric(&s, "coli_grammar_cache_misses_total");
    let hits0 = metric(&s, "coli_grammar_cache_hits_total");
    let mut parsed = 0;
    for turn in ["Who?", "Who?"] {
        let (st, v) = post(&s, "/v1/chat/completions", &body(turn));
        assert_eq!(st, 200, "{v}");
        if v["choices"][0]["finish_reason"] == "stop" {
            let out: Value = serde_json::from_str(&content(&v)).expect("JSON output");
            assert!(out["name"].is_string() && out["age"].is_number(), "{out}");
            parsed += 1;
        }
    }
    assert!(parsed >= 1, "no output finished");
    // A keyword the schema language does not define is ignored, and said so, in both shapes.
    let odd = json!({"type": "object", "properties": {"n": {"type": "integer", "javaType": "Long"}}, "required": ["n"]});
    let b = chat_body(
        "n?",
        json!({"max_tokens": 40, "ignore_eos": false, "temperature": 0.0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": odd}}}),
    );
    let (st, v) = post(&s, "/v1/chat/completions", &b);
    assert_eq!(st, 200, "{v}");
    let warned = |w: &Value| {
        w.as_array().is_some_and(|w| {
            w.iter()
                .any(|m| m.as_str().unwrap_or("").contains("javaType"))
        })
    };
    assert!(warned(&v["warnings"]), "{v}");
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let chunks = stream(&s, "/v1/chat/completions", &sb);
    assert!(chunks.iter().any(|c| warned(&c["warnings"])), "{chunks:?}");
    // Each schema compiled once per slot, then hit.
    assert_eq!(metric(&s, "coli_grammar_cache_misses_total") - misses0, 2.0);
    assert_eq!(metric(&s, "coli_grammar_cache_hits_total") - hits0, 2.0);
    s.stop().unwrap();
}

/// Grammar-forced and prompt-lookup drafts in the slots: the answers (text, usage, log
/// probabilities) are those of a server that drafts nothing, and `/metrics` counts the
/// drafts the slots proposed and accepted.
#[test]
fn slot_drafts_change_speed_only() {
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "tags": {"type": "array", "items": {"enum": ["alpha", "beta"]}, "maxItems": 3}}, "required": ["name", "tags"]});
    let bodies = [
        chat_body(
            "Who?",
            json!({"max_tokens": 80, "ignore_eos": false, "temperature": 0.0, "logprobs": true, "top_logprobs": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}),
        ),
        chat_body(
            "say it again: one two three one two three one two three",
            json!({"max_tokens": 30, "ignore_eos": true, "temperature": 0.9, "seed": 5}),
        ),
    ];
    let answers = |cfg: ServeConfig| {
        let s = start(cfg);
        let out: Vec<(Value, u64)> = bodies
            .iter()
            .map(|b| {
                let (st, mut v) = post(&s, "/v1/chat/completions", b);
                assert_eq!(st, 200, "{v}");
                for volatile in ["id", "created"] {
                    v.as_object_mut().expect("an object").remove(volatile);
                }
                // Drafts are reported per request; the rest of the answer must not move.
                let details = v["usage"]
                    .as_object_mut()
                    .expect("usage")
                    .remove("completion_tokens_details")
                    .expect("completion_tokens_details");
                (
                    v,
                    details["accepted_prediction_tokens"]
                        .as_u64()
                        .expect("a count"),
                )
            })
            .collect();
        let drafts = (
            metric(&s, "coli_draft_tokens_proposed_total"),
            metric(&s, "coli_draft_tokens_accepted_total"),
        );
        s.stop().unwrap();
        (out, drafts)
    };
    let (plain, none) = answers(ServeConfig {
        drafts: coli_server::ServeDrafts::off(),
        ..ServeConfig::default()
    });
    let (drafted, (proposed, accepted)) = answers(ServeConfig::default());
    assert_eq!(none, (0.0, 0.0), "a server with drafts off drafted");
    for ((d, _), (p, zero)) in drafted.iter().zip(&plain) {
        assert_eq!(d, p, "drafts changed an answer");
        assert_eq!(*zero, 0, "an answer without drafts reports accepted drafts");
    }
    let per_request: u64 = drafted.iter().map(|(_, k)| k).sum();
    assert_eq!(per_request as f64, accepted, "usage vs /metrics");
    assert!(
        accepted > 0.0 && accepted <= proposed,
        "{accepted} of {proposed} drafts accepted"
    );
}

#[test]
fn a_required_tool_call_parses_and_its_arguments_validate() {
    let s = start(ServeConfig::default());
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
    ]);
    let mut checked = 0;
    for (seed, choice) in [
        (1, json!("required")),
        (2, json!("required")),
        (3, json!({"type": "function", "function": {"name": "add"}})),
    ] {
        let body = chat_body(
            "What is the weather in Paris?",
            json!({"tools": tools, "tool_choice": choice, "max_tokens": 200, "ignore_eos": false, "seed": seed}),
        );
        let (st, v) = post(&s, "/v1/chat/completions", &body);
        assert_eq!(st, 200, "{v}");
        let choice0 = &v["choices"][0];
        if choice0["finish_reason"] == "length" {
            continue; // cut: incomplete, and said so
        }
        assert_eq!(choice0["finish_reason"], "tool_calls", "{v}");
        let call = &choice0["message"]["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
        let name = call["function"]["name"].as_str().unwrap();
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
            .expect("arguments parse");
        // Validated by an independent validator against the function's own schema.
        let params = tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == name)
            .unwrap_or_else(|| panic!("unknown tool {name}"))["function"]["parameters"]
            .clone();
        let validator = coli_grammar::schema::jsonschema_validator(&params, None, false).unwrap();
        assert!(validator.is_valid(&args), "{name}: {args} breaks {params}");
        if seed == 3 {
            assert_eq!(name, "add");
        }
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} calls finished");
    // A tool result goes back into the next turn through the template.
    let (st, v) = post(
        &s,
        "/apply-template",
        &json!({"messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"C\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}
        ]}),
    );
    assert_eq!(st, 200, "{v}");
    let prompt = v["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("18 degrees") && prompt.contains("Paris"),
        "{prompt}"
    );
    s.stop().unwrap();
}

/// The chat model with Qwen3's real chat template: tools go through the template and the
/// answer is read back in Qwen3's own call syntax.
fn qwen3_style_engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        let dir = model_dir().with_extension("qwen3");
        std::fs::create_dir_all(&dir).unwrap();
        for f in std::fs::read_dir(model_dir()).unwrap() {
            let f = f.unwrap();
            if f.file_type().unwrap().is_file() {
                std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
            }
        }
        let template =
            std::fs::read_to_string(coli_tests::fixtures_dir().join("chat_templates/qwen3.jinja"))
                .unwrap();
        let cfg_path = dir.join("tokenizer_config.json");
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["chat_template"] = json!(template);
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        Arc::new(Engine::open(&dir, &Placement::default()).expect("engine"))
    })
    .clone()
}

#[test]
fn native_tool_calls_through_the_models_own_template_and_syntax() {
    let s = Server::start(
        qwen3_style_engine(),
        ServeConfig {
            port: 0,
            ctx: 1024,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let tools = json!([{"type": "function", "function": {"name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]);
    // The tools are rendered by the template itself (Qwen3's <tools> block).
    let (st, v) = post(
        &s,
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "1+2?"}], "tools": tools}),
    );
    assert_eq!(st, 200, "{v}");
    let prompt = v["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("<tools>") && prompt.contains("\"name\": \"add\""),
        "{prompt}"
    );
    // A model answering in Qwen3's syntax (forced here by a grammar: the weights are
    // random) gets its call read back into tool_calls, streamed or not.
    let grammar = r#"root ::= "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>""#;
    let body = chat_body(
        "What is 1+2?",
        json!({"tools": tools, "grammar": grammar, "max_tokens": 80, "ignore_eos": false}),
    );
    let (st, v) = post(&s, "/v1/chat/completions", &body);
    assert_eq!(st, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(
        choice["message"]["content"].as_str().map(str::trim),
        Some("Let me add.")
    );
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "add");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"a": 1, "b": 2}));
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = stream(&s, "/v1/chat/completions", &sb);
    let delta_calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"].get("tool_calls"))
        .collect();
    assert_eq!(delta_calls.len(), 1, "{chunks:?}");
    assert_eq!(delta_calls[0][0]["function"]["name"], "add");
    assert_eq!(delta_calls[0][0]["index"], 0);
    let last = chunks
        .iter()
        .rev()
        .find(|c| {
            c["choices"]
                .get(0)
                .is_some_and(|c| !c["finish_reason"].is_null())
        })
        .unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    // The call and its result go back through the template on the next turn.
    let (st, v) = post(
        &s,
        "/apply-template",
        &json!({"messages": [
        {"role": "user", "content": "What is 1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}], "tools": tools}),
    );
    assert_eq!(st, 200, "{v}");
    let prompt = v["prompt"].as_str().unwrap();
    assert!(
        prompt.contains(
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"
        ),
        "{prompt}"
    );
    assert!(
        prompt.contains("<tool_response>\n3\n</tool_response>"),
        "{prompt}"
    );
    s.stop().unwrap();
}
