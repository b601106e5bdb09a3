//! Edge cases of each reader, and the property that `parse` never panics (arbitrary
//! text, and valid calls cut, spliced and duplicated). The round trip through the real
//! templates is `tests/tests/suite/tool_calls.rs`.

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn calls(out: &ParsedOutput) -> Vec<(&str, &str)> {
    out.tool_calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect()
}

/// One valid output per format, as the model writes it.
const VALID: [(ToolCallFormat, &str); 9] = [
    (
        ToolCallFormat::Hermes,
        "<think>\nplan\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
    ),
    (
        ToolCallFormat::DeepSeekV31,
        "plan</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    (
        ToolCallFormat::DeepSeekV32,
        "plan</think>Sure.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    ),
    (
        ToolCallFormat::KimiK2,
        "<think>plan</think>Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>",
    ),
    (
        ToolCallFormat::Glm45,
        "\n<think>plan</think>\nSure.\n<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
    ),
    (
        ToolCallFormat::GptOss,
        "<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>",
    ),
    (
        ToolCallFormat::MiniMaxM2,
        "plan\n</think>\n\nSure.\n<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">1</parameter>\n</invoke>\n</minimax:tool_call>",
    ),
    (ToolCallFormat::Llama3Json, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}"),
    (ToolCallFormat::Generic, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]}"),
];

