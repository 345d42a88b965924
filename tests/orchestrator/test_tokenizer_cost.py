"""What tokenizing costs: the priority-queue merge equals the one-merge-at-a-time definition; the
token-count lower bounds are sound (never refuse a text that fits) and refuse a 4 MiB one-word prompt
before merging; one overlong word is refused by name; SubmitRun refuses such a prompt as
INVALID_ARGUMENT. Speed figures: bench/tokenizer.py (printed, never asserted)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.orchestrator.runs.manager import Limits
from swactor.orchestrator.tokens.tokenizer import PromptTooLong, Tokenizer, TokenizerError
from swactor.orchestrator.tokens.tokenizer.bounds import MAX_WORD_CHARS, WORD_BOUND_CHARS
from swactor.orchestrator.tokens.tokenizer.merge import merge_pairs
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import serving
from .helpers import MODEL_PATH, pool
from .spm_gguf import write_spm_gguf

FOUR_MIB = 4 << 20


def reference_merge(symbols: list[str], ranks: dict, joined: bool) -> list[str]:
    """The definition llama.cpp's comparators implement: merge the best-ranked adjacent pair (ties:
    leftmost), one merge at a time, rescanning everything -- O(n^2)."""
    symbols = list(symbols)
    while True:
        best = None
        for k in range(len(symbols) - 1):
            r = ranks.get(symbols[k] + symbols[k + 1] if joined else (symbols[k], symbols[k + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, k)
        if best is None:
            return symbols
        k = best[1]
        symbols[k : k + 2] = [symbols[k] + symbols[k + 1]]


@st.composite
def merge_problems(draw):
    alphabet = "abcd"
    words = st.text(alphabet, min_size=1, max_size=4)
    joined = draw(st.booleans())
    pairs = draw(st.lists(st.tuples(words, words), max_size=40))
    ranks: dict = {}
    for left, right in pairs:  # arbitrary ranks, ties included, even merges that rank before their parts
        ranks.setdefault(left + right if joined else (left, right), draw(st.integers(0, 15)))
    return list(draw(st.text(alphabet, max_size=40))), ranks, joined


@settings(max_examples=400, deadline=None)
@given(merge_problems())
def test_queue_merge_equals_the_definition(problem) -> None:
    symbols, ranks, joined = problem
    assert merge_pairs(symbols, ranks, joined=joined) == reference_merge(symbols, ranks, joined)


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    if not MODEL_PATH.exists():
        pytest.skip(f"{MODEL_PATH} missing: run `make model`")
    return Tokenizer.from_gguf(MODEL_PATH)


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_gguf(write_spm_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf"))


def texts() -> list[str]:
    rnd = random.Random(13)
    letters = "".join(rnd.choice("abcdefghij") for _ in range(WORD_BOUND_CHARS + 50))
    return ["Hello world", " " * 5000, "ab" * 3000, letters, "日本語" * 2000, "x = [1, 2, 3]\n" * 300, "\x16" * 6000 + "a"]


@pytest.mark.parametrize("which", ["smol", "spm"])
def test_bounds_never_refuse_a_text_that_fits(which: str, request: pytest.FixtureRequest) -> None:
    tok = request.getfixturevalue(which)
    for text in texts():
        ids = tok.encode(text)
        assert tok.encode(text, max_tokens=len(ids)) == ids
        with pytest.raises(PromptTooLong):
            tok.encode(text, max_tokens=len(ids) - 1)


@pytest.mark.parametrize("which", ["smol", "spm"])
def test_four_mib_word_is_refused_before_merging(which: str, request: pytest.FixtureRequest) -> None:
    tok = request.getfixturevalue(which)
    with pytest.raises(PromptTooLong, match=r"needs at least \d+ tokens \(4194304 bytes.*more than the 8191 allowed"):
        tok.encode("x" * FOUR_MIB, max_tokens=8191)
    # short enough for the whole-text bound, but one word proves it too long (a letters-only piece is short)
    word = "ab" * (WORD_BOUND_CHARS * 4)
    with pytest.raises(PromptTooLong, match=rf"one word of {len(word) + (which == 'spm')} characters alone needs"):
        tok.encode(word, max_tokens=len(word) // tok.bound.max_token_bytes + 10)


def test_an_overlong_word_is_refused_by_name(smol: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match=rf"a word of {FOUR_MIB} characters without a break.*at most {MAX_WORD_CHARS}"):
        smol.encode("x" * FOUR_MIB)


def test_invalid_unicode_is_named(smol: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="not valid Unicode: surrogates not allowed at character 2"):
        smol.encode("ab\ud800")


def test_submit_refuses_a_four_mib_prompt(tmp_path: Path, smol: Tokenizer) -> None:
    prompt = "x" * (FOUR_MIB - 1024)  # what fits in gRPC's default 4 MiB message

    async def main():
        # The byte limit raised past it: the tokenizer refuses it (by default, its size does, before parsing).
        async with serving(tmp_path, FakeFleet([2]), pool(11), limits=Limits(max_request_bytes=8 << 20)) as s:
            for req in (opb.SubmitRunRequest(prompt=prompt, raw=True, max_tokens=5),
                        opb.SubmitRunRequest(prompt=prompt, max_tokens=5)):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await s.stub.SubmitRun(req)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "prompt does not fit" in err.value.details() and "the context holds 4096" in err.value.details()
        async with serving(tmp_path / "default", FakeFleet([2]), pool(11)) as s:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await s.stub.SubmitRun(opb.SubmitRunRequest(prompt=prompt, raw=True, max_tokens=5))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "takes at most 1048576 ([orchestrator].max_request_bytes)" in err.value.details()

    asyncio.run(asyncio.wait_for(main(), 30))
