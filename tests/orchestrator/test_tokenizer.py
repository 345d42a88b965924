"""GGUF byte-level BPE tokenizer: hand-checked ids, an independent cross-check (HF `tokenizers` built from
the same GGUF vocab and merges), round-trips, streaming decode, a synthetic Llama 3 GGUF, and llama.cpp's
own prompt ids for the default model. SentencePiece: test_tokenizer_spm.py; llama.cpp's ids on a broad
string set: test_tokenizer_llamacpp.py; chat templates: test_tokenizer_chat.py; cost: test_tokenizer_cost.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.orchestrator.tokens.tokenizer import (
    Message,
    StreamDecoder,
    Tokenizer,
    TokenizerError,
    chat_prompt,
)
from swactor.orchestrator.tokens.tokenizer.bytemap import BYTE_TO_CHAR, decode_chars, encode_bytes
from swactor.orchestrator.tokens.tokenizer.pretokenize import LLAMA3, PreTokenizer

from .helpers import MODEL_PATH

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp_greedy.json"

needs_model = pytest.mark.skipif(not MODEL_PATH.exists(), reason=f"{MODEL_PATH} missing: run `make model`")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    if not MODEL_PATH.exists():
        pytest.skip(f"{MODEL_PATH} missing: run `make model`")
    return Tokenizer.from_gguf(MODEL_PATH)


# Ids checked by hand against the vocabulary (and by the HF cross-check below).
HAND_CHECKED = [
    ("Hello world", [19556, 905]),
    ("Hello, my name is", [19556, 28, 957, 1462, 314]),
    (" 12345 numbers 3.14", [216, 33, 34, 35, 36, 37, 2966, 216, 35, 30, 33, 36]),  # smollm: digits split one by one
    ("def f(x):\n    return x  \n\n", [1604, 275, 24, 104, 727, 472, 1003, 1792, 256, 1116]),
    ("<|im_start|>user\nhi<|im_end|>\n", [1, 4093, 198, 6004, 2, 198]),
]


@needs_model
@pytest.mark.parametrize(("text", "ids"), HAND_CHECKED)
def test_hand_checked_ids(tok: Tokenizer, text: str, ids: list[int]) -> None:
    assert tok.encode(text) == ids
    assert tok.decode(ids) == text


def test_metadata_facts(tok: Tokenizer) -> None:
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos, tok.vocab_size) == (1, 2, 2, False, 49152)
    assert tok.tokens[1] == "<|im_start|>" and tok.tokens[2] == "<|im_end|>"
    assert tok.eog_ids == {0, 2}  # eos <|im_end|> and <|endoftext|>


def test_special_tokens_only_when_parsing_specials(tok: Tokenizer) -> None:
    assert tok.encode("<|im_end|>") == [2]
    plain = tok.encode("<|im_end|>", parse_special=False)
    assert 2 not in plain and tok.decode(plain) == "<|im_end|>"


def test_bytes_without_a_token_are_dropped_like_llamacpp(tok: Tokenizer) -> None:
    assert tok.encode("a\x16b") == tok.encode("a") + tok.encode("b")  # words "a", "\x16", "b"


def test_bad_token_id_is_named(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="token id 49152 is outside"):
        tok.decode([49152])


CORPUS = [
    "Hello world", "  leading spaces", "tabs\tand\r\nCRLF", "emoji 👋🏽 family 👨‍👩‍👧", "日本語のテキスト",
    "Ünïcödé façade naïve", "x = [1, 2, 3]; y = {'a': 10_000}", "    def f():\n\t\treturn 1\n\n\n",
    "3.14159 and 2,718,281", "don't won't I'm you'll they've we'd DON'T", "a  b   c    d", "\n\n\n", " ", "",
    "!!!???...", "\u2115 \u2265 0 \u2200 x \u2208 \u211d", "العربية עברית", "Ελληνικά кириллица", "\u00a0nbsp\u2003em", "mixed1a2b3c",
    "https://example.com/path?q=1&r=2", "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>assistant\n",
]


def _random_corpus(n: int) -> list[str]:
    rnd = random.Random(7)
    alphabet = [*list("abc XYZ 019 .,;'\n\t é世👋 ' s"), "<|im_end|>", "<|im_start|>", "  ", "'re", "\r\n"]
    return ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40))) for _ in range(n)]


def test_matches_independent_hf_bpe_on_corpus(tok: Tokenizer) -> None:
    """HF `tokenizers` (Rust, Oniguruma regex) built from the GGUF's own vocab and merges, with
    SmolLM2's tokenizer.json pre-tokenizer (Digits(individual) + ByteLevel), must agree id for id."""
    hf_mod = pytest.importorskip("tokenizers", reason="dev dependency `tokenizers` for the cross-check")
    from tokenizers import AddedToken, models, pre_tokenizers

    hf = hf_mod.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tok.tokens)},
                                     merges=[tuple(m.split(" ", 1)) for m in tok.data.merges]))
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.add_special_tokens([AddedToken(tok.tokens[i], special=True, normalized=False) for i in range(17)])
    texts = CORPUS + _random_corpus(300)
    diffs = [(s, tok.encode(s), hf.encode(s).ids) for s in texts if tok.encode(s) != hf.encode(s).ids]
    assert diffs == [], diffs[:3]


