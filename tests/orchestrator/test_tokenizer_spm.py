"""SentencePiece (`tokenizer.ggml.model == "llama"`) tokenizer on the committed test vocabulary
(tests/fixtures/spm_vocab.json written as a vocab-only GGUF): metadata and defaults, the leading-space
rule, byte fallback and its decode, special tokens, round trips and streamed decode. llama.cpp's own
ids for the same GGUF: test_tokenizer_llamacpp.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swactor.orchestrator.models.gguf_model import TokenizerData
from swactor.orchestrator.tokens.tokenizer import (
    Message,
    StreamDecoder,
    Tokenizer,
    TokenizerError,
    chat_prompt,
)

from .spm_gguf import load_vocab, mistral_template, write_spm_gguf


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_spm_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf", chat_template=mistral_template())


@pytest.fixture(scope="module")
def spm(spm_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(spm_path)


def pieces(t: Tokenizer, ids: list[int]) -> list[str]:
    return [t.tokens[i] for i in ids]


def test_gguf_is_deterministic_and_small(spm_path: Path, tmp_path: Path) -> None:
    again = write_spm_gguf(tmp_path / "again.gguf", chat_template=mistral_template())
    assert again.read_bytes() == spm_path.read_bytes()
    assert spm_path.stat().st_size < 1 << 20


def test_metadata(spm: Tokenizer) -> None:
    assert spm.kind == "llama"
    assert (spm.unk_id, spm.bos_id, spm.eos_id, spm.add_bos, spm.add_eos) == (0, 1, 2, True, False)
    assert spm.tokens[:6] == ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<tool>"]
    assert spm.eog_ids == {2}


def test_llamacpp_defaults_when_the_gguf_names_nothing(spm: Tokenizer) -> None:
    bare = Tokenizer(replace(spm.data, bos_id=None, eos_id=None, unk_id=None, add_bos=None, add_eos=None))
    assert (bare.unk_id, bare.bos_id, bare.eos_id, bare.add_bos, bare.add_eos) == (0, 1, 2, True, False)


def test_leading_space_and_escaping(spm: Tokenizer) -> None:
    ids = spm.encode("Hello world")
    assert pieces(spm, ids) == ["<s>", "▁H", "el", "lo", "▁w", "or", "ld"]
    assert spm.decode(ids) == "<s> Hello world" and spm.decode(ids, skip_special=True) == " Hello world"
    assert pieces(spm, spm.encode("Hello", add_special=False)) == ["▁H", "el", "lo"]
    assert spm.encode("", add_special=False) == [] and spm.encode("") == [1]


def test_space_prefix_follows_special_tokens(spm: Tokenizer) -> None:
    # llama.cpp prefixes a space to the first text and to text right after a special token
    assert pieces(spm, spm.encode("[INST]hi[/INST]ok", add_special=False)) == ["[INST]", "▁h", "i", "[/INST]", "▁o", "k"]
    plain = pieces(spm, spm.encode("[INST]hi", add_special=False, parse_special=False))
    assert "[INST]" not in plain and plain[0].startswith("▁")


def test_no_space_prefix_when_the_gguf_says_so(spm_path: Path, tmp_path: Path) -> None:
    t = Tokenizer.from_gguf(write_spm_gguf(tmp_path / "np.gguf", add_space_prefix=False))
    assert pieces(t, t.encode("Hello world", add_special=False)) == ["H", "el", "lo", "▁w", "or", "ld"]


def test_byte_fallback_and_its_decode(spm: Tokenizer) -> None:
    ids = spm.encode("👋🏽", add_special=False)  # 🏽 has no piece: four <0xNN> tokens
    assert pieces(spm, ids) == ["▁👋", "<0xF0>", "<0x9F>", "<0x8F>", "<0xBD>"]
    assert spm.token_bytes(ids[1]) == b"\xf0"
    dec = StreamDecoder(spm)
    out = [dec.push(i) for i in ids]
    assert out == [" 👋", "", "", "", "🏽"] and dec.flush() == ""


def test_user_defined_tokens_match_even_without_parse_special(spm: Tokenizer) -> None:
    assert pieces(spm, spm.encode("a<tool>b", add_special=False, parse_special=False)) == ["▁a", "<tool>", "▁b"]
    assert spm.decode(spm.encode("a<tool>b"), skip_special=True) == " a<tool> b"


def test_a_character_without_piece_or_byte_token_is_named() -> None:
    data = TokenizerData(model="llama", pre="default", tokens=["<unk>", "<s>", "</s>", "▁", "a"], token_types=[2, 3, 3, 1, 1],
                         merges=[], bos_id=1, eos_id=2, eot_id=None, eom_id=None, pad_id=None, add_bos=True, add_eos=False,
                         chat_template=None, scores=[0.0, 0.0, 0.0, -1.0, -2.0])
    t = Tokenizer(data)
    assert t.encode("a") == [1, 3, 4]
    with pytest.raises(TokenizerError, match=r"character 'b' is not in the vocabulary.*<0x62>"):
        t.encode("ab")
    with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.scores has 2 entries for 5 tokens"):
        Tokenizer(replace(data, scores=[0.0, 0.0]))


def test_word_by_word_merging_equals_merging_the_whole_text(spm: Tokenizer) -> None:
    """spm.py merges '▁'-led words separately when no piece holds a '▁' after another character; a
    vocabulary with one such piece (never matched here) merges each fragment whole. Same ids."""
    vocab = load_vocab()
    whole = Tokenizer(replace(spm.data, tokens=[*vocab["tokens"], "☃▁☃"], scores=[*vocab["scores"], -1.0],
                              token_types=[*vocab["token_types"], 1]))
    texts = ["Hello world  again", "  two  spaces\tand\ttabs\n new line", "日本語 のテキスト 👋🏽 ok", "[INST] hi [/INST] x", ""]
    for text in texts:
        assert whole.encode(text) == spm.encode(text), text


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=60))
def test_round_trip_any_text(spm: Tokenizer, text: str) -> None:
    assume("<tool>" not in text)  # a user-defined token is matched even as plain text (then a space follows it)
    ids = spm.encode(text, add_special=False, parse_special=False)
    expected = " " + text if text else ""  # the leading-space rule
    assert spm.decode(ids) == expected
    dec = StreamDecoder(spm, skip_special=False)
    assert "".join(dec.push(i) for i in ids) + dec.flush() == expected


def test_mistral_chat_prompt_leaves_bos_to_the_tokenizer(spm: Tokenizer) -> None:
    text = chat_prompt(spm, [Message("user", "Hi"), Message("assistant", "Hello"), Message("user", "Bye")])
    assert text == "[INST] Hi[/INST] Hello</s>[INST] Bye[/INST]"  # the template's own <s> is cut
    ids = spm.encode(text)
    assert ids[:2] == [1, 3] and ids.count(1) == 1 and ids.count(2) == 1 and ids[-1] == 4
