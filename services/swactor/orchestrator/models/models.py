"""The models an orchestrator serves: name -> source, each judged from its GGUF header alone.

A model is judged (modelfile.judge: architecture, tokenizer model, quant types, tensors) when the
orchestrator starts and again whenever a local file changed since; a refused model answers every
SubmitRun naming it `FAILED_PRECONDITION: RUN_FAULT_MODEL_REFUSED: ...` before any host fetches a
byte. The facts and the tokenizer come from the same header (no tensor byte is read here).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from swactor.modelfile.header import GgufFormatError, GgufHeader
from swactor.modelfile.judge import judge
from swactor.modelfile.memory import memory_profile
from swactor.modelfile.params import ModelRefused
from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.models.gguf_model import ModelFacts, read_model
from swactor.orchestrator.models.sources import ModelSource, SourceError
from swactor.orchestrator.tokens.tokenizer import (
    ChatTemplateError,
    Message,
    Tokenizer,
    TokenizerError,
    chat_prompt,
)

REFUSED = "RUN_FAULT_MODEL_REFUSED"


class ModelUnusable(Exception):
    """The model cannot be served; the message names the model and why."""


@dataclass(frozen=True)
class LoadedModel:
    name: str
    facts: ModelFacts
    tokenizer: Tokenizer
    source: ModelSource | None = None
    header: GgufHeader | None = None
    size: int = 0
    # Why chat requests cannot be rendered ("" = the template works); raw prompts still can.
    chat_template_error: str = ""


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def load_model(source: ModelSource) -> LoadedModel:
    """Judge `source` from its header; ModelUnusable names the first reason it cannot run."""
    try:
        header, size = source.read_header()
    except SourceError as e:
        raise ModelUnusable(f"model {source.name!r}: {source.location}: {e.detail} ({e.reason})") from None
    except GgufFormatError as e:
        raise ModelUnusable(f"{REFUSED}: model {source.name!r}: MalformedGGUF: {e}") from None
    refusals = judge(header, size)
    if refusals:
        raise ModelUnusable(f"{REFUSED}: model {source.name!r}: " + "; ".join(str(r) for r in refusals))
    path = source.path if not source.is_url else Path(source.location.rsplit("/", 1)[-1])
    try:
        facts, data = read_model(path, model_id=source.name, header=header)
        facts = dataclasses.replace(facts, memory=memory_profile(header))
        tokenizer = Tokenizer(data)
    except (ModelRefused, TokenizerError, ValueError) as e:
        raise ModelUnusable(f"{REFUSED}: model {source.name!r}: {e}") from None
    try:
        chat_prompt(tokenizer, [Message("user", "ping")])  # the GGUF's template, or a built-in fallback
        chat_error = ""
    except ChatTemplateError as e:
        chat_error = str(e)
    return LoadedModel(source.name, facts, tokenizer, source, header, size, chat_error)


class ModelRegistry:
    def __init__(self, sources: dict[str, Path | str | ModelSource], default: str) -> None:
        if default not in sources:
            raise ValueError(f"default model {default!r} is not among the configured models {sorted(sources)}")
        self.sources: dict[str, ModelSource] = {
            name: s if isinstance(s, ModelSource) else ModelSource.parse(name, str(s)) for name, s in sources.items()}
        self.default = default
        self._loaded: dict[str, tuple[LoadedModel, tuple[int, int, int] | None]] = {}

    @property
    def paths(self) -> dict[str, Path]:
        """The local-path sources (name -> path)."""
        return {n: s.path for n, s in self.sources.items() if not s.is_url}

    def load(self, name: str) -> LoadedModel:
        """Judge (again, if a local file changed) and return the model; ModelUnusable if it cannot run."""
        source = self.sources[name]
        key = None if source.is_url else _stat_key(source.path)
        known = self._loaded.get(name)
        if known is not None and (source.is_url or known[1] == key):
            return known[0]
        model = load_model(source)
        self._loaded[name] = (model, key)
        return model

    def get(self, name: str) -> LoadedModel:
        name = name or self.default
        if name not in self.sources:
            raise RequestError.invalid(f"unknown model {name!r}; this orchestrator serves: {', '.join(sorted(self.sources))}")
        try:
            return self.load(name)
        except ModelUnusable as e:
            self._loaded.pop(name, None)
            raise RequestError.precondition(str(e)) from None

    def loaded(self, name: str) -> LoadedModel | None:
        known = self._loaded.get(name)
        return known[0] if known else None
