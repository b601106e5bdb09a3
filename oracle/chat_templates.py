#!/usr/bin/env python3
"""Records how `transformers` renders real chat templates, for coli's byte-exact test.

For every template under tests/fixtures/chat_templates/ and a fixed set of
conversations (system prompts, several turns, tools, assistant tool calls with
arguments as a JSON string and as an object, tool results, reasoning), with and
without the generation prompt, this calls transformers' own rendering path
(`render_jinja_template`, what `apply_chat_template` uses) with the special
tokens the model's tokenizer would pass, and writes
tests/fixtures/chat_templates/expected.json. A case where transformers raises is
recorded as an expected error: coli must refuse it too.

The clock is pinned (`strftime_now` sees NOW) so the output does not depend on
the day it was recorded.

    python3 -m venv oracle/.venv
    oracle/.venv/bin/pip install transformers==4.57.1 jinja2==3.1.6
    oracle/.venv/bin/python oracle/chat_templates.py

The output is committed; the Rust test needs no Python.
"""
import copy
import datetime as _dt
import json
import os

import jinja2
import transformers
from transformers.utils import chat_template_utils
from transformers.utils.chat_template_utils import render_jinja_template

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "chat_templates")
NOW = _dt.datetime(2025, 3, 14, 9, 26, 53)


class _PinnedClock(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


# `strftime_now` calls `datetime.now()` through this module's global.
chat_template_utils.datetime = _PinnedClock

DEEPSEEK = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
# What each model's tokenizer passes as `special_tokens_map` (only the tokens it sets).
TEMPLATES = {
    "deepseek-v3.1": DEEPSEEK,
    "deepseek-v3.2": DEEPSEEK,
    "kimi-k2": {"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]"},
    "kimi-k2-thinking": {"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]"},
    "glm-4.5": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    "glm-4.6": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "gpt-oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
    "minimax-m2": {"bos_token": "]~!b[", "eos_token": "[e~[", "unk_token": "]!d~["},
    "llama-3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama-3.3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    # Not a model's: coli's probe of the jinja2/Python semantics templates use.
    "python-compat": {"bos_token": "<s>"},
    # The demo model (SmolLM2-135M-Instruct), as coli imports it from its GGUF.
    "smollm2": {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
    },
}

# Extra template kwargs each template reads (beyond the plain call).
EXTRA = {
    "deepseek-v3.1": [{"thinking": True}],
    "deepseek-v3.2": [{"enable_thinking": False}],
    "glm-4.5": [{"enable_thinking": False}],
    "glm-4.6": [{"enable_thinking": False}],
    "qwen3": [{"enable_thinking": False}, {"enable_thinking": True}],
    "gpt-oss": [
        {"reasoning_effort": "high", "model_identity": "You are a test model."},
        {"builtin_tools": ["browser", "python"]},
    ],
    "llama-3.2": [{"date_string": "01 Jan 2025"}, {"tools_in_user_message": False}],
    "llama-3.3": [
        {"tools_in_user_message": False},
        {"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]},
    ],
}
# Conversations the extra kwargs are tried on (all conversations get the plain call).
EXTRA_ON = {"single_user", "tools_user", "tool_call_dict_args", "reasoning_content", "system_multi_turn"}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris or Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the docs (returns <b>snippets</b> & links) — café ☕.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "limit": {"type": "integer", "description": "How many results", "default": 5},
                "tags": {"type": "array", "items": {"type": "string"}},
                "exact": {"type": "boolean"},
                "threshold": {"type": "number", "description": "Score cut-off"},
            },
            "required": ["query", "limit"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]
# Nested objects, unions, nullable and enum defaults (gpt-oss renders TypeScript types
# recursively from these), and a tool without parameters.
EVENT = {
    "type": "function",
    "function": {
        "name": "create_event",
        "description": "Create a calendar event.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "attendees": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"email": {"type": "string"}, "optional": {"type": "boolean"}},
                        "required": ["email"],
                    },
                },
                "when": {
                    "oneOf": [
                        {"type": "string", "description": "ISO date"},
                        {"type": "integer", "description": "Unix time"},
                    ]
                },
                "priority": {"type": "string", "enum": ["low", "high"], "default": "low"},
                "notes": {"type": ["string", "null"]},
                "scores": {"type": "array", "items": {"type": "number"}, "nullable": True},
                "meta": {"type": "object"},
            },
            "required": ["title", "when"],
        },
    },
}
PING = {"type": "function", "function": {"name": "ping", "description": "Check the service.", "parameters": {"type": "object", "properties": {}}}}

WEATHER_ARGS = {"city": "Paris", "unit": "celsius"}
SEARCH_ARGS = {
    "query": 'naïve "quoted" <tag> & co\nsecond line \\ done',
    "limit": 3,
    "tags": ["a", "b"],
    "exact": False,
    "threshold": 0.5,
    "extra": None,
    "nested": {"k": [1, 2.25, True]},
}
WEATHER_RESULT = '{"temperature": 18, "condition": "sunny"}'
SEARCH_RESULT = "1. Intro — see §2\n2. Usage"