#[test]
fn each_format_reads_its_own_call() {
    for (format, text) in VALID {
        let out = parse(format, text);
        assert_eq!(calls(&out), [("f", r#"{"a":1}"#)], "{format:?}");
        let has_prose = !matches!(format, ToolCallFormat::Llama3Json | ToolCallFormat::Generic);
        if has_prose {
            assert_eq!(out.reasoning.as_deref(), Some("plan"), "{format:?}");
        }
        if has_prose && format != ToolCallFormat::GptOss {
            assert_eq!(out.content, "Sure.", "{format:?}");
        }
    }
}

#[test]
fn malformed_calls_stay_in_the_content() {
    let bad = "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> bye";
    let out = parse(ToolCallFormat::Hermes, bad);
    assert!(out.tool_calls.is_empty());
    assert_eq!(out.content, bad.trim());
    // A good call next to a bad one is still read.
    let mixed = format!("{bad}<tool_call>{{\"name\": \"g\", \"arguments\": \"{{}}\"}}</tool_call>");
    assert_eq!(calls(&parse(ToolCallFormat::Hermes, &mixed)), [("g", "{}")]);
    // Arguments that are not an object are not a call.
    let out = parse(
        ToolCallFormat::Llama3Json,
        r#"{"name": "f", "parameters": [1]}"#,
    );
    assert!(out.tool_calls.is_empty());
    assert_eq!(out.content, r#"{"name": "f", "parameters": [1]}"#);
    // An unclosed GLM/MiniMax/DSML parameter list is not guessed at.
    let cut = "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">1";
    let out = parse(ToolCallFormat::MiniMaxM2, cut);
    assert!(out.tool_calls.is_empty());
    assert_eq!(out.content, cut);
}

#[test]
fn text_without_calls_is_content() {
    for format in ToolCallFormat::ALL {
        let out = parse(format, "  The answer is 4.\n");
        assert_eq!(out.content, "The answer is 4.", "{format:?}");
        assert!(
            out.tool_calls.is_empty() && out.reasoning.is_none(),
            "{format:?}"
        );
    }
    assert_eq!(
        parse(ToolCallFormat::Generic, r#"{"response": "Hello"}"#).content,
        "Hello"
    );
    // Reasoning cut short (no </think>) is reasoning, not content.
    let out = parse(ToolCallFormat::Hermes, "<think>\nstill going");
    assert_eq!(
        (out.reasoning.as_deref(), out.content.as_str()),
        (Some("still going"), "")
    );
}

#[test]
fn several_calls_and_variants() {
    let text =
        "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"x\": \"y\"}}";
    assert_eq!(
        calls(&parse(ToolCallFormat::Llama3Json, text)),
        [("a", "{}"), ("b", r#"{"x":"y"}"#)]
    );
    // DeepSeek-V3/R1's older spelling.
    let old = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(
        calls(&parse(ToolCallFormat::DeepSeekV31, old)),
        [("f", r#"{"a":1}"#)]
    );
    // harmony with the recipient before the channel, and the call token cut by the stop.
    let oss = "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"a\": 1}";
    assert_eq!(
        calls(&parse(ToolCallFormat::GptOss, oss)),
        [("f", r#"{"a":1}"#)]
    );
    let final_answer =
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>Done.";
    let out = parse(ToolCallFormat::GptOss, final_answer);
    assert_eq!(
        (out.content.as_str(), out.reasoning.as_deref()),
        ("Done.", Some("x"))
    );
    // Kimi ids without the functions. prefix.
    let kimi = "<|tool_calls_section_begin|><|tool_call_begin|>f:3<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
    assert_eq!(calls(&parse(ToolCallFormat::KimiK2, kimi)), [("f", "{}")]);
}

/// Bare values of the XML-like formats are strings when the tool's schema says so.
#[test]
fn declared_string_arguments_stay_strings() {
    let tools = [
        json!({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}}}}}),
    ];
    let text = "<tool_call>f<arg_key>zip</arg_key><arg_value>75001</arg_value><arg_key>n</arg_key><arg_value>2</arg_value></tool_call>";
    assert_eq!(
        calls(&parse_with_tools(ToolCallFormat::Glm45, text, Some(&tools))),
        [("f", r#"{"zip":"75001","n":2}"#)]
    );
    assert_eq!(
        calls(&parse(ToolCallFormat::Glm45, text)),
        [("f", r#"{"zip":75001,"n":2}"#)]
    );
}

#[test]
fn templates_are_detected_by_their_markers() {
    use ToolCallFormat::*;
    for (template, want) in [
        (None, Generic),
        (Some("{{ messages }}"), Generic),
        (
            Some("'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'"),
            DeepSeekV31,
        ),
        (
            Some("<{{ dsml_token }}function_calls> set dsml_token = \"｜DSML｜\""),
            DeepSeekV32,
        ),
        (Some("<|im_system|>tool_declare<|im_middle|>"), KimiK2),
        (Some("<tool_call>{{ name }}<arg_key>"), Glm45),
        (Some("'<minimax:tool_call>'"), MiniMaxM2),
        (Some("<|start|>assistant to=functions."), GptOss),
        (Some("<tool_call>\\n{\"name\": "), Hermes),
        (Some("<|start_header_id|> '\"parameters\": '"), Llama3Json),
    ] {
        assert_eq!(ToolCallFormat::detect(template), want, "{template:?}");
    }
    for format in ToolCallFormat::ALL {
        let (_, text) = VALID.iter().find(|(f, _)| *f == format).unwrap();
        let prefix = format.call_prefix();
        // Llama and generic outputs start with the prefix; the others contain it.
        assert!(
            text.contains(prefix.trim_end_matches('.')),
            "{format:?}: {prefix}"
        );
    }
}

/// Pieces the readers look for, so random text hits their branches.
const MARKERS: [&str; 28] = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "{\"name\": \"f\", ",
    "\"arguments\": ",
    "{\"a\": 1}",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<｜DSML｜invoke name=\"",
    "</｜DSML｜invoke>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<arg_key>",
    "</arg_value>",
    "<|channel|>",
    "<|message|>",
    "to=functions.",
    "<|start|>",
    "<invoke name=\"",
    "<parameter name=\"",
    "</minimax:tool_call>",
    "\"",
    ";",
];

fn mutate(text: &str, edits: &[(usize, usize, usize)]) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for &(op, at, what) in edits {
        let at = at % (s.len() + 1);
        match op % 3 {
            0 if at < s.len() => {
                s.remove(at);
            }
            1 => {
                let m: Vec<char> = MARKERS[what % MARKERS.len()].chars().collect();
                s.splice(at..at, m);
            }
            _ => s.truncate(at),
        }
    }
    s.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parse_never_panics_on_arbitrary_text(pieces in prop::collection::vec(
        prop_oneof![prop::sample::select(MARKERS.to_vec()).prop_map(str::to_string), "\\PC{0,6}"],
        0..24,
    )) {
        let text = pieces.concat();
        for format in ToolCallFormat::ALL {
            let out = parse(format, &text);
            for c in &out.tool_calls {
                prop_assert!(serde_json::from_str::<serde_json::Value>(&c.arguments).unwrap().is_object());
            }
        }
    }

    #[test]
    fn parse_never_panics_on_mutated_calls(
        which in 0usize..VALID.len(),
        edits in prop::collection::vec((0usize..3, 0usize..400, 0usize..64), 1..6),
    ) {
        let text = mutate(VALID[which].1, &edits);
        for f in ToolCallFormat::ALL {
            let out = parse(f, &text);
            for c in &out.tool_calls {
                prop_assert!(!c.name.is_empty());
                prop_assert!(serde_json::from_str::<serde_json::Value>(&c.arguments).unwrap().is_object());
            }
        }
    }
}
