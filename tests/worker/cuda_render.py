"""Compile every kernel of a stage for NVIDIA's sm_90 without a GPU: run as a child of test_cuda_render.py with
DEV=NULL:CUDA:sm_90, so tinygrad's NULL device (buffers without memory, programs that never run) renders each kernel
with its CUDA renderer and compiles it with NVRTC to a cubin, as a rented CUDA host would at a stage's load.

    python tests/worker/cuda_render.py MODEL.gguf SMALL_DIR  ->  one JSON line on stdout

What is compiled: StageModel.prepare() of MODEL as one stage (its layer graphs are every stage's, and its head) (decode rows, 8-row prefill
chunks and batched rows of 2 runs in flight, the head), and of a small llama, a small qwen2 (biases, NeoX rotation) and
a small qwen3 (per-head Q/K norms, NeoX rotation) and a small gemma3 (its post-norms, GELU, the sliding block's KV ring)
whose layers hold every packed type and two types expanded to float32, and a small qwen3moe (a router, experts in Q4_K, Q4_1 and Q8_0 gathered by the routed ids). The weights of the small files are zeros:
nothing runs, only the kernels' code matters."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType

from swactor.worker.compute import GGUFModel, StageModel
from swactor.worker.compute.linear import PACKED
from swactor.worker.compute.model import BatchRow
from swactor.worker.compute.quant import BLOCK
from tests.fixtures.gguf_fixtures import (
  SMALL_DIM,
  SMALL_HEADS,
  SMALL_LAYERS,
  SMALL_MATRICES,
  Field,
  small_fields,
  small_moe,
  small_shapes,
  write_raw,
)

# layer 0 and 1: every packed type, and F16 / Q2_K (expanded to float32 at load) beside them
LAYER_TYPES = [[QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K],
               [QT.Q6_K, QT.Q2_K, QT.F16, QT.IQ4_NL, QT.IQ4_XS, QT.Q6_K, QT.Q5_0]]
TYPES = {"token_embd": QT.Q8_0, "output": QT.Q6_K,
         **{f"blk.{i}.{m}": qt for i, types in enumerate(LAYER_TYPES) for m, qt in zip(SMALL_MATRICES, types, strict=True)}}


def _zeros(qt: QT, rows: int, cols: int) -> np.ndarray:
  if qt == QT.F16:
    return np.zeros((rows, cols), np.float16)
  n, nb = BLOCK[qt]
  return np.zeros((rows, cols // n * nb), np.uint8)


def small_model(path: Path, arch: str) -> Path:
  """gguf_fixtures' small model in LAYER_TYPES, weights all zero; qwen2's with the Q/K/V biases, qwen3's with the
  per-head Q/K norms, gemma3's with those and its post-norms, its first block sliding (a window of 3: a ring)."""
  shapes = small_shapes()
  tensors = {f"{n}.weight": (_zeros(TYPES[n], *s), TYPES[n]) for n, s in shapes.items()}
  for n in ["output_norm", *(f"blk.{i}.{k}" for i in range(SMALL_LAYERS) for k in ("attn_norm", "ffn_norm"))]:
    tensors[f"{n}.weight"] = (np.ones(SMALL_DIM, np.float32), QT.F32)
  if arch == "qwen2":
    for i in range(SMALL_LAYERS):
      for m in ("attn_q", "attn_k", "attn_v"):
        tensors[f"blk.{i}.{m}.bias"] = (np.zeros(shapes[f"blk.{i}.{m}"][0], np.float32), QT.F32)
  fields = small_fields(arch)
  if arch in ("qwen3", "gemma3"):
    for i in range(SMALL_LAYERS):
      for m in ("attn_q_norm", "attn_k_norm"):
        tensors[f"blk.{i}.{m}.weight"] = (np.ones(SMALL_DIM // SMALL_HEADS, np.float32), QT.F32)
  if arch == "gemma3":
    for i in range(SMALL_LAYERS):
      for m in ("post_attention_norm", "post_ffw_norm"):
        tensors[f"blk.{i}.{m}.weight"] = (np.ones(SMALL_DIM, np.float32), QT.F32)
    fields += [Field("gemma3.attention.sliding_window", 3, GGUFValueType.UINT32),
               Field("gemma3.attention.sliding_window_pattern", 2, GGUFValueType.UINT32)]
  write_raw(path, arch, fields, tensors)
  return path


# a small qwen3moe's experts: packed kinds kept packed (the down matrices' rows are 64 wide: no 256-blocks)
EXPERT_TYPES = {"ffn_gate_exps": QT.Q4_K, "ffn_up_exps": QT.Q4_1, "ffn_down_exps": QT.Q8_0}


def small_moe_model(path: Path) -> Path:
  """gguf_fixtures' small qwen3moe, its experts in EXPERT_TYPES, all zero, its router float32."""
  fields, tensors = small_moe("qwen3moe")
  for name, (a, _) in list(tensors.items()):
    kind = name.split(".")[-2]
    if kind in EXPERT_TYPES:
      n, nb = BLOCK[EXPERT_TYPES[kind]]
      tensors[name] = (np.zeros((*a.shape[:-1], a.shape[-1] // n * nb), np.uint8), EXPERT_TYPES[kind])
  write_raw(path, "qwen3moe", fields, tensors)
  return path


def compiled_programs() -> list[Any]:
  """The programs tinygrad lowered and compiled in this process (its compile cache is off: each one was compiled)."""
  from tinygrad.engine.realize import to_program_cache
  from tinygrad.uop.ops import Ops
  return [p for p in to_program_cache.values() if p.op is Ops.PROGRAM and p.src[-1].op is Ops.BINARY]


def stage_report(name: str, model: Path, start: int, end: int | None) -> dict[str, Any]:
  before = len(compiled_programs())
  m = StageModel(model, start, end if end is not None else GGUFModel(model).params.n_layers, device="NULL", max_seq_len=64, prefill_chunk=8, slots=2)
  report = m.prepare()
  prepared = len(compiled_programs())
  for slot, prompt in enumerate(([1, 2, 3], [4] * 11)):  # a prompt in one chunk, one in two; then both decode as a batch
    m.reset(slot=slot)
    m.step(rows(m, prompt), 0, slot=slot)
  m.step_batch([BatchRow(s, n, rows(m, [5])) for s, n in ((0, 3), (1, 11))])
  kinds = sorted({k for L in m.layers for g in L.kinds for k in g} | ({m.head[1][0]} if m.head else set()))
  return {"stage": name, "graphs": report.graphs, "widths": list(m.widths), "kinds": kinds,
          "new_programs": prepared - before, "compiled_by_steps": len(compiled_programs()) - prepared}


def rows(m: StageModel, tokens: list[int]) -> np.ndarray:
  """A step's input: token ids for a first stage, activations for the others."""
  return np.asarray(tokens, np.int32) if m.is_first else np.zeros((len(tokens), m.hidden_dim), np.float32)


def main(model: str, small_dir: str) -> None:
  from tinygrad import Device
  dev = Device["NULL"]
  stages = [stage_report("whole", Path(model), 0, None)]
  for arch in ("llama", "qwen2", "qwen3", "gemma3"):
    small = small_model(Path(small_dir) / f"{arch}.gguf", arch)
    stages.append(stage_report(f"small {arch}", small, 0, SMALL_LAYERS))
  stages.append(stage_report("small qwen3moe", small_moe_model(Path(small_dir) / "qwen3moe.gguf"), 0, SMALL_LAYERS))
  programs = compiled_programs()
  print(json.dumps({
      "renderer": type(dev.renderer).__name__, "arch": dev.renderer.target.arch,
      "compiler": type(dev.renderer.compiler).__name__, "stages": stages, "programs": len(programs),
      "cubins": sum(bytes(p.src[-1].arg).startswith(b"\x7fELF") for p in programs),
      "packed_kinds": sorted(set(PACKED.values())),
  }))


if __name__ == "__main__":
  main(*sys.argv[1:])
