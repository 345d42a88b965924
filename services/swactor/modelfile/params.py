"""A model's hyper-parameters from its GGUF header: the one reader of them, for the orchestrator's
planner and judge (model facts) and the worker's compute core (a stage's weights).

Works on a parsed header (modelfile.header), so the same code reads a local file (`open_header`)
and the prefix of a remote one. The architectures, their rotation and optional tensors come from
the support declaration. Every refusal is a `ModelRefused` with a stable `reason` (MissingFile,
MalformedGGUF, MissingMetadata, UnsupportedArchitecture, UnsupportedRopeScaling; the compute core
adds MissingTensor, InvalidLayerRange, UnsupportedQuantType) and a detail naming the key or value.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swactor.common.reasons import NamedReason
from swactor.modelfile.header import GgufFormatError, GgufHeader, TensorInfo, read_header
from swactor.modelfile.support import (
    ARCHITECTURES,
    EXPERT_GATING_SOFTMAX,
    LONGROPE_FACTORS,
    QKV_BIAS,
    ROPE_SCALING_TYPES,
)

_REQUIRED: Any = object()


class ModelRefused(NamedReason, ValueError):
    """The GGUF cannot serve this model or stage; str() is "reason: detail"."""


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"  # one of support.ROPE_SCALING_TYPES (worker/compute/rope.py applies them)
    factor: float = 1.0
    # yarn, llama3: the context the model was trained on before scaling; longrope: a stage of a longer context turns by
    # the long factors, of this one or shorter by the short ones
    original_context: int = 0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    attn_factor: float = 1.0  # longrope: cos and sin are multiplied by it (q.k by its square)


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
    rope_neox: bool = False  # qwen2, qwen3, phi3: rotate (x[i], x[i + rope_dim/2]) instead of (x[2i], x[2i+1])
    qkv_bias: bool = False  # Q/K/V have biases (qwen2)
    qk_norm: bool = False  # each head's Q and K are RMS-normed before the rotation (qwen3, gemma3)
    attn_scale: float = 0.0  # the attention scores' factor (1/sqrt(head_dim) but for Gemma 27B); 0: 1/sqrt(head_dim)
    # gemma2, gemma3 (support.Architecture says what each means)
    embed_scale: float = 1.0  # the first stage's factor of the embedding rows
    post_norms: bool = False
    gelu: bool = False
    swa_window: int = 0  # 0: no sliding window
    swa_layers: tuple[bool, ...] = ()  # per layer of the model: sliding-window (True) or global attention
    rope_base_swa: float = 0.0  # the sliding-window layers' RoPE
    rope_scaling_swa: RopeScaling = RopeScaling()
    attn_softcap: float = 0.0  # 0: none
    final_softcap: float = 0.0
    # Mixture of Experts (qwen3moe, llama with experts; 0 experts: a dense FFN). ffn_dim is then one expert's width.
    n_experts: int = 0
    n_experts_used: int = 0  # the top k each token routes to
    expert_weights_norm: bool = True  # the k routing weights renormalised to sum to 1

    @property
    def moe(self) -> bool: return self.n_experts > 0


def open_header(path: str | os.PathLike[str]) -> GgufHeader:
    """The header of a local GGUF file (only the header's bytes are read)."""
    if not Path(path).is_file():
        raise ModelRefused("MissingFile", f"model file {path} does not exist")
    try:
        with open(path, "rb") as f:
            return read_header(lambda n: (f.seek(0), f.read(n))[1])[0]
    except (GgufFormatError, OSError) as e:
        raise ModelRefused("MalformedGGUF", f"{path}: not a readable GGUF file: {e}") from None


def field(header: GgufHeader, key: str, default: Any = _REQUIRED) -> Any:
    """The value of metadata `key`; `default` when it is absent, MissingMetadata when there is none."""
    if key not in header.metadata:
        if default is _REQUIRED:
            raise ModelRefused("MissingMetadata", f"GGUF key {key!r} is missing")
        return default
    return header.metadata[key]


def read_rope_scaling(k: Callable[..., Any], context_length: int, longrope: bool = False) -> RopeScaling:
    """`{arch}.rope.scaling.*` as llama.cpp reads them (`k(key[, default])` looks one up): no type but
    a factor means linear; `llama3` (the rule that computes rope_freqs, for files that carry its
    parameters instead of the tensor) takes HF's parameter names. `longrope`: the file has LongRoPE's factor tensors
    (read_longrope), which llama.cpp's converter writes with `original_context_length` and `attn_factor` and no type."""
    factor = float(k("rope.scaling.factor", k("rope.scale_linear", 0.0)) or 1.0)
    kind = str(k("rope.scaling.type", "linear" if factor != 1.0 else "none"))
    if kind not in ROPE_SCALING_TYPES:
        raise ModelRefused("UnsupportedRopeScaling",
                           f"rope scaling type {kind!r} is not supported (supported: {', '.join(ROPE_SCALING_TYPES)})")
    attn_factor = float(k("rope.scaling.attn_factor", 1.0))
    if longrope:
        # llama.cpp would also apply a linear factor or YaRN's ramp on top of the factors; no known file asks for that
        if kind not in ("none", "longrope") or factor != 1.0:
            raise ModelRefused("UnsupportedRopeScaling", f"LongRoPE factors with rope scaling type {kind!r}, factor "
                                                         f"{factor} are not supported (supported: LongRoPE alone)")
        if not attn_factor > 0:
            raise ModelRefused("UnsupportedRopeScaling", f"rope.scaling.attn_factor {attn_factor} must be > 0")
        return RopeScaling("longrope", 1.0, int(k("rope.scaling.original_context_length", context_length)),
                           attn_factor=attn_factor)
    if kind == "longrope":
        raise ModelRefused("UnsupportedRopeScaling", f"rope scaling type 'longrope' needs the tensors "
                                                     f"{', '.join(LONGROPE_FACTORS)}, which the file lacks")
    if attn_factor != 1.0:  # the compute applies it only with LongRoPE: elsewhere it would be silently dropped
        raise ModelRefused("UnsupportedRopeScaling", f"rope.scaling.attn_factor {attn_factor} is not supported with "
                                                     f"rope scaling type {kind!r} (only 1.0; any with LongRoPE factors)")
    if kind == "none":
        return RopeScaling()
    if factor <= 0:
        raise ModelRefused("UnsupportedRopeScaling", f"rope scaling factor {factor} must be > 0")
    orig = int(k("rope.scaling.original_context_length", context_length))
    if kind == "llama3":
        return RopeScaling(kind, factor, orig, float(k("rope.scaling.low_freq_factor", 1.0)),
                           float(k("rope.scaling.high_freq_factor", 4.0)))
    return RopeScaling(kind, factor, orig)


def read_longrope(arch: str, tensors: dict[str, TensorInfo], rope_dim: int) -> bool:
    """Whether the file has LongRoPE's factor sets, refusing by name a file with half of them, a set that is not
    [rope_dim/2] (one divisor per rotated pair), an architecture that does not declare them, or `rope_freqs.weight`
    beside them (llama.cpp would turn by rope_freqs and ignore the sets)."""
    present = [t for t in LONGROPE_FACTORS if t in tensors]
    if not present:
        return False
    if not set(LONGROPE_FACTORS) <= set(ARCHITECTURES[arch].every_stage_optional):
        declaring = [n for n, a in ARCHITECTURES.items() if set(LONGROPE_FACTORS) <= set(a.every_stage_optional)]
        raise ModelRefused("UnsupportedArchitecture", f"{arch} file has {', '.join(present)}: LongRoPE factors are "
                                                      f"supported in {', '.join(declaring)} files only")
    missing = [t for t in LONGROPE_FACTORS if t not in tensors]
    if missing:
        raise ModelRefused("MissingTensor", f"{arch} file has {present[0]} but not {missing[0]}: LongRoPE needs both sets")
    if "rope_freqs.weight" in tensors:
        raise ModelRefused("UnsupportedRopeScaling", f"{arch} file has both rope_freqs.weight and {', '.join(present)} "
                                                     f"(supported: one kind of RoPE divisors)")
    for t in LONGROPE_FACTORS:
        if math.prod(tensors[t].dims) != rope_dim // 2 or len(tensors[t].dims) != 1:
            raise ModelRefused("MalformedGGUF", f"tensor {t!r} has shape {list(tensors[t].dims)}, not [{rope_dim // 2}] "
                                                f"(rope.dimension_count {rope_dim} / 2)")
    return True


def bias_refusal(arch: str, tensor_names: Iterable[str], n_layers: int) -> ModelRefused | None:
    """A group of optional per-layer tensors (qwen2's Q/K/V biases) some blocks have and others lack."""
    names = set(tensor_names)
    for group in ARCHITECTURES[arch].optional_layer_groups:
        have = [f"blk.{i}.{t}" in names for i in range(n_layers) for t in group]
        if any(have) and not all(have):
            return ModelRefused("UnsupportedArchitecture", f"some blocks have {', '.join(group)} and some do not "
                                                           f"(supported: all of them in every block, or none)")
    return None


def read_experts(arch: str, k: Callable[..., Any]) -> tuple[int, int, bool]:
    """(experts, experts used per token, renormalise their weights) of a Mixture-of-Experts file ((0, 0, True) for a
    dense one), refusing a router the compute does not implement by name."""
    a = ARCHITECTURES[arch]
    n = int(k("expert_count", 0)) if a.moe != "never" else 0
    if a.moe == "always" and n <= 0:
        raise ModelRefused("MissingMetadata", f"{arch}.expert_count is missing or 0 (a {arch} block has experts)")
    if n <= 0:
        return 0, 0, True
    used = int(k("expert_used_count"))
    if not 0 < used <= n:
        raise ModelRefused("MalformedGGUF", f"{arch}.expert_used_count {used} is not within 1..expert_count {n}")
    gating = int(k("expert_gating_func", EXPERT_GATING_SOFTMAX))
    if gating != EXPERT_GATING_SOFTMAX:
        raise ModelRefused("UnsupportedArchitecture", f"{arch}.expert_gating_func {gating} is not supported "
                                                      f"(supported: {EXPERT_GATING_SOFTMAX}, softmax)")
    scale = float(k("expert_weights_scale", 0.0))
    if scale not in (0.0, 1.0):  # llama.cpp's qwen3moe and llama graphs do not scale the routing weights
        raise ModelRefused("UnsupportedArchitecture", f"{arch}.expert_weights_scale {scale} is not supported (only 1)")
    return n, used, bool(k("expert_weights_norm", True))


def read_params(header: GgufHeader) -> LlamaParams:
    """The hyper-parameters of a llama-family file (support.ARCHITECTURES)."""
    arch = field(header, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelRefused("UnsupportedArchitecture",
                           f"architecture {arch!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})")

    def k(key: str, default: Any = _REQUIRED) -> Any:
        return field(header, f"{arch}.{key}", default)

    dim, n_heads = int(k("embedding_length")), int(k("attention.head_count"))
    if dim <= 0 or n_heads <= 0:
        raise ModelRefused("MalformedGGUF", f"{arch}.embedding_length and attention.head_count must be positive")
    head_dim = int(k("attention.key_length", dim // n_heads))
    if k("attention.value_length", head_dim) != head_dim:
        raise ModelRefused("UnsupportedArchitecture", "key_length != value_length")
    n_layers, ctx = int(k("block_count")), int(k("context_length"))
    if n_layers <= 0 or ctx <= 0:
        raise ModelRefused("MalformedGGUF", f"{arch}.block_count and context_length must be positive")
    names = {t.name for t in header.tensors}
    rope_dim = int(k("rope.dimension_count", head_dim))
    longrope = read_longrope(arch, header.tensor_map(), rope_dim)
    bad = bias_refusal(arch, names, n_layers)
    if bad is not None:
        raise bad
    a = ARCHITECTURES[arch]
    rope_base, rope_scaling = float(k("rope.freq_base", 10000.0)), read_rope_scaling(k, ctx, longrope)
    window = int(k("attention.sliding_window", a.swa_window)) if a.swa_period else 0
    period = k("attention.sliding_window_pattern", a.swa_period)
    if window and (isinstance(period, list) or int(period) <= 0):
        raise ModelRefused("UnsupportedArchitecture", f"{arch}.attention.sliding_window_pattern {period!r} is not "
                                                      f"supported (supported: one period > 0)")
    scale_dim = dim // n_heads if n_layers == a.dim_scaled_attention_layers else head_dim
    n_experts, n_used, weights_norm = read_experts(arch, k)
    # an expert's width: qwen3moe's own key (its feed_forward_length, if any, is a dense layer's); Mixtral's experts are
    # feed_forward_length wide
    ffn = int(k("expert_feed_forward_length")) if a.moe == "always" else int(k("feed_forward_length"))
    return LlamaParams(
        n_layers=n_layers, dim=dim, ffn_dim=ffn, n_heads=n_heads,
        n_kv_heads=int(k("attention.head_count_kv", n_heads)), head_dim=head_dim,
        rope_base=rope_base, rope_dim=rope_dim, rope_scaling=rope_scaling,
        norm_eps=float(k("attention.layer_norm_rms_epsilon")), context_length=ctx,
        vocab_size=int(k("vocab_size", len(field(header, "tokenizer.ggml.tokens", ())))),
        bos_token_id=field(header, "tokenizer.ggml.bos_token_id", None),
        eos_token_id=field(header, "tokenizer.ggml.eos_token_id", None),
        arch=arch, rope_neox=a.rope_neox,
        qkv_bias=QKV_BIAS in a.optional_layer_groups and all(f"blk.0.{t}" in names for t in QKV_BIAS),
        qk_norm=a.qk_norm, attn_scale=1.0 / math.sqrt(scale_dim),
        embed_scale=math.sqrt(dim) if a.embed_scale else 1.0, post_norms=a.post_norms, gelu=a.gelu, swa_window=window,
        swa_layers=tuple(window > 0 and i % int(period) != int(period) - 1 for i in range(n_layers)),
        rope_base_swa=float(k("rope.freq_base_swa", rope_base if a.swa_rope_base is None else a.swa_rope_base)),
        rope_scaling_swa=rope_scaling if a.swa_rope_base is None else RopeScaling(),
        attn_softcap=0.0 if a.attn_softcap is None else float(k("attn_logit_softcapping", a.attn_softcap)),
        final_softcap=0.0 if a.final_softcap is None else float(k("final_logit_softcapping", a.final_softcap)),
        n_experts=n_experts, n_experts_used=n_used, expert_weights_norm=weights_norm)
