"""Prompt-lookup drafts (docs/orchestrator.md "Speculative decoding"): what follows the latest earlier occurrence of
the longest repeated tail, nothing without a repeat, and a pause after drafts that all failed."""

from __future__ import annotations

import pytest

from swactor.common.objflags import MAX_DRAFT
from swactor.orchestrator.tokens.drafts import FIRST_REACH, MAX_PAUSE, PromptLookup


def test_the_tokens_after_the_latest_occurrence_of_the_longest_tail() -> None:
    d = PromptLookup([1, 2, 3, 4, 5, 6, 1, 2], first_reach=MAX_DRAFT)
    assert d.draft(3) == (3, 4, 5)
    d.extend([3])
    assert d.draft(8) == (4, 5, 6, 1, 2, 3)  # no further than the context goes
    d = PromptLookup([7, 8, 1, 7, 8, 2, 9, 7, 8], first_reach=MAX_DRAFT)  # 7 8 was followed by 1, later by 2: the latest wins
    assert d.draft(2) == (2, 9)
    d = PromptLookup([3, 1, 2, 4, 1, 2, 9, 3, 1, 2])  # 1 2 was last followed by 9, but 3 1 2 by 4: the longer wins
    assert d.draft(1) == (4,)


def test_no_repeat_no_draft() -> None:
    assert PromptLookup([1, 2, 3, 4]).draft(4) == ()
    assert PromptLookup([1, 2, 3, 1]).draft(4) == ()  # one shared token is below the shortest n-gram
    assert PromptLookup([1, 2, 3, 1], min_ngram=1).draft(3) == (2, 3)  # FIRST_REACH
    assert PromptLookup([1, 2, 1, 2]).draft(0) == ()
    with pytest.raises(ValueError, match=r"n-gram lengths 3\.\.2"):
        PromptLookup([], min_ngram=3, max_ngram=2)


def test_failed_drafts_pause_drafting_longer_each_time_and_a_success_resets() -> None:
    d = PromptLookup([1, 2, 3, 1, 2])
    assert d.draft(2) == (3, 1)
    pauses = []
    for _ in range(7):
        d.pacing.verified(2, 0)
        n = 0
        while d.draft(2) == ():
            n += 1
        pauses.append(n)
    assert pauses == [1, 2, 4, 8, 16, MAX_PAUSE, MAX_PAUSE]
    d.pacing.verified(2, 1)  # a draft kept: drafting goes on (one draft now), and the next failure pauses one step again
    assert d.draft(2) == (3,)
    d.pacing.verified(1, 0)
    assert d.draft(2) == () and d.draft(2) == (3,)
    d.pacing.verified(0, 0)  # a step without drafts says nothing
    assert d.draft(2) == (3,)


def test_drafts_start_short_grow_while_accepted_and_shrink_when_some_fail() -> None:
    d = PromptLookup(list(range(20)) * 2)
    drafted = [len(d.draft(7))]
    for _ in range(4):  # all accepted: two more each time, up to what is asked
        d.pacing.verified(drafted[-1], drafted[-1])
        drafted.append(len(d.draft(7)))
    assert drafted == [FIRST_REACH, 4, 6, 7, 7] and FIRST_REACH == 2
    d.pacing.verified(7, 3)  # some rejected: one fewer than drafted
    assert len(d.draft(7)) == 6
    for _ in range(10):
        d.pacing.verified(7, 1)
    assert len(d.draft(7)) == 1  # never below one
