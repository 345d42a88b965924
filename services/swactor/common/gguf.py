"""A GGUF file's metadata: the one reader of the llama-family (llama, qwen2) hyper-parameters, for the orchestrator's
planner (model facts, the tokenizer) and the worker's compute core (a stage's weights).

Opening memory-maps the file (GGUFReader); nothing here touches tensor bytes. Every refusal is a
`ModelRefused` with a stable `reason` (MissingFile, MalformedGGUF, MissingMetadata,
UnsupportedArchitecture, UnsupportedRopeScaling; the compute core adds MissingTensor,
InvalidLayerRange) and a detail naming the key or value.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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


# general.architecture -> whether Q/K rotate as NeoX (halves) rather than llama.cpp's adjacent pairs;
# hyper-parameters are read from keys prefixed by the architecture's name. Mistral files are `llama`.
ARCHITECTURES = {"llama": False, "qwen2": True}
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "llama3")
QKV_BIAS = ("attn_q", "attn_k", "attn_v")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"  # one of ROPE_SCALING_TYPES (worker/compute/rope.py applies them)
    factor: float = 1.0
    original_context: int = 0  # yarn, llama3: the context the model was trained on before scaling
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3


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
    arch: str = "llama"
    rope_neox: bool = False  # qwen2: rotate (x[i], x[i + rope_dim/2]) instead of (x[2i], x[2i+1])
    qkv_bias: bool = False  # Q/K/V have biases (qwen2)


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


def read_rope_scaling(k: Callable[..., Any], context_length: int) -> RopeScaling:
    """`{arch}.rope.scaling.*` as llama.cpp reads them: no type but a factor means linear; `llama3` (the
    rule that computes rope_freqs, for files that carry its parameters instead of the tensor) takes
    HF's parameter names."""
    factor = float(k("rope.scaling.factor", k("rope.scale_linear", 0.0)) or 1.0)
    kind = str(k("rope.scaling.type", "linear" if factor != 1.0 else "none"))
    if kind not in ROPE_SCALING_TYPES:
        raise ModelRefused("UnsupportedRopeScaling",
                           f"rope scaling type {kind!r} is not supported (supported: {', '.join(ROPE_SCALING_TYPES)})")
    if float(k("rope.scaling.attn_factor", 1.0)) != 1.0:
        raise ModelRefused("UnsupportedRopeScaling",
                           f"rope.scaling.attn_factor {k('rope.scaling.attn_factor')} is not supported (only 1.0)")
    if kind == "none":
        return RopeScaling()
    if factor <= 0:
        raise ModelRefused("UnsupportedRopeScaling", f"rope scaling factor {factor} must be > 0")
    orig = int(k("rope.scaling.original_context_length", context_length))
    if kind == "llama3":
        return RopeScaling(kind, factor, orig, float(k("rope.scaling.low_freq_factor", 1.0)),
                           float(k("rope.scaling.high_freq_factor", 4.0)))
    return RopeScaling(kind, factor, orig)


def read_params(reader: GGUFReader, tensor_names: set[str] | frozenset[str] = frozenset()) -> LlamaParams:
    """The hyper-parameters of a llama-family file; `tensor_names` tell whether Q/K/V have biases."""
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelRefused("UnsupportedArchitecture",
                           f"architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")

    def k(key: str, default: Any = _REQUIRED) -> Any:
        return field(reader, f"{arch}.{key}", default)

    dim, n_heads = int(k("embedding_length")), int(k("attention.head_count"))
    head_dim = int(k("attention.key_length", dim // n_heads))
    if k("attention.value_length", head_dim) != head_dim:
        raise ModelRefused("UnsupportedArchitecture", "key_length != value_length")
    ctx = int(k("context_length"))
    biases = [t for t in QKV_BIAS if f"blk.0.{t}.bias" in tensor_names]
    if biases and len(biases) != len(QKV_BIAS):
        raise ModelRefused("UnsupportedArchitecture",
                           f"layer 0 has biases for {biases} only (supported: none, or all of {list(QKV_BIAS)})")
    params = LlamaParams(
        n_layers=int(k("block_count")), dim=dim, ffn_dim=int(k("feed_forward_length")), n_heads=n_heads,
        n_kv_heads=int(k("attention.head_count_kv", n_heads)), head_dim=head_dim,
        rope_base=float(k("rope.freq_base", 10000.0)), rope_dim=int(k("rope.dimension_count", head_dim)),
        rope_scaling=read_rope_scaling(k, ctx),
        norm_eps=float(k("attention.layer_norm_rms_epsilon")), context_length=ctx,
        vocab_size=int(k("vocab_size", _count(reader.fields.get("tokenizer.ggml.tokens")))),
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_id=field(reader, "tokenizer.ggml.eos_token_id", None),
        arch=arch, rope_neox=ARCHITECTURES[arch], qkv_bias=bool(biases))
    if params.n_layers <= 0 or params.dim <= 0 or params.context_length <= 0:
        raise ModelRefused("MalformedGGUF", "block_count, embedding_length and context_length must be positive")
    return params
