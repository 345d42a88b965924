"""A GGUF file's metadata: the one reader of the llama hyper-parameters, for the orchestrator's
planner (model facts, the tokenizer) and the worker's compute core (a stage's weights).

Opening memory-maps the file (GGUFReader); nothing here touches tensor bytes. Every refusal is a
`ModelRefused` with a stable `reason` (MissingFile, MalformedGGUF, MissingMetadata,
UnsupportedArchitecture, UnsupportedRopeScaling; the compute core adds MissingTensor,
InvalidLayerRange) and a detail naming the key or value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFReader

_REQUIRED: Any = object()


class ModelRefused(ValueError):
    """The GGUF cannot serve this model or stage; str() is "reason: detail"."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"  # "none" | "linear"
    factor: float = 1.0  # positions are divided by factor for "linear"


@dataclass(frozen=True)
class LlamaParams:
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_base: float
    rope_dim: int
    rope_scaling: RopeScaling
    norm_eps: float
    context_length: int
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None


def open_gguf(path: str | os.PathLike[str], reader_type: type[GGUFReader] = GGUFReader) -> GGUFReader:
    """`reader_type` may be a GGUFReader subclass that refuses more (a ModelRefused passes through)."""
    if not Path(path).is_file():
        raise ModelRefused("MissingFile", f"model file {path} does not exist")
    try:
        return reader_type(path, "r")
    except ModelRefused:
        raise
    except Exception as e:  # the gguf package raises ValueError / struct errors for bad files
        raise ModelRefused("MalformedGGUF", f"{path}: not a readable GGUF file: {e}") from e


def field(reader: GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
    """The value of metadata `key`; `default` when it is absent, MissingMetadata when there is none."""
    f = reader.fields.get(key)
    if f is None:
        if default is _REQUIRED:
            raise ModelRefused("MissingMetadata", f"GGUF key {key!r} is missing")
        return default
    return f.contents()


def _count(f: Any) -> int:
    """Elements of an array field: a GGUFReader field indexes them in `.data` (no decoding); a
    modelfile.header.HeaderFields field holds the list itself."""
    if f is None:
        return 0
    return len(f.data) if hasattr(f, "data") else len(f.contents())


def read_params(reader: GGUFReader) -> LlamaParams:
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ModelRefused("UnsupportedArchitecture", f"architecture {arch!r} is not supported (only 'llama')")

    def k(key: str, default: Any = _REQUIRED) -> Any:
        return field(reader, f"llama.{key}", default)

    dim, n_heads = int(k("embedding_length")), int(k("attention.head_count"))
    head_dim = int(k("attention.key_length", dim // n_heads))
    if k("attention.value_length", head_dim) != head_dim:
        raise ModelRefused("UnsupportedArchitecture", "key_length != value_length")
    kind = str(k("rope.scaling.type", "none"))
    factor = float(k("rope.scaling.factor", k("rope.scale_linear", 1.0)))
    if kind == "none" and factor != 1.0:
        kind = "linear"
    if kind not in ("none", "linear"):
        raise ModelRefused("UnsupportedRopeScaling", f"rope scaling {kind!r} is not supported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    params = LlamaParams(
        n_layers=int(k("block_count")), dim=dim, ffn_dim=int(k("feed_forward_length")), n_heads=n_heads,
        n_kv_heads=int(k("attention.head_count_kv", n_heads)), head_dim=head_dim,
        rope_base=float(k("rope.freq_base", 10000.0)), rope_dim=int(k("rope.dimension_count", head_dim)),
        rope_scaling=RopeScaling(kind, factor if kind == "linear" else 1.0),
        norm_eps=float(k("attention.layer_norm_rms_epsilon")), context_length=int(k("context_length")),
        vocab_size=int(k("vocab_size", _count(tokens))),
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_id=field(reader, "tokenizer.ggml.eos_token_id", None))
    if params.n_layers <= 0 or params.dim <= 0 or params.context_length <= 0:
        raise ModelRefused("MalformedGGUF", "block_count, embedding_length and context_length must be positive")
    return params
