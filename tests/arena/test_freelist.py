"""The free list alone: first fit, alignment, coalescing, refusals."""

from __future__ import annotations

import pytest

from swactor.arena.freelist import FreeList, Range

P = 4096


def test_allocate_first_fit_and_coalesce_back_to_one_range() -> None:
    fl = FreeList(16 * P, P)
    a = fl.allocate(2 * P, P)
    b = fl.allocate(3 * P, P)
    c = fl.allocate(P, P)
    assert (a, b, c) == (Range(0, 2 * P), Range(2 * P, 3 * P), Range(5 * P, P))
    assert fl.free_bytes == 10 * P
    fl.free(b)
    assert fl.ranges() == [Range(2 * P, 3 * P), Range(6 * P, 10 * P)]
    assert fl.allocate(2 * P, P) == Range(2 * P, 2 * P)  # first fit reuses the hole
    fl.free(Range(2 * P, 2 * P))
    fl.free(a)
    fl.free(c)
    assert fl.ranges() == [Range(0, 16 * P)]


def test_alignment_leaves_head_piece_free() -> None:
    fl = FreeList(64 * P, P)
    fl.allocate(P, P)
    r = fl.allocate(4 * P, 16 * P)
    assert r == Range(16 * P, 4 * P)
    assert fl.ranges() == [Range(P, 15 * P), Range(20 * P, 44 * P)]
    assert fl.largest == 44 * P


def test_no_fit_returns_none_and_changes_nothing() -> None:
    fl = FreeList(4 * P, P)
    fl.allocate(2 * P, P)
    before = fl.ranges()
    assert fl.allocate(3 * P, P) is None
    assert fl.ranges() == before


@pytest.mark.parametrize(
    "bad",
    [Range(0, P), Range(P, 2 * P), Range(100, P), Range(8 * P, P), Range(0, 0)],
)
def test_double_free_and_bad_ranges_refused(bad: Range) -> None:
    fl = FreeList(8 * P, P)
    fl.allocate(P, P)  # [0, P) leased, [P, 8P) free
    if bad == Range(0, P):
        fl.free(bad)  # the leased one is fine once
        with pytest.raises(ValueError, match="double free"):
            fl.free(bad)
        return
    with pytest.raises(ValueError):
        fl.free(bad)