def test_llama3_pretokenizer_matches_hf_split() -> None:
    hf_mod = pytest.importorskip("tokenizers", reason="dev dependency `tokenizers` for the cross-check")
    split = hf_mod.pre_tokenizers.Split(hf_mod.Regex(LLAMA3), behavior="isolated")
    pre = PreTokenizer("llama-bpe")
    for s in CORPUS + _random_corpus(300):
        assert pre.split(s) == [w for w, _ in split.pre_tokenize_str(s)], s


def test_llama3_split_hand_checked() -> None:
    pre = PreTokenizer("llama-bpe")
    assert pre.split("I'M 12345 hello!!\n\n  world") == ["I", "'M", " ", "123", "45", " hello", "!!\n\n", " ", " world"]
    assert PreTokenizer("smollm").split("ab12 c") == ["ab", "1", "2", " c"]
    with pytest.raises(ValueError, match=r"unsupported tokenizer\.ggml\.pre 'mystery'"):
        PreTokenizer("mystery")


# SmolLM2's vocabulary has no token for bytes 04 06 13 14 16 1d (and none for UTF-8 lead bytes of
# code points >= U+40000); such characters are dropped, as llama.cpp drops them.
UNREPRESENTABLE = "\x04\x06\x13\x14\x16\x1d"


@needs_model
@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(codec="utf-8", max_codepoint=0x3FFFF, exclude_characters=UNREPRESENTABLE), max_size=60))
def test_round_trip_any_text(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    dec = StreamDecoder(tok, skip_special=False)
    streamed = "".join(dec.push(i) for i in ids) + dec.flush()
    assert streamed == text


def test_stream_decoder_holds_partial_utf8(tok: Tokenizer) -> None:
    ids = tok.encode(" 👋")  # the emoji's 4 bytes are split across several byte-level tokens
    assert len(ids) > 1
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[-1].endswith("👋") and "".join(pieces) == " 👋"
    assert pieces[0] in ("", " ")
    # control tokens are skipped in the output stream, a dangling partial char becomes U+FFFD at the end
    dec = StreamDecoder(tok)
    assert dec.push(2) == ""
    byte_f0 = tok.tokens.index(BYTE_TO_CHAR[0xF0])
    assert dec.push(byte_f0) == "" and dec.flush() == "\ufffd"


def test_bytemap_is_a_bijection() -> None:
    data = bytes(range(256))
    assert decode_chars(encode_bytes(data)) == data
    assert encode_bytes(b" \n") == "ĠĊ"


def test_smollm2_chat_prompt_applies_default_system(tok: Tokenizer) -> None:
    text = chat_prompt(tok, [Message("user", "What is the capital of France?")])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text)
    assert ids[:3] == [1, 9690, 198] and ids[-4:] == [1, 520, 9531, 198]
    own = chat_prompt(tok, [Message("system", "Be terse."), Message("user", "Hi")], add_generation_prompt=False)
    assert own == "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_unknown_tokenizer_model_is_named(tok: Tokenizer) -> None:
    from dataclasses import replace

    with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.model 'bert' is not supported.*'gpt2'.*'llama'"):
        Tokenizer(replace(tok.data, model="bert"))


