"""Model facts and tokenizer vocabulary from a GGUF file's metadata (spec §11 GgufModelPlan), through
the one GGUF metadata reader (swactor.common.gguf) the compute core uses too: the orchestrator
refuses a model the stages could not load, before planning."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swactor.common import gguf
from swactor.modelfile.memory import MemoryProfile
from swactor.v1 import common_pb2


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
    # SentencePiece (`llama`) vocabularies: piece scores, the unknown piece, the leading-space rule.
    scores: list[float] = field(default_factory=list)
    unk_id: int | None = None
    add_space_prefix: bool | None = None


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
    # Device memory by part, from the header's tensor table (None: unknown; placement then ignores memory).
    memory: MemoryProfile | None = None


def read_tokenizer(reader: Any) -> TokenizerData:
    """The `tokenizer.ggml.*` keys of an opened GGUF (swactor.common.gguf.open_gguf)."""
    tokens = gguf.field(reader, "tokenizer.ggml.tokens")
    return TokenizerData(
        model=gguf.field(reader, "tokenizer.ggml.model"),
        pre=gguf.field(reader, "tokenizer.ggml.pre", None) or "default",
        tokens=list(tokens),
        token_types=list(gguf.field(reader, "tokenizer.ggml.token_type", None) or [1] * len(tokens)),
        merges=list(gguf.field(reader, "tokenizer.ggml.merges", None) or []),
        bos_id=gguf.field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_id=gguf.field(reader, "tokenizer.ggml.eos_token_id", None),
        eot_id=gguf.field(reader, "tokenizer.ggml.eot_token_id", None),
        eom_id=gguf.field(reader, "tokenizer.ggml.eom_token_id", None),
        pad_id=gguf.field(reader, "tokenizer.ggml.padding_token_id", None),
        add_bos=gguf.field(reader, "tokenizer.ggml.add_bos_token", None),
        add_eos=gguf.field(reader, "tokenizer.ggml.add_eos_token", None),
        chat_template=gguf.field(reader, "tokenizer.chat_template", None),
        scores=list(gguf.field(reader, "tokenizer.ggml.scores", None) or []),
        unk_id=gguf.field(reader, "tokenizer.ggml.unknown_token_id", None),
        add_space_prefix=gguf.field(reader, "tokenizer.ggml.add_space_prefix", None),
    )


def read_model(path: Path, model_id: str | None = None, reader: Any = None) -> tuple[ModelFacts, TokenizerData]:
    """The model's facts and tokenizer vocabulary; ModelRefused (swactor.common.gguf) names what is wrong.
    `reader`: anything with GGUFReader's `.fields[key].contents()` (modelfile.header.HeaderFields
    for a header read without the file); None = open `path`."""
    reader = reader if reader is not None else gguf.open_gguf(path)
    params = gguf.read_params(reader)
    tok = read_tokenizer(reader)
    facts = ModelFacts(
        model_id=model_id or path.stem,
        path=path,
        architecture=params.arch,
        num_layers=params.n_layers,
        hidden_dim=params.dim,
        max_seq_len=params.context_length,
        vocab_size=params.vocab_size or len(tok.tokens),
        eos_token_id=int(tok.eos_id if tok.eos_id is not None else 0),
    )
    return facts, tok
