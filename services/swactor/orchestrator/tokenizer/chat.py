"""Chat templates, implemented natively and chosen from the GGUF's `tokenizer.chat_template` text.

Like llama.cpp, the template kind is detected from marker strings in the template (no Jinja engine):
ChatML (`<|im_start|>`) and Llama 3 (`<|start_header_id|>` + `<|end_header_id|>`). Anything else is
refused with ChatTemplateError; callers may then send a raw prompt instead.

ChatML follows the GGUF's template (Jinja semantics): when that template injects a default system
message for conversations that start without one (SmolLM2 does), so do we.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHATML = "chatml"
LLAMA3 = "llama3"
ROLES = frozenset({"system", "user", "assistant", "tool"})


class ChatTemplateError(ValueError):
    pass


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class ChatTemplate:
    kind: str
    default_system: str | None = None


_DEFAULT_SYSTEM = re.compile(
    r"messages\[0\]\['role'\]\s*!=\s*'system'\s*%\}\s*\{\{\s*'<\|im_start\|>system\n(.*?)<\|im_end\|>\n'\s*\}\}",
    re.S,
)


def detect(template: str | None) -> ChatTemplate:
    if not template:
        raise ChatTemplateError("the model has no tokenizer.chat_template; send a raw prompt instead")
    if "<|im_start|>" in template:
        if "<|im_sep|>" in template or "<end_of_utterance>" in template:
            raise ChatTemplateError("chat template is a ChatML variant (phi-4/smolvlm) that is not supported; use a raw prompt")
        m = _DEFAULT_SYSTEM.search(template)
        return ChatTemplate(CHATML, m.group(1) if m else None)
    if "<|start_header_id|>" in template and "<|end_header_id|>" in template:
        return ChatTemplate(LLAMA3)
    head = template[:60].replace("\n", " ")
    raise ChatTemplateError(
        f"unknown chat template (supported: ChatML, Llama 3), starting {head!r}; send a raw prompt instead"
    )


def render_chat(template: str | None, messages: list[Message], *, add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` under the model's template (BOS is the tokenizer's job)."""
    if not messages:
        raise ChatTemplateError("a chat request needs at least one message")
    for k, m in enumerate(messages):
        if m.role not in ROLES:
            raise ChatTemplateError(f"message {k}: unknown role {m.role!r} (expected one of {', '.join(sorted(ROLES))})")
    tmpl = detect(template)
    out: list[str] = []
    if tmpl.kind == CHATML:
        if tmpl.default_system is not None and messages[0].role != "system":
            out.append(f"<|im_start|>system\n{tmpl.default_system}<|im_end|>\n")
        out.extend(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
    else:
        out.extend(f"<|start_header_id|>{m.role}<|end_header_id|>\n\n{m.content.strip()}<|eot_id|>" for m in messages)
        if add_generation_prompt:
            out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)
