"""The CUDA path without a GPU: every kernel a stage runs is rendered by tinygrad's CUDA renderer and compiled by NVRTC
(the PyPI wheel nvidia-cuda-nvrtc-cu12, a dev dependency) to a cubin for sm_90, the H100/H200 generation, on tinygrad's
NULL device (cuda_render.py). A kernel that only a CUDA host would refuse (an unsupported dtype, a cast the renderer
lacks, a launch beyond the target's limits) fails here, before a GPU is lent. A stage's steps after prepare() compile
nothing more: a CUDA worker never stops mid-run to compile."""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from swactor.worker.compute.linear import PACKED
from swactor.worker.process.device import find_nvrtc, nvrtc_wheel_library

ROOT = Path(__file__).resolve().parents[2]


def nvrtc_library() -> Path:
  lib = nvrtc_wheel_library()
  if lib is None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
      pytest.skip(f"NVRTC has no wheel for {platform.system()} {platform.machine()}")
    pytest.fail("libnvrtc.so.12 not found: install the dev dependencies (`make setup`: the cuda extra, nvidia-cuda-nvrtc-cu12)")
  return lib


def test_the_compute_process_names_the_wheels_nvrtc_for_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.delenv("NVRTC_PATH", raising=False)
  find_nvrtc("CPU")
  assert "NVRTC_PATH" not in os.environ
  find_nvrtc("CUDA:1")
  assert os.environ["NVRTC_PATH"] == str(nvrtc_library())
  monkeypatch.setenv("NVRTC_PATH", "/opt/cuda/lib64/libnvrtc.so")  # the operator's own is kept
  find_nvrtc("CUDA")
  assert os.environ["NVRTC_PATH"] == "/opt/cuda/lib64/libnvrtc.so"
  monkeypatch.delenv("NVRTC_PATH")

  def no_nvidia_package(name: str) -> None:  # a host without the cuda extra has no `nvidia` package at all
    raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")

  monkeypatch.setattr(importlib.util, "find_spec", no_nvidia_package)
  assert nvrtc_wheel_library() is None
  find_nvrtc("CUDA")
  assert "NVRTC_PATH" not in os.environ


@pytest.mark.timeout(300)
def test_every_kernel_of_a_stage_compiles_for_sm90(model_path: str, tmp_path: Path) -> None:
  env = {**os.environ, "DEV": "NULL:CUDA:sm_90", "NVRTC_PATH": str(nvrtc_library()),
         "CACHELEVEL": "0",          # tinygrad's kernel cache off: every kernel is compiled here, none read back
         "NULL_ALLOW_COPYOUT": "1",  # the NULL device's reads return nothing: a step runs, its values are not looked at
         "PARALLEL": "0",
         "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT)])}
  proc = subprocess.run([sys.executable, str(Path(__file__).with_name("cuda_render.py")), model_path, str(tmp_path)],
                        env=env, capture_output=True, text=True, timeout=280)
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert (out["renderer"], out["arch"], out["compiler"]) == ("CUDARenderer", "sm_90", "NVRTCCompiler"), out
  assert out["programs"] > 100 and out["cubins"] == out["programs"], out  # each one an sm_90 ELF from NVRTC
  for stage in out["stages"]:
    assert stage["widths"] == [1, 8, 2] and stage["compiled_by_steps"] == 0, stage
  whole, *small, moe = out["stages"]
  assert whole["new_programs"] > 0 and whole["graphs"] == 9, whole
  assert all(set(s["kinds"]) == {*PACKED.values(), "f32"} for s in small), small  # every packed kind, one expanded
  assert moe["new_programs"] > 0 and {"q4_k", "q4", "q8_0", "f32"} <= set(moe["kinds"]), moe  # experts gathered by id
  assert small[1]["new_programs"] > 0, small  # qwen2's biases and NeoX rotation are kernels of their own
  assert small[2]["new_programs"] > 0, small  # so are qwen3's per-head Q/K norms
  assert small[3]["new_programs"] > 0, small  # gemma3's post-norms, GELU and its sliding block's ring and mask
