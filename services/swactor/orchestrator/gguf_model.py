"""Model facts and tokenizer vocabulary read from a GGUF file's metadata (spec §11 GgufModelPlan).

Only metadata is read (GGUFReader memory-maps the file); tensor bytes are never touched here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from swactor.v1 import common_pb2


class ModelError(ValueError):
    """The GGUF is unreadable or lacks a fact the orchestrator needs; the message names it."""


@dataclass(frozen=True)
class TokenizerData:
    """The `tokenizer.ggml.*` keys, as stored in the GGUF."""

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    pad_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    chat_template: str | None


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs to know about the model (spec §11 GgufModelPlan)."""

    model_id: str
    path: Path
    architecture: str
    num_layers: int
    hidden_dim: int
    max_seq_len: int
    vocab_size: int
    # Activations travel between stages as float32 rows of hidden_dim elements.
    dtype_family: int = common_pb2.DTYPE_FAMILY_FLOAT
    dtype_width_bytes: int = 4
    eos_token_id: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _field(reader: GGUFReader, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def _required(reader: GGUFReader, key: str, path: Path) -> Any:
    value = _field(reader, key)
    if value is None:
        raise ModelError(f"{path}: GGUF metadata key {key!r} is missing")
    return value


def open_reader(path: Path) -> GGUFReader:
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    try:
        return GGUFReader(path)
    except Exception as e:  # the gguf package raises ValueError/struct errors for bad files
        raise ModelError(f"{path}: not a readable GGUF file: {e}") from None


def read_model(path: Path, model_id: str | None = None, reader: Any = None) -> tuple[ModelFacts, TokenizerData]:
    """`reader`: anything with GGUFReader's `.fields[key].contents()` (modelfile.header.HeaderFields
    for a header read without the file); None = open `path`."""
    reader = reader if reader is not None else open_reader(path)
    arch = _required(reader, "general.architecture", path)
    tokens = _required(reader, "tokenizer.ggml.tokens", path)
    tok = TokenizerData(
        model=_required(reader, "tokenizer.ggml.model", path),
        pre=_field(reader, "tokenizer.ggml.pre") or "default",
        tokens=list(tokens),
        token_types=list(_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)),
        merges=list(_field(reader, "tokenizer.ggml.merges") or []),
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        eot_id=_field(reader, "tokenizer.ggml.eot_token_id"),
        eom_id=_field(reader, "tokenizer.ggml.eom_token_id"),
        pad_id=_field(reader, "tokenizer.ggml.padding_token_id"),
        add_bos=_field(reader, "tokenizer.ggml.add_bos_token"),
        add_eos=_field(reader, "tokenizer.ggml.add_eos_token"),
        chat_template=_field(reader, "tokenizer.chat_template"),
    )
    vocab = _field(reader, f"{arch}.vocab_size") or len(tokens)
    facts = ModelFacts(
        model_id=model_id or path.stem,
        path=path,
        architecture=arch,
        num_layers=int(_required(reader, f"{arch}.block_count", path)),
        hidden_dim=int(_required(reader, f"{arch}.embedding_length", path)),
        max_seq_len=int(_required(reader, f"{arch}.context_length", path)),
        vocab_size=int(vocab),
        eos_token_id=int(tok.eos_id if tok.eos_id is not None else 0),
    )
    if facts.num_layers <= 0 or facts.hidden_dim <= 0 or facts.max_seq_len <= 0:
        raise ModelError(f"{path}: block_count/embedding_length/context_length must be positive")
    return facts, tok
