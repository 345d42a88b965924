"""A SubmitRun's prompt ids: the chat template rendered and the text tokenized off the event loop.

Rendering and tokenizing a prompt costs CPU in proportion to its length (the tokenizer bounds it:
a text that cannot fit the context is refused before merging, tokenizer/bounds.py), so both run in
one worker thread while the event loop goes on answering other RPCs and driving runs. One thread:
prompts are prepared in the order they came, and many large ones cannot take every core; at most
`max_pending` wait for it, beyond that a submission is refused (RESOURCE_EXHAUSTED) rather than held.
The request's size was already bounded before parsing (validation.SubmitDeserializer).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc

from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.models.models import LoadedModel, ModelRegistry
from swactor.orchestrator.tokens.tokenizer import (
    ChatTemplateError,
    Message,
    PromptTooLong,
    TokenizerError,
    chat_prompt,
)
from swactor.v1 import orchestrator_pb2 as opb

MAX_PENDING = 8


def prompt_ids(req: opb.SubmitRunRequest, model: LoadedModel, context: int) -> list[int]:
    """The ids to inject for `req`'s input (prompt, messages or prompt_ids); RequestError names what is wrong."""
    tok = model.tokenizer
    which = req.WhichOneof("input")
    if which is None:
        raise RequestError.invalid("the request has neither `prompt`, `messages` nor `prompt_ids`")
    if which == "prompt_ids":
        ids = list(req.prompt_ids.ids)
        if not ids:
            raise RequestError.invalid("prompt_ids is empty")
        vocab = model.facts.vocab_size
        bad = next((i for i, t in enumerate(ids) if t >= vocab), None)
        if bad is not None:
            raise RequestError.invalid(f"prompt_ids[{bad}] = {ids[bad]} is not below the vocab size {vocab}")
        return ids
    if which == "prompt":
        if not req.prompt.strip():
            raise RequestError.invalid("prompt is empty")
        if req.raw:
            return _encode(tok, req.prompt, context)
        messages = [Message("user", req.prompt)]
    else:
        if not req.messages.messages:
            raise RequestError.invalid("messages is empty")
        messages = [Message(m.role, m.content) for m in req.messages.messages]
        if not any(m.content.strip() for m in messages):
            raise RequestError.invalid("every message is empty")
    try:
        text = chat_prompt(tok, messages)
    except ChatTemplateError as e:
        raise RequestError.invalid(f"{e} (set raw to send the prompt without a template)") from None
    return _encode(tok, text, context)


def _encode(tok, text: str, context: int) -> list[int]:
    # A prompt that cannot fit is refused by its length before the merging, whose cost grows with it.
    try:
        return tok.encode(text, max_tokens=context - 1)
    except PromptTooLong as e:
        raise RequestError.invalid(f"prompt does not fit: {e}; the context holds {context}") from None
    except TokenizerError as e:
        raise RequestError.invalid(f"prompt cannot be tokenized: {e}") from None


class PromptPreparer:
    """Model lookup, template and tokenizer for SubmitRun, in one worker thread."""

    def __init__(self, models: ModelRegistry, max_seq_len_cap: int, max_pending: int = MAX_PENDING) -> None:
        self.models = models
        self.max_seq_len_cap = max_seq_len_cap
        self.max_pending = max_pending
        self._pending = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swactor-prompt")

    def context(self, model: LoadedModel) -> int:
        return min(model.facts.max_seq_len, self.max_seq_len_cap)

    async def prepare(self, req: opb.SubmitRunRequest) -> tuple[LoadedModel, list[int]]:
        if self._pending >= self.max_pending:
            raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"{self._pending} prompts are already being tokenized; try again shortly")
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._prepare, req)
        finally:
            self._pending -= 1

    def _prepare(self, req: opb.SubmitRunRequest) -> tuple[LoadedModel, list[int]]:
        model = self.models.get(req.model)  # may re-judge a model file that changed: file I/O
        return model, prompt_ids(req, model, self.context(model))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
