"""The float64 reference's own GGUF reading (reference.read_gguf) against gguf's GGUFReader: the same key-values, and
every tensor with the same type, shape and bytes. The reference skips GGUFReader for speed; this keeps it honest."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType
from reference import read_gguf

from tests.fixtures import gguf_fixtures


@pytest.mark.parametrize("mix", ["source", "Q4_K_M"])
def test_read_gguf_equals_gguf_reader(model_path: str, mix: str) -> None:
  path = model_path if mix == "source" else str(gguf_fixtures.build(mix))
  kv, tensors = read_gguf(path)
  r = GGUFReader(path, "r")
  want = {k: f.contents() for k, f in r.fields.items() if not k.startswith(("GGUF.", "tokenizer.ggml."))}
  assert kv == want
  assert any(f.types == [GGUFValueType.ARRAY, GGUFValueType.STRING] for f in r.fields.values())  # stepped over above
  assert list(tensors) == [t.name for t in r.tensors]
  for t in r.tensors:
    got = tensors[t.name]
    assert (got.qtype, got.shape) == (t.tensor_type, tuple(int(s) for s in reversed(t.shape))), t.name
    assert np.array_equal(got.data, np.asarray(t.data).reshape(-1).view(np.uint8)), t.name


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path: pathlib.Path) -> None:
  bad = tmp_path / "weights.bin"
  bad.write_bytes(b"GGML" + bytes(60))
  with pytest.raises(ValueError, match=r"weights\.bin is not a GGUF file"):
    read_gguf(bad)
