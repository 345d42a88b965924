"""The arena's free list: sorted, coalesced, non-overlapping byte ranges (spec §19).

Pure data structure: no memfd, no I/O. Every range it hands out or takes back is a whole number
of `grain` bytes (the page size), so a released range can be punched out of the memfd exactly.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Range:
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class FreeList:
    """First-fit allocator over [0, ceiling) with eager coalescing on free."""

    def __init__(self, ceiling: int, grain: int) -> None:
        if grain <= 0 or grain & (grain - 1):
            raise ValueError(f"grain must be a power of two, got {grain}")
        if ceiling <= 0 or ceiling % grain:
            raise ValueError(f"ceiling must be a positive multiple of {grain}, got {ceiling}")
        self.ceiling = ceiling
        self.grain = grain
        # Parallel sorted lists: _starts[i] .. _starts[i] + _lengths[i]; never adjacent, never empty.
        self._starts: list[int] = [0]
        self._lengths: list[int] = [ceiling]

    @property
    def free_bytes(self) -> int:
        return sum(self._lengths)

    @property
    def largest(self) -> int:
        return max(self._lengths, default=0)

    def ranges(self) -> list[Range]:
        return [Range(s, n) for s, n in zip(self._starts, self._lengths, strict=True)]

    def allocate(self, length: int, alignment: int) -> Range | None:
        """Take the lowest range of `length` bytes starting on an `alignment` boundary, or None."""
        assert length > 0 and length % self.grain == 0, length
        align = max(alignment, self.grain)
        for i, (start, size) in enumerate(zip(self._starts, self._lengths, strict=True)):
            at = round_up(start, align)
            if at + length > start + size:
                continue
            head, tail = at - start, start + size - (at + length)
            # Replace range i by its (possibly empty) head and tail pieces, keeping order.
            pieces = [(s, n) for s, n in ((start, head), (at + length, tail)) if n]
            self._starts[i : i + 1] = [s for s, _ in pieces]
            self._lengths[i : i + 1] = [n for _, n in pieces]
            return Range(at, length)
        return None

    def free(self, r: Range) -> None:
        """Give a range back, merging it with free neighbours. It must not overlap a free range."""
        if (
            r.length <= 0
            or r.offset < 0
            or r.end > self.ceiling
            or r.offset % self.grain
            or r.length % self.grain
        ):
            raise ValueError(f"cannot free {r}: outside [0, {self.ceiling}) or not {self.grain}-aligned")
        i = bisect.bisect_left(self._starts, r.offset)
        prev_end = self._starts[i - 1] + self._lengths[i - 1] if i > 0 else -1
        next_start = self._starts[i] if i < len(self._starts) else self.ceiling + 1
        if prev_end > r.offset or r.end > next_start:
            raise ValueError(f"double free: {r} overlaps a free range")
        start, length = r.offset, r.length
        if prev_end == r.offset:  # merge with the previous range
            i -= 1
            start = self._starts[i]
            length += self._lengths[i]
            del self._starts[i], self._lengths[i]
        if i < len(self._starts) and self._starts[i] == r.end:  # merge with the next range
            length += self._lengths[i]
            del self._starts[i], self._lengths[i]
        self._starts.insert(i, start)
        self._lengths.insert(i, length)
