"""Model facts and tokenizer vocabulary from a GGUF file's header (spec §11 GgufModelPlan): the
hyper-parameters through swactor.modelfile.params, the reader the compute core uses too, so the
orchestrator refuses a model the stages could not load, before planning."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swactor.modelfile.header import GgufHeader
from swactor.modelfile.memory import MemoryProfile
from swactor.modelfile.params import field as metadata
from swactor.modelfile.params import open_header, read_params
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


def read_tokenizer(header: GgufHeader) -> TokenizerData:
    """The `tokenizer.ggml.*` keys of a GGUF header (swactor.modelfile.params.open_header for a file)."""
    tokens = metadata(header, "tokenizer.ggml.tokens")
    return TokenizerData(
        model=metadata(header, "tokenizer.ggml.model"),
        pre=metadata(header, "tokenizer.ggml.pre", None) or "default",
        tokens=list(tokens),
        token_types=list(metadata(header, "tokenizer.ggml.token_type", None) or [1] * len(tokens)),
        merges=list(metadata(header, "tokenizer.ggml.merges", None) or []),
        bos_id=metadata(header, "tokenizer.ggml.bos_token_id", None),
        eos_id=metadata(header, "tokenizer.ggml.eos_token_id", None),
        eot_id=metadata(header, "tokenizer.ggml.eot_token_id", None),
        eom_id=metadata(header, "tokenizer.ggml.eom_token_id", None),
        pad_id=metadata(header, "tokenizer.ggml.padding_token_id", None),
        add_bos=metadata(header, "tokenizer.ggml.add_bos_token", None),
        add_eos=metadata(header, "tokenizer.ggml.add_eos_token", None),
        chat_template=metadata(header, "tokenizer.chat_template", None),
        scores=list(metadata(header, "tokenizer.ggml.scores", None) or []),
        unk_id=metadata(header, "tokenizer.ggml.unknown_token_id", None),
        add_space_prefix=metadata(header, "tokenizer.ggml.add_space_prefix", None),
    )


def read_model(path: Path, model_id: str | None = None, header: GgufHeader | None = None) -> tuple[ModelFacts, TokenizerData]:
    """The model's facts and tokenizer vocabulary; ModelRefused (swactor.modelfile.params) names what is
    wrong. `header`: the file's header when it was read already (a URL source's); None = read `path`'s."""
    header = header if header is not None else open_header(path)
    params = read_params(header)
    tok = read_tokenizer(header)
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
