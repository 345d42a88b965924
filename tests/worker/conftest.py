from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # reference.py
MODEL = pathlib.Path(__file__).resolve().parents[2] / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def model_path() -> str:
  if not MODEL.exists():
    pytest.skip(f"default model missing: {MODEL} (run `make model`)")
  return str(MODEL)


@pytest.fixture(scope="session")
def gguf_model(model_path: str):  # parsed once: GGUFReader takes ~2 s on this model
  from swactor.worker.compute.gguf_weights import GGUFModel
  return GGUFModel(model_path)
