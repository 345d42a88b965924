"""Ids and pieces equal to llama.cpp's, recorded by packaging/record_llamacpp_tokens.py with llama-cpp-python
(tests/fixtures/llamacpp_tokens.json), for every vocabulary the tests build: SmolLM2's byte-level BPE
(the default model) and the test SentencePiece vocabulary with and without the leading-space rule.
The string set: unicode (CJK, emoji with modifiers and ZWJ, combining marks, RTL, astral), whitespace
runs with tabs/newlines/CRLF, digit runs, code, special tokens (parsed and as text), the empty string,
leading and trailing spaces, and 200 random strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swactor.orchestrator.tokens.tokenizer import StreamDecoder, Tokenizer

from .helpers import MODEL_PATH
from .spm_gguf import write_spm_gguf

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp_tokens.json").read_text(encoding="utf-8"))
VOCABS = sorted(RECORDED["vocabularies"])


@pytest.fixture(scope="module", params=VOCABS)
def vocab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, dict]:
    name = request.param
    if name == "smollm2":
        if not MODEL_PATH.exists():
            pytest.skip(f"{MODEL_PATH} missing: run `make model`")
        path = MODEL_PATH
    else:
        path = write_spm_gguf(tmp_path_factory.mktemp(name) / f"{name}.gguf",
                              add_space_prefix=False if name == "spm_no_space_prefix" else None)
    return Tokenizer.from_gguf(path), RECORDED["vocabularies"][name]


def test_every_vocabulary_was_recorded() -> None:
    assert set(VOCABS) == {"smollm2", "spm", "spm_no_space_prefix"}
    assert all(len(v["cases"]) >= 250 for v in RECORDED["vocabularies"].values())


def test_ids_equal_llamacpp(vocab: tuple[Tokenizer, dict]) -> None:
    tok, recorded = vocab
    assert tok.vocab_size == recorded["n_vocab"]
    diffs = []
    for case in recorded["cases"]:
        text = case["text"]
        got = (tok.encode(text, add_special=False), tok.encode(text),
               tok.encode(text, add_special=False, parse_special=False))
        want = (case["ids"], case["ids_add_special"], case["ids_no_parse_special"])
        if got != want:
            diffs.append((text, got, want))
    assert diffs == [], diffs[:3]


def test_pieces_equal_llamacpp(vocab: tuple[Tokenizer, dict]) -> None:
    tok, recorded = vocab
    for token_id, (shown, hidden) in recorded["pieces_hex"].items():
        t = int(token_id)
        assert tok.token_bytes(t).hex() == shown, (t, tok.tokens[t])
        assert tok.token_bytes(t, skip_special=True).hex() == hidden, (t, tok.tokens[t])


def test_streamed_decode_assembles_llamacpp_pieces(vocab: tuple[Tokenizer, dict]) -> None:
    """Streaming llama.cpp's ids gives the UTF-8 of its pieces joined (byte-fallback and byte-level
    pieces assembled into characters, '▁' as spaces), with nothing emitted before a character completes."""
    tok, recorded = vocab
    pieces = recorded["pieces_hex"]
    for case in recorded["cases"]:
        ids = case["ids_add_special"]
        dec = StreamDecoder(tok, skip_special=True)
        out = [dec.push(i) for i in ids]
        whole = b"".join(bytes.fromhex(pieces[str(i)][1]) for i in ids).decode("utf-8", errors="replace")
        assert "".join(out) + dec.flush() == whole
        assert all("\ufffd" not in o for o in out) or "\ufffd" in whole
