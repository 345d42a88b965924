"""Run llama.cpp's own tokenizer test data through swactor's tokenizer (a by-hand check, not CI).

llama.cpp ships vocab-only GGUFs with inputs and expected ids (models/ggml-vocab-NAME.gguf + .inp/.out,
compared with add_special=false, parse_special=false by its test-tokenizer-0). The llama-cpp-python sdist
on PyPI carries them under vendor/llama.cpp:
  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sdist && tar xzf /tmp/sdist/*.tar.gz -C /tmp/sdist
  .venv/bin/python packaging/check_llamacpp_vocab_tests.py /tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/models \\
      llama-spm phi-3 llama-bpe qwen2 gpt-2 starcoder
"""
from __future__ import annotations

import sys
from pathlib import Path

from swactor.modelfile.params import ModelRefused, open_header
from swactor.orchestrator.models.gguf_model import read_tokenizer
from swactor.orchestrator.tokens.tokenizer import Tokenizer, TokenizerError

SEPARATOR = "\n__ggml_vocab_test__\n"


def check(models: Path, name: str) -> bool:
  path = models / f"ggml-vocab-{name}.gguf"
  try:
    data = read_tokenizer(open_header(path))
    tok = Tokenizer(data)
  except (ModelRefused, TokenizerError) as e:
    print(f"{name}: refused: {e}")
    return False
  inputs = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
  outputs = path.with_suffix(".gguf.out").read_text().split("\n")
  bad = [(text, want) for text, want in zip(inputs, outputs, strict=False)
         if tok.encode(text, add_special=False, parse_special=False) != [int(x) for x in want.split()]]
  for text, want in bad[:3]:
    print(f"{name}: {text[:40]!r}: ours {tok.encode(text, add_special=False, parse_special=False)[:12]}, llama.cpp {want[:60]}")
  print(f"{name} ({tok.kind}): {len(inputs) - len(bad)}/{len(inputs)} equal")
  return not bad


def main() -> None:
  models = Path(sys.argv[1])
  results = [check(models, name) for name in sys.argv[2:]]
  sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
  main()
