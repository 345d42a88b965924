"""Train a small SentencePiece vocabulary on this repository's own text -> tests/fixtures/spm_vocab.json.

The tests need a SentencePiece (`tokenizer.ggml.model == "llama"`) vocabulary and ship no model
weights, so we train one, Llama-style: BPE model, byte fallback (<0x00>..<0xFF>), digits split,
whitespace-only pieces allowed, no normalization, <unk>/<s>/</s> at ids 0/1/2, Mistral's [INST]
[/INST] as control tokens and one user-defined token. Runs offline in a scratch venv, never in CI:
  python3.11 -m venv /tmp/tok-venv && /tmp/tok-venv/bin/pip install sentencepiece
  /tmp/tok-venv/bin/python packaging/train_spm_vocab.py
The JSON (pieces, scores, GGUF token types) is committed; tests/orchestrator/spm_gguf.py writes it as
a vocab-only GGUF at test time.
"""
from __future__ import annotations

import io
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB_SIZE = 2000
CONTROL = ["[INST]", "[/INST]"]
USER_DEFINED = ["<tool>"]
# A little text in other scripts, so some multi-byte characters earn pieces and others fall back to bytes.
EXTRA = """Ünïcödé façade naïve café résumé. Größe Straße Äpfel.
日本語のテキストです。東京は日本の首都です。中文测试\uff0c你好世界\uff01
Ελληνικά γράμματα και кириллица для проверки. العربية עברית
emoji 👋 🦙 🎉 and math ∀ x ∈ \u211d, x ≥ 0.
    indented code\n\tdef f(x):\n\t\treturn x * 2  # comment
"""


def corpus() -> list[str]:
  files = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
  lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
  return lines + EXTRA.splitlines() * 20


def gguf_type(sp, i: int) -> int:
  """GGUF token type (normal 1, unknown 2, control 3, user-defined 4, unused 5, byte 6), as
  convert_hf_to_gguf.py assigns them from a SentencePiece model."""
  if sp.is_unknown(i):
    return 2
  if sp.is_control(i):
    return 3
  if sp.id_to_piece(i) in USER_DEFINED:
    return 4
  if sp.is_unused(i):
    return 5
  if sp.is_byte(i):
    return 6
  return 1


def main() -> None:
  import sentencepiece as spm
  dest = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "tests/fixtures/spm_vocab.json")
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(corpus()), model_writer=model, vocab_size=VOCAB_SIZE, model_type="bpe",
    byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
    normalization_rule_name="identity", character_coverage=0.9995, control_symbols=CONTROL,
    user_defined_symbols=USER_DEFINED, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
    max_sentence_length=1 << 16, minloglevel=2,
  )
  sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
  ids = range(sp.get_piece_size())
  vocab = {
    "source": "packaging/train_spm_vocab.py on docs/*.md + README.md",
    "sentencepiece": spm.__version__,
    "tokens": [sp.id_to_piece(i) for i in ids],
    "scores": [sp.get_score(i) for i in ids],
    "token_types": [gguf_type(sp, i) for i in ids],
    "unk_id": 0, "bos_id": 1, "eos_id": 2,
  }
  dest.write_text(json.dumps(vocab, ensure_ascii=False) + "\n", encoding="utf-8")
  kinds = {t: vocab["token_types"].count(t) for t in sorted(set(vocab["token_types"]))}
  print(f"wrote {dest}: {len(vocab['tokens'])} pieces, types {kinds}")


if __name__ == "__main__":
  main()
