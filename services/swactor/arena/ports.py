"""What the lease table needs from the outside, as two small protocols.

`RingAbi` is ring-rs's layout arithmetic (header size and placement); `RangeMemory` touches the
arena mapping (write a fresh ring header, give pages back to the OS). The service plugs in the
real implementations (swactor.arena.memory); core tests plug in in-memory fakes.
"""

from __future__ import annotations

from typing import Protocol

from swactor.arena.freelist import Range
from swactor.arena.model import Layout


class RingAbi(Protocol):
    def range_alignment(self, alignment: int) -> int:
        """Alignment a ring range must start on for this data alignment."""
        ...

    def required_len(self, data_capacity: int, alignment: int) -> int:
        """Bytes of header plus data a ring of this shape occupies (not page-rounded)."""
        ...

    def mint(
        self, ring_id: int, arena_offset: int, data_capacity: int, alignment: int, total_len: int
    ) -> Layout:
        """The canonical layout of a ring in the range [arena_offset, arena_offset + total_len)."""
        ...


class RingInitError(Exception):
    """Writing the ring header failed; the lease is rejected and its range returned."""


class RangeMemory(Protocol):
    def prepare(self, layout: Layout, prefault: bool) -> None:
        """Initialise the ring header in place (and optionally pre-fault the range); may raise RingInitError."""
        ...

    def scrub(self, r: Range) -> None:
        """Return the range's pages to the OS; afterwards it reads as zeros."""
        ...