def call(id, name, args, as_string):
    arguments = json.dumps(args, ensure_ascii=False, separators=(",", ":")) if as_string else args
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_call_conversation(as_string, content=""):
    return [
        {"role": "system", "content": "You are a helpful assistant with tools."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": [call("call_1", "get_weather", WEATHER_ARGS, as_string)]},
        {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
        {"role": "assistant", "content": "It is 18 °C and sunny in Paris."},
    ]


# (name, messages, tools)
CONVERSATIONS = [
    ("single_user", [{"role": "user", "content": "Hi there"}], None),
    (
        "system_multi_turn",
        [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
    ),
    (
        "multi_turn_ends_assistant",
        [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one."},
            {"role": "assistant", "content": "Green."},
        ],
        None,
    ),
    (
        "unicode_whitespace",
        [
            {"role": "system", "content": "\x1f  Be brief. \u3000\n"},
            {"role": "user", "content": "  Café ☕ 東京 — “quotes” 'single' \\ back\tslash\n\n"},
            {"role": "assistant", "content": "\nÇa va.\n"},
            {"role": "user", "content": "{{ not a template }} {% raw %}"},
        ],
        None,
    ),
    ("tools_user", [{"role": "user", "content": "What's the weather in Paris?"}], TOOLS),
    (
        "tools_system_user",
        [
            {"role": "system", "content": "You are a helpful assistant with tools."},
            {"role": "user", "content": "Search the docs for naïve Bayes."},
        ],
        TOOLS,
    ),
    ("tool_call_string_args", tool_call_conversation(True), TOOLS),
    ("tool_call_dict_args", tool_call_conversation(False), TOOLS),
    ("tool_call_null_content", tool_call_conversation(False, content=None), TOOLS),
    ("tool_call_text_content", tool_call_conversation(False, content="Let me check."), TOOLS),
    (
        "tool_call_pending",
        [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", WEATHER_ARGS, False)]},
            {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
        ],
        TOOLS,
    ),
    (
        "parallel_tool_calls",
        [
            {"role": "user", "content": "Weather in Paris, and search the docs."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("call_1", "get_weather", WEATHER_ARGS, False),
                    call("call_2", "search_docs", SEARCH_ARGS, False),
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
            {"role": "tool", "tool_call_id": "call_2", "content": SEARCH_RESULT},
            {"role": "assistant", "content": "Sunny, and the docs say: see §2."},
        ],
        TOOLS,
    ),
    (
        "parallel_tool_calls_string_args",
        [
            {"role": "user", "content": "Weather in Paris, and search the docs."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("call_1", "get_weather", WEATHER_ARGS, True),
                    call("call_2", "search_docs", SEARCH_ARGS, True),
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
            {"role": "tool", "tool_call_id": "call_2", "content": SEARCH_RESULT},
        ],
        TOOLS,
    ),
    (
        "reasoning_content",
        [
            {"role": "user", "content": "Q1?"},
            {"role": "assistant", "reasoning_content": "Let me think.\nStep 1.", "content": "A1."},
            {"role": "user", "content": "Q2?"},
            {"role": "assistant", "reasoning_content": "\nThinking again.\n", "content": "A2."},
        ],
        None,
    ),
    (
        "reasoning_tool_call",
        [
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "reasoning_content": "I should call the tool.",
                "content": "",
                "tool_calls": [call("call_1", "get_weather", WEATHER_ARGS, False)],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
            {"role": "assistant", "reasoning_content": "It is sunny.", "content": "Sunny, 18 °C."},
        ],
        TOOLS,
    ),
    (
        "think_in_content",
        [
            {"role": "user", "content": "Q?"},
            {"role": "assistant", "content": "<think>\nhidden steps\n</think>\n\nvisible answer"},
        ],
        None,
    ),
    (
        "thinking_field",
        [
            {"role": "user", "content": "Q?"},
            {"role": "assistant", "thinking": "Some analysis.", "content": "The answer."},
        ],
        None,
    ),
    (
        "tool_without_call",
        [
            {"role": "user", "content": "Hello"},
            {"role": "tool", "tool_call_id": "call_9", "content": "orphan result"},
        ],
        None,
    ),
    ("complex_tool_schema", [{"role": "user", "content": "Plan a meeting."}], [EVENT, PING]),
    (
        "two_system_messages",
        [
            {"role": "system", "content": "First rule."},
            {"role": "system", "content": "Second rule."},
            {"role": "user", "content": "Hi"},
        ],
        None,
    ),
    (
        "content_parts",
        [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
        ],
        None,
    ),
    (
        "names_and_ids",
        [
            {"role": "user", "name": "alice", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", WEATHER_ARGS, True)]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "[1, 2]"},
        ],
        TOOLS,
    ),
    ("empty", [], None),
]


def render(template, special, messages, tools, add_generation_prompt, extra):
    kwargs = {**special, **extra}
    rendered, _ = render_jinja_template(
        conversations=[copy.deepcopy(messages)],
        tools=copy.deepcopy(tools),
        documents=None,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]


def main():
    cases = []
    for name, special in TEMPLATES.items():
        with open(os.path.join(DIR, f"{name}.jinja"), encoding="utf-8", newline="") as f:
            template = f.read()
        for conv_name, messages, tools in CONVERSATIONS:
            variants = [{}] + (EXTRA.get(name, []) if conv_name in EXTRA_ON else [])
            for extra in variants:
                for agp in (True, False):
                    case = {
                        "template": name,
                        "conversation_name": conv_name,
                        "messages": messages,
                        "tools": tools,
                        "add_generation_prompt": agp,
                        "extra_kwargs": extra,
                    }
                    try:
                        case["expected"] = render(template, special, messages, tools, agp, extra)
                    except Exception as e:  # noqa: BLE001 - every refusal is recorded
                        # raise_exception's TemplateError carries the template's own message.
                        case["error"] = f"{type(e).__name__}: {e}"
                        case["error_from_template"] = type(e) is jinja2.exceptions.TemplateError
                    cases.append(case)
    out = {
        "generator": "oracle/chat_templates.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "now": NOW.isoformat(),
        "special_tokens": TEMPLATES,
        "cases": cases,
    }
    path = os.path.join(DIR, "expected.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"{path}: {len(cases)} cases, {errors} expected errors")


if __name__ == "__main__":
    main()
