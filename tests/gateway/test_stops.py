"""Stop strings: never emitted, caught when split across tokens, and nothing else held back at the end."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from swactor.gateway.stops import StopScanner


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    s = StopScanner(stops)
    out = []
    for p in pieces:
        out.append(s.feed(p))
        if s.stopped:
            return "".join(out), True
    out.append(s.flush())
    return "".join(out), False


def test_stop_split_across_tokens_is_caught_and_not_emitted() -> None:
    assert run(("</s>",), ["Hello", " wor", "ld<", "/", "s>", "more"]) == ("Hello world", True)


def test_a_partial_match_that_fails_is_released() -> None:
    s = StopScanner(("STOP",))
    assert s.feed("abc ST") == "abc "  # "ST" could begin STOP: held
    assert s.feed("ART") == "START"
    assert not s.stopped


def test_earliest_of_several_stops_wins() -> None:
    assert run(("world", "o w"), ["hello world"]) == ("hell", True)


def test_held_text_comes_out_at_the_end() -> None:
    assert run(("\n\n",), ["line\n"]) == ("line\n", False)


def test_no_stops_passes_everything_through_at_once() -> None:
    s = StopScanner(())
    assert s.feed("a") == "a" and s.feed("") == ""


texts = st.text(alphabet="ab\n", max_size=30)


@given(texts, st.lists(st.text(alphabet="ab\n", min_size=1, max_size=3), min_size=1, max_size=3),
       st.lists(st.integers(0, 30), max_size=6))
def test_output_is_the_text_before_the_first_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)] or [""]
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    out, stopped = run(tuple(stops), pieces)
    assert stopped == bool(hits)
    assert out == (text[:min(hits)] if hits else text)
