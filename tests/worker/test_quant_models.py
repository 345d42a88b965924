"""Whole models in other quant types through StageModel: SmolLM2 re-quantized to Q4_K_M, Q6_K, Q5_0, Q8_0 and IQ4_XS
(with IQ4_NL where rows are not whole 256-blocks; tests/fixtures/gguf_fixtures.py) against the float64 reference and
llama.cpp's recorded tokens, and a small random model in the types that are expanded to float32 at load."""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from reference import Reference
from structlog.testing import capture_logs
from test_model import generate

from swactor.modelfile.header import read_header
from swactor.modelfile.memory import MemoryProfile, memory_profile
from swactor.worker.compute import GGUFModel, StageModel
from swactor.worker.compute.linear import PACKED, device_nbytes
from swactor.worker.compute.quant import BLOCK
from tests.fixtures.gguf_fixtures import (
    BUILDER_VERSION,
    MIXES,
    SMALL_DIM,
    SMALL_LAYERS,
    build,
    sha256,
    small_fields,
    small_shapes,
    write_raw,
)

FIXTURE = json.loads((pathlib.Path(__file__).resolve().parents[1] / "fixtures/llamacpp_quant_greedy.json").read_text())
REF_TIE, LLAMA_TIE = 0.02, 0.2  # compare up to the first step whose top-2 logit gap is below this
SPLITS = {1: [(0, 30)], 3: [(0, 5), (5, 19), (19, 30)]}  # one stage; a first, an interior and a last one


@dataclass
class Requantized:
  mix: str
  model: GGUFModel
  cases: list[dict]
  reference: list[tuple[list[int], list[float]]]  # float64 greedy tokens and top-2 gaps per case


@pytest.fixture(scope="module", params=list(MIXES))
def requantized(request: pytest.FixtureRequest, model_path: str) -> Requantized:
  """One file at a time (the float64 reference of a file holds ~1 GB)."""
  mix, rec = request.param, FIXTURE["files"][request.param]
  path = build(mix)
  assert FIXTURE["builder_version"] == BUILDER_VERSION and sha256(path) == rec["sha256"], \
    f"{path} is not the file llama.cpp ran: re-record tests/fixtures/llamacpp_quant_greedy.json (packaging/record_quant_fixture.py)"
  ref = Reference(path)  # KV-cached float64 greedy, once per (file, prompt), kept under .cache/reference/
  reference = [ref.greedy(c["prompt_tokens"], len(c["greedy_tokens"])) for c in rec["cases"]]
  return Requantized(mix, GGUFModel(path), rec["cases"], reference)


def planner_profile(path: str | pathlib.Path) -> MemoryProfile:
  """What the orchestrator plans a file's stages by (modelfile.memory), from its header alone."""
  with open(path, "rb") as f:
    return memory_profile(read_header(lambda n: (f.seek(0), f.read(n))[1])[0])


def first_below(gaps: list[float], tie: float) -> int:
  return next((i for i, g in enumerate(gaps) if g < tie), len(gaps))


def greedy_equals_reference(requantized: Requantized, chain: list[StageModel]) -> list[tuple[list[int], list[np.ndarray], int]]:
  """Each case's greedy tokens from the chain, asserted equal to the float64 reference's up to its first step whose
  top-2 gap is below REF_TIE: (tokens, logits, steps compared) per case."""
  runs = []
  for case, (ref_tokens, ref_gaps) in zip(requantized.cases, requantized.reference, strict=True):
    logits: list[np.ndarray] = []
    ours = generate(chain, case["prompt_tokens"], len(ref_tokens), logits)
    cut = first_below(ref_gaps, REF_TIE)
    assert ours[:cut] == ref_tokens[:cut], f"{requantized.mix} S={len(chain)} {case['prompt']}: differs from float64 before step {cut}"
    runs.append((ours, logits, cut))
  return runs


@pytest.mark.slow  # the float64 reference of 5 files + 20 stage models (S=1 and S=3): minutes at load average ~10 on the shared 2-core box
@pytest.mark.parametrize("n_stages", [1, 3])
def test_greedy_equals_reference_and_llamacpp(requantized: Requantized, n_stages: int) -> None:
  """Each stage holds what the planner estimates for it; greedy tokens equal the float64 reference's and llama.cpp's."""
  chain = [StageModel(requantized.model, a, b, max_seq_len=64) for a, b in SPLITS[n_stages]]
  profile = planner_profile(requantized.model.path)
  for (a, b), m in zip(SPLITS[n_stages], chain, strict=True):
    want = profile.stage(a, b, 64, rows=1)
    assert (want.weights - (m.embd.nbytes if m.is_first else 0), want.kv_cache) == (m.memory.device_bytes, m.memory.cache_bytes)
  compared = [0, 0]  # steps compared with the reference, with llama.cpp
  for case, (ours, logits, cut) in zip(requantized.cases, greedy_equals_reference(requantized, chain), strict=True):
    ours_gaps = [float(np.diff(np.sort(lg)[-2:])[0]) for lg in logits]
    cut2 = first_below([min(a, b) for a, b in zip(case["top2_gap"], ours_gaps, strict=True)], LLAMA_TIE)
    assert ours[:cut2] == case["greedy_tokens"][:cut2], f"{requantized.mix} S={n_stages} {case['prompt']}: differs from llama.cpp before step {cut2}"
    compared = [compared[0] + cut, compared[1] + cut2]
  assert min(compared) >= 8, f"{requantized.mix}: too few steps before a near-tie to compare: {compared}"


