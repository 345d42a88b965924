"""Chat templates: the GGUF's own `tokenizer.chat_template` (Jinja), rendered in a sandbox.

The environment is the one Hugging Face's `apply_chat_template` gives a template (the reference
renderer; llama.cpp's --jinja mode follows it too): an immutable sandbox with trim_blocks and
lstrip_blocks, loop controls, the `{% generation %}` block, a `tojson` filter that keeps non-ASCII
text and takes indent/separators/sort_keys, `raise_exception`, `strftime_now`, and a `namespace`
that refuses underscore attributes; the variables `messages`, `add_generation_prompt`, `tools` and
`documents` (None), and the model's special token texts (`bos_token`, `eos_token`).
`chat_prompt` renders for a tokenizer as llama.cpp does: the template sees BOS/EOS, and a leading
BOS (trailing EOS) the tokenizer adds itself is cut from the text. Files without a template fall
back to a built-in ChatML or Llama 3 template, chosen by the vocabulary's tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    from swactor.orchestrator.tokens.tokenizer.tokenizer import Tokenizer

ROLES = frozenset({"system", "user", "assistant", "tool"})

# Built-in fallbacks (only for files without tokenizer.chat_template), in the same Jinja dialect.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered: no template, a template that does not parse, or one that
    refuses the conversation or fails while rendering; the message names the cause."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str


class _Refused(jinja2.TemplateError):
    """raise_exception() called by the template itself."""


def _raise_exception(message: str) -> None:
    raise _Refused(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters (<, >, &, '), which chat templates do not expect.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` whose attributes cannot start with '_' (no way into Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering
    keeps its body as is."""

    tags = {"generation"}  # noqa: RUF012 -- Jinja's Extension API

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return caller()


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the model's chat template does not parse: {e.message} (template line {e.lineno})") from None


def render_chat(template: str | None, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                special_tokens: Mapping[str, str] | None = None, now: datetime | None = None) -> str:
    """`messages` rendered by `template` with the variables Hugging Face passes; `special_tokens`
    maps `bos_token`/`eos_token`/... to their texts; `now` is what `strftime_now` formats."""
    if not template:
        raise ChatTemplateError("the model has no tokenizer.chat_template; send a raw prompt instead")
    if not messages:
        raise ChatTemplateError("a chat request needs at least one message")
    for k, m in enumerate(messages):
        if m.role not in ROLES:
            raise ChatTemplateError(f"message {k}: unknown role {m.role!r} (expected one of {', '.join(sorted(ROLES))})")
    compiled = _compile(template)

    def strftime_now(fmt: str) -> str:
        return (now or datetime.now()).strftime(fmt)

    variables = {
        **(special_tokens or {}),
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "add_generation_prompt": add_generation_prompt,
        "tools": None,
        "documents": None,
        "strftime_now": strftime_now,
    }
    try:
        return compiled.render(**variables)
    except _Refused as e:
        raise ChatTemplateError(f"the model's chat template refused the conversation: {e.message}") from None
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(f"the model's chat template tried an unsafe operation: {e}") from None
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the model's chat template failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # a template is a program: any error it hits is the template's, not ours
        raise ChatTemplateError(f"the model's chat template failed: {type(e).__name__}: {e}") from None


def builtin_template(tok: Tokenizer) -> str:
    """The fallback for a file without tokenizer.chat_template, by the vocabulary's marker tokens."""
    ids = set(tok.tokens)
    if "<|start_header_id|>" in ids and "<|end_header_id|>" in ids:
        return LLAMA3_TEMPLATE
    if "<|im_start|>" in ids and "<|im_end|>" in ids:
        return CHATML_TEMPLATE
    raise ChatTemplateError(
        "the model has no tokenizer.chat_template and its vocabulary fits no built-in template "
        "(ChatML, Llama 3); send a raw prompt instead"
    )


def special_token_texts(tok: Tokenizer) -> dict[str, str]:
    """`bos_token` / `eos_token` as llama.cpp hands them to a template: the token's piece."""
    out = {}
    for name, token_id in (("bos_token", tok.bos_id), ("eos_token", tok.eos_id)):
        if token_id is not None:
            out[name] = tok.token_bytes(token_id).decode("utf-8", errors="replace")
    return out


def chat_prompt(tok: Tokenizer, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                now: datetime | None = None) -> str:
    """The prompt text for `messages` under the model's own template, ready for `tok.encode`."""
    template = tok.data.chat_template or builtin_template(tok)
    special = special_token_texts(tok)
    text = render_chat(template, messages, add_generation_prompt=add_generation_prompt, special_tokens=special, now=now)
    bos, eos = special.get("bos_token", ""), special.get("eos_token", "")
    # The template writes BOS; encode adds it again when the GGUF asks (llama.cpp cuts it the same way).
    if tok.add_bos and bos and text.startswith(bos):
        text = text[len(bos):]
    if tok.add_eos and eos and text.endswith(eos):
        text = text[: -len(eos)]
    return text