# ---- a synthetic Llama 3 style GGUF: add_bos default, ignore_merges, llama-bpe pre-tokenizer ----


def _write_llama3_gguf(path: Path) -> None:
    import gguf

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    byte_tokens = [BYTE_TO_CHAR[b] for b in range(256)]
    merged = ["Ġh", "Ġhe", "ll", "Ġhell", "Ġhello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "Ġfoo"]
    merges = ["Ġ h", "Ġh e", "l l", "Ġhe ll", "Ġhell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]  # no merge for Ġfoo
    tokens = byte_tokens + merged + specials
    types = [1] * (len(byte_tokens) + len(merged)) + [3] * len(specials)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(4)
    w.add_embedding_length(64)
    w.add_context_length(256)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
    w.add_eos_token_id(tokens.index("<|eot_id|>"))
    w.add_chat_template("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_synthetic_llama3_gguf(tmp_path: Path) -> None:
    from dataclasses import replace

    path = tmp_path / "llama3ish.gguf"
    _write_llama3_gguf(path)
    t = Tokenizer.from_gguf(path)
    bos = t.tokens.index("<|begin_of_text|>")
    assert t.add_bos  # the llama-bpe default when the GGUF has no add_bos_token key
    ids = t.encode(" hello world foo")
    assert ids[0] == bos
    assert [t.tokens[i] for i in ids[1:]] == ["Ġhello", "Ġworld", "Ġfoo"]  # Ġfoo: whole word in vocab (ignore_merges)
    assert t.decode(ids) == "<|begin_of_text|> hello world foo"
    assert t.decode(ids, skip_special=True) == " hello world foo"
    text = chat_prompt(t, [Message("user", "hello")])
    ids = t.encode(text)
    assert [t.tokens[i] for i in ids[:3]] == ["<|begin_of_text|>", "<|start_header_id|>", "u"]
    # A template that writes BOS itself: the tokenizer adds BOS, so the text's own is cut (llama.cpp does too).
    bos_template = replace(t.data, chat_template="{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    t2 = Tokenizer(bos_template)
    assert chat_prompt(t2, [Message("user", " hello")]) == " hello"
    assert t2.encode(chat_prompt(t2, [Message("user", " hello")]))[:2] == [bos, t.tokens.index("Ġhello")]
    assert t.tokens.index("<|eot_id|>") in t.eog_ids


def _fixture_cases() -> list[dict]:
    if not FIXTURE.exists():
        pytest.skip(f"{FIXTURE} not recorded yet")
    cases = json.loads(FIXTURE.read_text())["cases"]
    assert cases, f"{FIXTURE} has no cases"
    return cases


def test_fixture_prompt_ids_match_llamacpp(tok: Tokenizer) -> None:
    """Prompt ids recorded from llama.cpp itself (llama-cpp-python, tests/fixtures/llamacpp_greedy.json):
    the chat text we render and the ids we produce must both be llama.cpp's."""
    for case in _fixture_cases():
        if case["chat_template"]:
            assert chat_prompt(tok, [Message("user", case["question"])]) == case["text"]
        assert tok.encode(case["text"]) == case["prompt_tokens"], case["text"]
        assert tok.encode(case["text"]) == case["prompt_tokens_add_bos"]  # SmolLM2: add_bos is false


def test_fixture_completions_decode_like_llamacpp(tok: Tokenizer) -> None:
    """llama.cpp's greedy tokens decode (control tokens skipped, streamed) to llama.cpp's completion text."""
    for case in _fixture_cases():
        ids = case["greedy_tokens"]
        assert tok.decode(ids, skip_special=True) == case["completion"]
        dec = StreamDecoder(tok)
        assert "".join(dec.push(i) for i in ids) + dec.flush() == case["completion"]
