"""The OpenAI response objects: whole answers, stream chunks and the model list."""

from __future__ import annotations

from typing import Any

from swactor.gateway.answers import Answer
from swactor.gateway.requests import Endpoint
from swactor.v1 import orchestrator_pb2 as opb

OWNER = "swactor"


def _head(answer: Answer, obj: str) -> dict[str, Any]:
    return {"id": answer.id, "object": obj, "created": answer.created, "model": answer.model}


def whole(answer: Answer, text: str) -> dict[str, Any]:
    if answer.request.endpoint is Endpoint.CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": answer.finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": answer.finish_reason}
    return {**_head(answer, answer.request.endpoint.value), "choices": [choice], "usage": answer.usage.as_dict()}


def chunk(answer: Answer, text: str | None = None, *, first: bool = False, finish: bool = False) -> dict[str, Any]:
    """One stream chunk: the chat answer's first (its role), a text delta, or the last (its finish_reason)."""
    reason = answer.finish_reason if finish else None
    if answer.request.endpoint is Endpoint.CHAT:
        delta: dict[str, Any] = {}
        if first:
            delta = {"role": "assistant", "content": ""}
        elif text is not None:
            delta = {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        out = {**_head(answer, "chat.completion.chunk"), "choices": [choice]}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        out = {**_head(answer, "text_completion"), "choices": [choice]}
    if answer.request.include_usage:
        out["usage"] = None  # the usage chunk after the last one carries it (stream_options.include_usage)
    return out


def usage_chunk(answer: Answer) -> dict[str, Any]:
    obj = "chat.completion.chunk" if answer.request.endpoint is Endpoint.CHAT else "text_completion"
    return {**_head(answer, obj), "choices": [], "usage": answer.usage.as_dict()}


def model_list(models: list[opb.ServedModel], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": m.name, "object": "model", "created": created, "owned_by": OWNER}
                                       for m in models]}
