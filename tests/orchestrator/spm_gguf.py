"""The test SentencePiece vocabulary (tests/fixtures/spm_vocab.json, trained by packaging/train_spm_vocab.py)
as GGUF: `add_spm_vocab` puts its tokenizer keys on any GGUFWriter, `write_spm_gguf` writes a
vocab-only file (no tensors) that llama.cpp loads with vocab_only=True. Deterministic: the same JSON
gives the same bytes. Needs only `gguf`, so the llama.cpp recorder imports it too.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPM_VOCAB = FIXTURES / "spm_vocab.json"
# Mistral-7B-Instruct-v0.3's chat template (as recorded in tests/fixtures/chat_templates.json).
MISTRAL_TEMPLATE_NAME = "mistral-v3"


def load_vocab() -> dict:
    return json.loads(SPM_VOCAB.read_text(encoding="utf-8"))


def mistral_template() -> str:
    recorded = json.loads((FIXTURES / "chat_templates.json").read_text(encoding="utf-8"))
    return recorded["templates"][MISTRAL_TEMPLATE_NAME]["template"]


def add_spm_vocab(w: gguf.GGUFWriter, vocab: dict, *, chat_template: str | None = None,
                  add_space_prefix: bool | None = None) -> None:
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab["tokens"])
    w.add_token_scores(vocab["scores"])
    w.add_token_types(vocab["token_types"])
    w.add_unk_token_id(vocab["unk_id"])
    w.add_bos_token_id(vocab["bos_id"])
    w.add_eos_token_id(vocab["eos_id"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    if chat_template is not None:
        w.add_chat_template(chat_template)


def write_spm_gguf(path: Path, *, chat_template: str | None = None, add_space_prefix: bool | None = None,
                   vocab: dict | None = None) -> Path:
    """`vocab`: another vocabulary in load_vocab()'s form (default: the test vocabulary)."""
    vocab = vocab or load_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("swactor-test-spm")
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(vocab["tokens"]))
    add_spm_vocab(w, vocab, chat_template=chat_template, add_space_prefix=add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
