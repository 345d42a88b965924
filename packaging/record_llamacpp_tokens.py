"""Record llama.cpp's token ids and pieces for the test vocabularies -> tests/fixtures/llamacpp_tokens.json.

The reference for tests/orchestrator/test_tokenizer_llamacpp.py. Runs under a separate venv holding
llama-cpp-python (it compiles llama.cpp, ~15 min; kept out of CI) plus the gguf writer:
  python3.11 -m venv /tmp/llama-venv && /tmp/llama-venv/bin/pip install llama-cpp-python==0.3.36
  /tmp/llama-venv/bin/pip install --target /tmp/tok-gguf-lib --no-deps gguf==0.19.0 pyyaml tqdm
  PYTHONPATH=/tmp/tok-gguf-lib /tmp/llama-venv/bin/python packaging/record_llamacpp_tokens.py
Vocabularies: SmolLM2's byte-level BPE (the default model's GGUF, loaded vocab-only) and the test
SentencePiece vocabulary (tests/fixtures/spm_vocab.json written as a vocab-only GGUF, with and without
the leading-space rule). Ids come from llama_tokenize (add_special = add_bos, parse_special) and pieces
from llama_token_to_piece (special shown / hidden) for every id the cases produce.
"""
from __future__ import annotations

import json
import pathlib
import random
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.orchestrator.spm_gguf import write_spm_gguf  # noqa: E402

TEXTS = [
  "", " ", "  ", "   ", "\t", "\n", "\n\n\n", " \t \n ", "\r\n", "Hello world", " Hello world", "Hello  world",
  "   leading spaces", "trailing spaces   ", "a  b   c    d", "tabs\tand\r\nCRLF\n", "    def f(x):\n\t\treturn x  \n\n",
  "Ünïcödé façade naïve", "Äpfel Größe", "日本語のテキスト", "中文测试\uff0c你好世界\uff01", "한국어 텍스트", "Ελληνικά кириллица",
  "العربية עברית", "emoji 👋🏽 family 👨‍👩‍👧 🦙", "e\u0301 a\u0308 n\u0303 combining", "\u00a0nbsp\u2003em\u200bzero-width",
  "\u2115 \u2265 0 \u2200 x \u2208 \u211d", "3.14159 and 2,718,281", "1234567890", "0 00 000 0000 00000",
  "x = [1, 2, 3]; y = {'a': 10_000}", "don't won't I'm you'll they've we'd DON'T", "https://example.com/path?q=1&r=2",
  "!!!???...", "mixed1a2b3c", "<s>", "</s>", "<unk>", "a<s>b</s>c", "[INST] hi [/INST]", "[INST][/INST]",
  " [INST] x [/INST] y", "x<tool>y", "<tool> <tool>", "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>",
  "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>assistant\n", "a\x16b\x04c", "\u00ff\u0100\uffff",
  "\U0001f600\U0001f4a9", "\u210c\U0001d522\U0001d529\U0001d529\U0001d52c", "▁already▁escaped", "<0x41>",
]


def random_texts(n: int) -> list[str]:
  rnd = random.Random(15)
  alphabet = [*"abc XYZ 019 .,;'\n\t é世👋ö", "  ", "'re", "\r\n", "<s>", "[INST]", "<|im_end|>", "<tool>", "▁", "é"]
  return ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30))) for _ in range(n)]


def piece(vocab, token: int, special: bool) -> bytes:
  """llama_token_to_piece, exactly its returned length (the high-level wrapper returns the whole buffer)."""
  import ctypes

  import llama_cpp
  size = 64
  while True:
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, special)
    if n >= 0:
      return buf.raw[:n]
    size = -n


def record_vocab(path: pathlib.Path, texts: list[str]) -> dict:
  from llama_cpp import Llama
  llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
  cases, seen = [], set()
  for text in texts:
    data = text.encode("utf-8")
    case = {"text": text,
            "ids": llm.tokenize(data, add_bos=False, special=True),
            "ids_add_special": llm.tokenize(data, add_bos=True, special=True),
            "ids_no_parse_special": llm.tokenize(data, add_bos=False, special=False)}
    for key in ("ids", "ids_add_special", "ids_no_parse_special"):
      seen.update(case[key])
    cases.append(case)
  n_vocab = llm.n_vocab()
  if n_vocab <= 4096:
    seen.update(range(n_vocab))
  vocab = llm._model.vocab
  pieces = {str(t): [piece(vocab, t, special=True).hex(), piece(vocab, t, special=False).hex()] for t in sorted(seen)}
  return {"n_vocab": n_vocab, "cases": cases, "pieces_hex": pieces}


def main() -> None:
  import llama_cpp
  dest = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "tests/fixtures/llamacpp_tokens.json")
  texts = TEXTS + random_texts(200)
  vocabs = {}
  with tempfile.TemporaryDirectory() as d:
    vocabs["smollm2"] = record_vocab(ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", texts)
    vocabs["spm"] = record_vocab(write_spm_gguf(pathlib.Path(d) / "spm.gguf"), texts)
    vocabs["spm_no_space_prefix"] = record_vocab(write_spm_gguf(pathlib.Path(d) / "spm-np.gguf", add_space_prefix=False),
                                                 texts)
  dest.write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__, "vocabularies": vocabs},
                             ensure_ascii=False) + "\n", encoding="utf-8")
  print(f"wrote {dest}: " + ", ".join(f"{k} {len(v['cases'])} texts / {len(v['pieces_hex'])} pieces" for k, v in vocabs.items()))


if __name__ == "__main__":
  main()
