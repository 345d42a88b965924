"""Judge a model from its GGUF header against what the workers can run (support.py).

Pure: a parsed header in, the refusals out (each a stable reason name and a detail naming the key,
tensor or type). The hyper-parameters are checked by reading them (params.read_params, what the
compute core reads too); which tensors an architecture has, by `unknown_tensors` (the compute
core's check too). The orchestrator calls it at start and at SubmitRun, before any host fetches a
byte; the stage count is checked against the layer count separately (`check_stages`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from swactor.modelfile.header import GgufHeader
from swactor.modelfile.params import LlamaParams, ModelRefused, read_params
from swactor.modelfile.support import ARCHITECTURES, QUANT_TYPES, TOKENIZER_MODELS, Architecture

MAX_LISTED = 4


@dataclass(frozen=True)
class Refusal:
    # Stable name: UnsupportedArchitecture | MissingMetadata | UnsupportedRopeScaling | UnsupportedTokenizer
    # | UnsupportedQuantType | MissingTensor | MalformedGGUF | TooManyStages
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(items[:MAX_LISTED]) + more


def architecture(header: GgufHeader) -> Architecture | None:
    return ARCHITECTURES.get(str(header.get("general.architecture", "")))


def unknown_tensors(arch: Architecture, names: Iterable[str], n_layers: int, experts: bool = False) -> list[str]:
    """Tensors of the file nothing reads: a variant of the architecture the compute does not implement (with
    `experts`, a Mixture-of-Experts file: a dense FFN tensor, or a shared expert, is one)."""
    layer_known, global_known = arch.known_layer_tensors(experts), arch.known_global_tensors()
    unknown = []
    for name in sorted(names):
        if name.startswith("blk."):
            parts = name.split(".", 2)
            if len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) >= n_layers or parts[2] not in layer_known:
                unknown.append(name)
        elif name not in global_known:
            unknown.append(name)
    return unknown


def unknown_tensors_refusal(arch: Architecture, names: Iterable[str], n_layers: int,
                            experts: bool = False) -> Refusal | None:
    unknown = unknown_tensors(arch, names, n_layers, experts)
    if not unknown:
        return None
    return Refusal("UnsupportedArchitecture",
                   f"{arch.name} file has tensor(s) the compute does not implement: {_listed(unknown)}")


def judge(header: GgufHeader, file_size: int | None = None) -> list[Refusal]:
    """Every reason the workers (and the orchestrator's tokenizer) cannot run this model; [] = runnable."""
    out: list[Refusal] = []
    try:
        params: LlamaParams | None = read_params(header)  # architecture, hyper-parameters, RoPE scaling
    except ModelRefused as e:
        params = None
        out.append(Refusal(e.reason, e.detail))
    tok = header.get("tokenizer.ggml.model")
    if tok is None or header.get("tokenizer.ggml.tokens") is None:
        out.append(Refusal("UnsupportedTokenizer", "the GGUF has no tokenizer (tokenizer.ggml.model / tokens missing)"))
    elif tok not in TOKENIZER_MODELS:
        out.append(Refusal("UnsupportedTokenizer",
                           f"tokenizer.ggml.model {tok!r} is not supported (supported: {', '.join(sorted(TOKENIZER_MODELS))})"))
    bad_types: dict[str, list[str]] = {}
    for t in header.tensors:
        if t.type_name not in QUANT_TYPES:
            bad_types.setdefault(t.type_name, []).append(t.name)
    for type_name, names in sorted(bad_types.items()):
        out.append(Refusal("UnsupportedQuantType",
                           f"{len(names)} tensor(s) of type {type_name} ({_listed(names)}); supported: "
                           f"{', '.join(sorted(QUANT_TYPES))}"))
    if file_size is not None:
        beyond = [t.name for t in header.tensors if t.nbytes >= 0 and header.data_offset + t.offset + t.nbytes > file_size]
        if beyond:
            out.append(Refusal("MalformedGGUF", f"tensor(s) {_listed(beyond)} end beyond the file's {file_size} bytes"))
    if params is not None:
        out += _judge_layout(header, ARCHITECTURES[params.arch], params.n_layers, params.moe)
    return out


def _judge_layout(header: GgufHeader, arch: Architecture, n: int, experts: bool = False) -> list[Refusal]:
    out: list[Refusal] = []
    names = {t.name for t in header.tensors}
    missing = [f"blk.{i}.{t}" for i in range(n) for t in arch.block_tensors(experts) if f"blk.{i}.{t}" not in names]
    missing += [t for t in (*arch.first_stage, *arch.last_stage) if t not in names]
    if arch.head not in names and arch.tied_head not in names:
        missing.append(arch.head)
    if missing:
        out.append(Refusal("MissingTensor", f"{len(missing)} tensor(s) missing: {_listed(missing)}"))
    unknown = unknown_tensors_refusal(arch, names, n, experts)
    if unknown is not None:
        out.append(unknown)
    return out


def check_stages(header: GgufHeader, stages: int) -> Refusal | None:
    arch = architecture(header)
    n = int(header.get(f"{arch.name}.block_count", 0)) if arch else 0
    if stages > n:
        return Refusal("TooManyStages", f"{stages} stages requested but the model has {n} blocks (one block per stage at least)")
    return None
