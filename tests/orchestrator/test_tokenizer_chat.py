"""Chat templates rendered with Jinja in a sandbox, byte-equal to Hugging Face's apply_chat_template
(tests/fixtures/chat_templates.json, recorded by packaging/record_chat_templates.py) for Llama 3.1/3.2,
Qwen2.5, Qwen3, Phi-3.5, Gemma 2, Gemma 3, Mistral v3, SmolLM2 and ChatML templates and the built-in fallbacks;
plus the variables and functions templates use, the sandbox, and every way a template can fail."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from swactor.orchestrator.tokens.tokenizer import (
    ChatTemplateError,
    Message,
    Tokenizer,
    chat_prompt,
    render_chat,
)
from swactor.orchestrator.tokens.tokenizer.chat import CHATML_TEMPLATE, LLAMA3_TEMPLATE

from .helpers import MODEL_PATH

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates.json").read_text(encoding="utf-8"))
NOW = datetime.fromisoformat(RECORDED["now"])
CASES = RECORDED["cases"]


def messages_of(conversation: str) -> list[Message]:
    return [Message(m["role"], m["content"]) for m in RECORDED["conversations"][conversation]["messages"]]


def test_the_recorded_set_covers_the_families() -> None:
    rendered = {c["template"] for c in CASES if "text" in c}
    assert {"llama-3.1", "llama-3.2", "qwen2.5", "qwen3", "phi-3.5", "gemma-2", "gemma-3", "mistral-v3", "smollm2",
            "chatml", "builtin-chatml", "builtin-llama3"} <= rendered
    assert all(sum(c["template"] == name and "text" in c for c in CASES) >= 4 for name in rendered)
    refused = {(c["template"], c["conversation"]) for c in CASES if "error" in c}
    assert {("gemma-2", "system_multi_turn"), ("gemma-2", "not_alternating"), ("gemma-3", "not_alternating")} <= refused


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['template']}-{c['conversation']}")
def test_render_equals_hugging_face(case: dict) -> None:
    recorded = RECORDED["templates"][case["template"]]
    render = lambda: render_chat(recorded["template"], messages_of(case["conversation"]),  # noqa: E731
                                 add_generation_prompt=case["add_generation_prompt"],
                                 special_tokens=recorded["special_tokens"], now=NOW)
    if "error" in case:
        with pytest.raises(ChatTemplateError, match="refused the conversation") as err:
            render()
        assert case["error"] in str(err.value)
    else:
        assert render() == case["text"]


def test_default_system_prompts_and_dates_are_the_templates_own() -> None:
    by = {(c["template"], c["conversation"]): c.get("text", "") for c in CASES}
    assert "You are Qwen, created by Alibaba Cloud" in by["qwen2.5", "user_only"]
    assert "Today Date: 26 Jul 2024" in by["llama-3.1", "user_only"]  # its default date_string
    assert "Today Date: 05 Sep 2024" in by["llama-3.2", "user_only"]  # strftime_now on the pinned clock
    assert "named SmolLM" in by["smollm2", "user_only"]
    # Qwen3 wraps the last assistant turn after the last user turn in an empty <think> block
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\nHello there." in by["qwen3", "no_generation_prompt"]
    # Gemma 3 has no system turn: the template folds the system message into the first user turn
    assert by["gemma-3", "system_multi_turn"].startswith("<bos><start_of_turn>user\nYou are a terse assistant.\n\nWhat is")
    # ... and drops the reasoning of earlier replies (str.split / strip / lstrip / rstrip in the sandbox)
    assert "<|im_start|>assistant\nBlue.<|im_end|>" in by["qwen3", "reasoning_in_replies"]
    assert by["qwen3", "reasoning_in_replies"].endswith("<think>\nNot blue.\n</think>\n\nRed.<|im_end|>\n")
    assert by["phi-3.5", "no_generation_prompt"].endswith("<|end|>\n<|endoftext|>")  # eos_token closes it


def render(template: str, messages: list[Message] | None = None, **kw) -> str:
    return render_chat(template, messages or [Message("user", "hi")], **kw)


def test_variables_and_functions_templates_expect() -> None:
    assert render("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ documents }}",
                  special_tokens={"bos_token": "<s>", "eos_token": "</s>"}) == "<s>|</s>|True|None|None"
    assert render("{{ strftime_now('%Y-%m-%d') }}", now=datetime(2025, 1, 31)) == "2025-01-31"
    assert render("{{ messages[0].role }}:{{ messages[0]['content'] }}") == "user:hi"
    assert render("{{ {'k': 'é<>&'} | tojson }}") == '{"k": "é<>&"}'  # no HTML escaping, non-ASCII kept
    assert render("{{ [1] | tojson(indent=2) }}") == "[\n  1\n]"
    assert render("{% for m in messages %}{% if loop.first %}{% break %}{% endif %}x{% endfor %}done") == "done"
    assert render("{% generation %}kept{% endgeneration %}") == "kept"
    assert render("{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}") == "2"
    # trim_blocks / lstrip_blocks, as Hugging Face sets them
    assert render("  {% if true %}\nA\n  {% endif %}\nB") == "A\nB"


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("{% if %}", "does not parse: .*template line 1"),
        ("{{ raise_exception('no system role here') }}", "refused the conversation: no system role here"),
        ("{{ messages.append(1) }}", "unsafe operation"),
        ("{{ ''.__class__.__mro__ }}", "unsafe operation: access to attribute '__class__'"),
        ("{% set ns = namespace(_x=1) %}", "unsafe operation.*underscore"),
        ("{{ 1 // 0 }}", "failed: ZeroDivisionError"),
        ("{{ undefined_function() }}", "failed: UndefinedError"),
    ],
)
def test_template_errors_name_the_cause(template: str, needle: str) -> None:
    with pytest.raises(ChatTemplateError, match=needle):
        render(template)


@pytest.mark.parametrize(
    ("template", "messages", "needle"),
    [
        (None, [Message("user", "x")], "no tokenizer.chat_template"),
        (CHATML_TEMPLATE, [], "at least one message"),
        (CHATML_TEMPLATE, [Message("robot", "x")], "unknown role 'robot'"),
    ],
)
def test_request_refusals(template, messages, needle: str) -> None:
    with pytest.raises(ChatTemplateError, match=needle):
        render_chat(template, messages)


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    if not MODEL_PATH.exists():
        pytest.skip(f"{MODEL_PATH} missing: run `make model`")
    return Tokenizer.from_gguf(MODEL_PATH)


def test_files_without_a_template_fall_back_by_vocabulary(smol: Tokenizer) -> None:
    untemplated = Tokenizer(replace(smol.data, chat_template=None))
    assert chat_prompt(untemplated, [Message("user", "hi")]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    llama3ish = Tokenizer(replace(smol.data, chat_template=None,
                                  tokens=[*smol.tokens, "<|start_header_id|>", "<|end_header_id|>"],
                                  token_types=[*smol.token_types, 3, 3]))
    assert chat_prompt(llama3ish, [Message("user", " hi ")]) == (
        "<|im_start|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    bare = Tokenizer(replace(smol.data, chat_template=None, tokens=["a", "b", *smol.tokens[2:]]))
    with pytest.raises(ChatTemplateError, match="fits no built-in template"):
        chat_prompt(bare, [Message("user", "hi")])


def test_template_outputs_the_tokenizer_leaves_alone(smol: Tokenizer) -> None:
    # SmolLM2 adds no BOS, so a template that writes bos_token keeps it in the text
    t = Tokenizer(replace(smol.data, chat_template="{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}"))
    assert chat_prompt(t, [Message("user", "x")]) == "<|im_start|>x<|im_end|>"
    assert LLAMA3_TEMPLATE.startswith("{{ bos_token }}")