def test_packed_types_stay_packed(requantized: Requantized) -> None:
  """Device bytes are the packed layouts' (linear.device_nbytes) plus float32 norms: nothing expanded."""
  with capture_logs() as logs:
    m = StageModel(requantized.model, 0, 30, max_seq_len=16)
  assert not [e for e in logs if e["event"] == "compute_weights_expanded"]
  ts = [t for t in requantized.model.tensors.values() if t.name != "token_embd.weight" or "output.weight" not in requantized.model.tensors]
  assert {t.qtype for t in ts if len(t.shape) == 2} <= set(PACKED)
  assert m.memory.device_bytes == sum(device_nbytes(t.qtype, *t.shape) if len(t.shape) == 2 else 4 * t.shape[0] for t in ts)
  assert m.memory.file_bytes == sum(t.nbytes for t in ts)


# --- a small random llama in the types the device does not keep packed (next to packed Q5_1, IQ4_NL, IQ4_XS): the gguf package's
# dequantizers at load, float32 on the device; random block bytes with finite float16 scales, no quantizer needed
F16_AT = {QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.IQ4_NL: [0], QT.IQ4_XS: [0], QT.TQ2_0: [64], QT.IQ2_XXS: [0], QT.Q5_1: [0, 2]}
TYPES = {"token_embd": QT.IQ4_XS, "output": QT.Q3_K,
         "blk.0.attn_q": QT.Q2_K, "blk.0.attn_k": QT.IQ4_NL, "blk.0.attn_v": QT.F16, "blk.0.attn_output": QT.BF16,
         "blk.0.ffn_gate": QT.TQ2_0, "blk.0.ffn_up": QT.Q5_1, "blk.0.ffn_down": QT.Q2_K,
         "blk.1.attn_q": QT.Q5_1, "blk.1.attn_k": QT.Q5_1, "blk.1.attn_v": QT.Q5_1, "blk.1.attn_output": QT.IQ2_XXS,
         "blk.1.ffn_gate": QT.Q3_K, "blk.1.ffn_up": QT.IQ4_XS, "blk.1.ffn_down": QT.F16}


def _random_tensor(qt: QT, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
  if qt in (QT.F16, QT.BF16):
    a = (rng.normal(size=(rows, cols)) * 0.05).astype(np.float32)
    return a.astype(np.float16) if qt == QT.F16 else (a.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
  n, nb = BLOCK[qt]
  b = rng.integers(0, 256, size=(rows, cols // n, nb), dtype=np.uint8)
  for p in F16_AT[qt]:
    b[:, :, p:p + 2] = (rng.normal(size=(rows, cols // n, 1)) * 0.01).astype(np.float16).view(np.uint8)
  return b.reshape(rows, -1)


def small_model(path: pathlib.Path) -> dict[str, tuple[int, int]]:
  """Writes the model; returns the matrices' shapes."""
  rng = np.random.default_rng(7)
  shapes = small_shapes()
  tensors = {f"{n}.weight": (_random_tensor(TYPES[n], *s, rng), TYPES[n]) for n, s in shapes.items()}
  for n in ["output_norm", *(f"blk.{i}.{k}" for i in range(SMALL_LAYERS) for k in ("attn_norm", "ffn_norm"))]:
    tensors[f"{n}.weight"] = ((1 + 0.1 * rng.normal(size=SMALL_DIM)).astype(np.float32), QT.F32)
  write_raw(path, "llama", small_fields("llama"), tensors)
  return shapes


def test_other_types_expand_at_load_and_match_reference(tmp_path: pathlib.Path) -> None:
  shapes = small_model(path := tmp_path / "small.gguf")
  with capture_logs() as logs:
    m = StageModel(path, 0, 2, max_seq_len=32)
  (ev,) = [e for e in logs if e["event"] == "compute_weights_expanded"]
  expanded = {n: s for n, s in shapes.items() if n != "token_embd" and TYPES[n] not in PACKED}  # the embedding stays on the host
  assert set(ev["types"]) == {TYPES[n].name for n in expanded} and ev["tensors"] == len(expanded)
  assert ev["float32_bytes"] == sum(4 * r * c for r, c in expanded.values())
  assert m.memory.device_bytes == sum(device_nbytes(TYPES[n], *s) for n, s in shapes.items() if n != "token_embd") + 5 * 4 * SMALL_DIM
  est = planner_profile(path).stage(0, 2, 32, rows=1)  # the planner's estimate from the header alone agrees
  assert (est.weights - m.embd.nbytes, est.kv_cache) == (m.memory.device_bytes, m.memory.cache_bytes)
  prompt = [5, 17, 260, 3]
  want, gaps = Reference(path).greedy(prompt, 8)
  cut = first_below(gaps, REF_TIE)
  assert cut > 0 and generate([m], prompt, 8)[:cut] == want[:cut]
