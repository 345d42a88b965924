"""OpenAI request bodies (`/v1/chat/completions`, `/v1/completions`) checked and turned into a SubmitRunRequest.

Every refusal names its field (ApiError.param), as the OpenAI API does. Fields that change what the model does
and that the pool cannot honour (n > 1, logprobs, penalties, tools, echo, suffix) are refused rather than ignored;
fields that only describe the client (user, metadata, store) are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

from swactor.common.objflags import MAX_DRAFT
from swactor.gateway.errors import ApiError
from swactor.gateway.stops import MAX_STOPS
from swactor.v1 import orchestrator_pb2 as opb

INT32_MAX = 2**31 - 1
SEED_MAX = 2**64 - 1
ROLES = ("system", "user", "assistant", "tool", "developer")
# Accepted only at their no-op value: anything else would change the answer in a way the pool does not do.
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "echo": False, "best_of": 1}
REFUSED = ("tools", "functions", "tool_choice", "function_call", "response_format", "logit_bias", "suffix",
           "top_logprobs", "audio", "modalities", "prediction")


class Endpoint(Enum):
    CHAT = "chat.completion"
    COMPLETION = "text_completion"


@dataclass(frozen=True)
class OpenAiRequest:
    endpoint: Endpoint
    model: str  # as the client named it ("" = the default model)
    submit: opb.SubmitRunRequest  # max_tokens 0 = the model's context (filled in by the caller)
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool


def _number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError.bad_param(name, f"{name} must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise ApiError.bad_param(name, f"{name} must be between {lo:g} and {hi:g}, got {value}")
    return float(value)


def _integer(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError.bad_param(name, f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ApiError.bad_param(name, f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError.bad_param(name, f"{name} must be true or false, got {value!r}")
    return value


def _stops(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ApiError.bad_param("stop", "stop must be a string or a list of strings")
    if len(items) > MAX_STOPS:
        raise ApiError.bad_param("stop", f"stop takes at most {MAX_STOPS} strings, got {len(items)}")
    if any(not s for s in items):
        raise ApiError.bad_param("stop", "stop strings must not be empty")
    return tuple(dict.fromkeys(items))


def _text_content(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (joined); other parts are refused."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError.unsupported(f"{where}.content[{j}]", f"only text content parts are served, got {kind!r}")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError.bad_param(f"{where}.content", "content must be a string or a list of text parts")


def _messages(body: dict) -> list[opb.ChatMessage]:
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise ApiError.bad_param("messages", "messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError.bad_param(where, f"{where} must be an object with role and content")
        role = m.get("role")
        if role not in ROLES:
            raise ApiError.bad_param(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        if m.get("tool_calls"):
            raise ApiError.unsupported(f"{where}.tool_calls", "tool calls are not served")
        content = m.get("content")
        text = "" if content is None and role == "assistant" else _text_content(content, where)
        # "developer" is the newer name of the system role; chat templates know "system".
        out.append(opb.ChatMessage(role="system" if role == "developer" else role, content=text))
    return out


def _prompt(body: dict, submit: opb.SubmitRunRequest) -> None:
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        if not value:
            raise ApiError.bad_param("prompt", "prompt is empty")
        submit.prompt, submit.raw = value, True
    elif isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        if any(not 0 <= t < 2**32 for t in value):
            raise ApiError.bad_param("prompt", "prompt token ids must be non-negative integers")
        submit.prompt_ids.ids.extend(value)
    elif isinstance(value, list) and len(value) > 1:
        raise ApiError.unsupported("prompt", "one prompt per request (a list of several prompts is a batch)")
    else:
        raise ApiError.bad_param("prompt", "prompt must be a string or a list of token ids")


def parse(endpoint: Endpoint, body: Any) -> OpenAiRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    model = body.get("model", "")
    if model is None:
        model = ""
    if not isinstance(model, str):
        raise ApiError.bad_param("model", f"model must be a string, got {model!r}")
    for name, neutral in NEUTRAL.items():
        if body.get(name) not in (None, neutral):
            raise ApiError.unsupported(name, f"{name} other than {neutral!r} is not served")
    for name in REFUSED:
        if body.get(name) not in (None, [], {}):
            raise ApiError.unsupported(name, f"{name} is not served")
    if (n := _integer(body, "n", 1, 1 << 20)) not in (None, 1):
        raise ApiError.unsupported("n", f"n must be 1 (one answer per request), got {n}")
    if endpoint is Endpoint.CHAT and body.get("logprobs") is None and body.get("top_logprobs") is not None:
        raise ApiError.unsupported("top_logprobs", "top_logprobs is not served")

    # resume: a request outlives a lost stage host (its stream goes on from the run that continues it).
    submit = opb.SubmitRunRequest(model=model, stop_when_unwatched=True, resume=True)
    if endpoint is Endpoint.CHAT:
        submit.messages.messages.extend(_messages(body))
    else:
        _prompt(body, submit)
    names = ("max_completion_tokens", "max_tokens") if endpoint is Endpoint.CHAT else ("max_tokens",)
    for name in names:
        if (limit := _integer(body, name, 1, INT32_MAX)) is not None:
            submit.max_tokens = limit
            break
    submit.sampling.temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    submit.sampling.top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if (top_k := _integer(body, "top_k", 0, INT32_MAX)) is not None:  # llama.cpp's server takes it too
        submit.sampling.top_k = top_k
    if (speculate := _integer(body, "speculate", 0, MAX_DRAFT)) is not None:  # swactor's extension
        submit.speculate = speculate
    if (seed := _integer(body, "seed", -(2**63), SEED_MAX)) is not None:
        submit.sampling.seed = seed % 2**64  # OpenAI's seeds are signed 64-bit; the same bits are the same seed
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError.bad_param("stream_options", "stream_options must be an object")
    if options and not stream:
        raise ApiError.bad_param("stream_options", "stream_options is only allowed with stream: true")
    include_usage = _flag({"stream_options.include_usage": (options or {}).get("include_usage")},
                          "stream_options.include_usage")
    return OpenAiRequest(endpoint, model, submit, _stops(body), stream, include_usage)
