"""The models an orchestrator serves: name -> GGUF path, loaded (facts + tokenizer) on first use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swactor.common.gguf import ModelRefused
from swactor.orchestrator.errors import RequestError
from swactor.orchestrator.gguf_model import ModelFacts, read_model
from swactor.orchestrator.tokenizer import Tokenizer, TokenizerError


@dataclass(frozen=True)
class LoadedModel:
    name: str
    facts: ModelFacts
    tokenizer: Tokenizer


class ModelRegistry:
    def __init__(self, paths: dict[str, Path], default: str) -> None:
        if default not in paths:
            raise ValueError(f"default model {default!r} is not among the configured models {sorted(paths)}")
        self.paths = dict(paths)
        self.default = default
        self._loaded: dict[str, LoadedModel] = {}

    def get(self, name: str) -> LoadedModel:
        name = name or self.default
        if name not in self.paths:
            raise RequestError.invalid(f"unknown model {name!r}; this orchestrator serves: {', '.join(sorted(self.paths))}")
        if name not in self._loaded:
            try:
                facts, data = read_model(self.paths[name], model_id=name)
                self._loaded[name] = LoadedModel(name, facts, Tokenizer(data))
            except (ModelRefused, TokenizerError) as e:
                raise RequestError.precondition(f"model {name!r} cannot be served: {e}") from None
        return self._loaded[name]
