"""Drafts for speculative decoding by prompt lookup, and how many a step may carry (docs/orchestrator.md
"Speculative decoding"). The other drafter, a small model on this host, is tokens/draft_model.py.

No second model: the tokens that followed the latest earlier occurrence of the run's last n tokens (prompt and
output together; n from `max_ngram` down to `min_ngram`) are the guess at what comes next. Code, edits of a given
text, extraction and summaries repeat their context often; free text rarely, and then no draft is made at all.
An n-gram index kept as the run grows makes a draft cost O(max_ngram), not a scan of the context.

Drafts that fail cost each stage a wider step for nothing (on the CPU each row costs about a decode step there:
measured at S=3, 50 ms between hosts, a failed 7-token draft cost 1.4 plain steps), so either drafter is paced by
how its drafts fare (DraftPacing): it starts at FIRST_REACH drafts, a step that accepts every draft lets the next
draft 2 more, one that rejects some drafts 1 fewer (at least 1); after a step whose drafts were all rejected, the
next 1, 2, 4, ... (at most MAX_PAUSE) steps go without drafts, and a step that accepts any resets that.
"""

from __future__ import annotations

from collections.abc import Iterable

from swactor.common.objflags import MAX_DRAFT

MIN_NGRAM = 2  # one shared token is too weak a hint: drafts that fail cost a wider step for nothing
MAX_NGRAM = 4
MAX_PAUSE = 16  # decode steps without drafts at most after drafts kept failing
FIRST_REACH = 2  # drafts per step before any was verified


class DraftPacing:
    """How many drafts the next step may carry, as the drafts so far fared (the module's docstring)."""

    def __init__(self, first_reach: int = FIRST_REACH) -> None:
        self._reach = first_reach  # drafts per step at most, as they fared so far
        self._failures = 0  # steps in a row whose drafts were all rejected
        self._paused = 0  # steps still to go without drafts

    def verified(self, drafted: int, accepted: int) -> None:
        """How a step's drafts fared: all accepted reach 2 further, some rejected 1 less; all rejected pause drafting
        (longer each time in a row), any accepted resumes it."""
        if not drafted:
            return
        self._reach = min(self._reach + 2, MAX_DRAFT) if accepted == drafted else max(1, min(self._reach, drafted) - 1)
        if accepted:
            self._failures = 0
            return
        self._failures += 1
        self._paused = min(1 << (self._failures - 1), MAX_PAUSE)

    def allowance(self, k: int) -> int:
        """Drafts the next step may carry, at most k: 0 while drafting is paused (the step counts towards the pause)."""
        if self._paused:
            self._paused -= 1
            return 0
        return max(0, min(k, self._reach))


class PromptLookup:
    def __init__(self, context: Iterable[int], *, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM,
                 first_reach: int = FIRST_REACH) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram lengths {min_ngram}..{max_ngram} are not 1 <= min <= max")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        # n-gram -> the latest index j such that tokens[j-n:j] is that n-gram and tokens[j] is known (its follower)
        self._followers: dict[tuple[int, ...], int] = {}
        self.pacing = DraftPacing(first_reach)
        self.extend(context)

    def extend(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            j = len(self.tokens) - 1  # the index of the token just known: it follows the n-grams ending before it
            for n in range(self.min_ngram, min(self.max_ngram, j) + 1):
                self._followers[tuple(self.tokens[j - n:j])] = j

    def draft(self, k: int) -> tuple[int, ...]:
        """Up to k tokens that followed the longest recent repeat of the context's tail; () when none repeats or
        drafting is paused."""
        k = self.pacing.allowance(k)
        if k <= 0:
            return ()
        end = len(self.tokens)
        for n in range(min(self.max_ngram, end), self.min_ngram - 1, -1):
            j = self._followers.get(tuple(self.tokens[end - n:]))
            if j is not None:
                return tuple(self.tokens[j:min(j + k, end)])
        return ()
