"""Test doubles for the lease-table core: ring-rs layout arithmetic and an in-memory arena."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from swactor.arena.freelist import Range, round_up
from swactor.arena.model import Layout, RingRequest
from swactor.arena.ports import RingInitError
from swactor.arena.table import LeaseTable

PAGE = 4096
HEADER = 256


class FakeAbi:
    """ring-rs's rule (docs/ring.md): header at the range start, data at the next max(a, 64) boundary."""

    def range_alignment(self, alignment: int) -> int:
        return max(alignment, 64)

    def required_len(self, data_capacity: int, alignment: int) -> int:
        return round_up(HEADER, max(alignment, 64)) + data_capacity

    def mint(
        self, ring_id: int, arena_offset: int, data_capacity: int, alignment: int, total_len: int
    ) -> Layout:
        data = arena_offset + round_up(HEADER, max(alignment, 64))
        return Layout(ring_id, arena_offset, total_len, arena_offset, data, data_capacity, alignment)


@dataclass
class FakeMemory:
    """Records page ownership: preparing a page that is still live means two leases overlap."""

    live: dict[int, int] = field(default_factory=dict)  # page index -> ring id
    scrubbed: list[Range] = field(default_factory=list)
    fail_next: bool = False
    prefaulted: list[int] = field(default_factory=list)

    def prepare(self, layout: Layout, prefault: bool) -> None:
        if self.fail_next:
            self.fail_next = False
            raise RingInitError("injected header init failure")
        first, n = layout.arena_offset // PAGE, layout.total_len // PAGE
        for page in range(first, first + n):
            assert page not in self.live, (
                f"page {page} of ring {layout.ring_id} is live for ring {self.live[page]}"
            )
            self.live[page] = layout.ring_id
        if prefault:
            self.prefaulted.append(layout.ring_id)

    def scrub(self, r: Range) -> None:
        for page in range(r.offset // PAGE, r.end // PAGE):
            self.live.pop(page, None)
        self.scrubbed.append(r)


def make_table(
    ceiling: int = 64 * PAGE, *, holders: tuple[int, ...] = (1, 2, 3)
) -> tuple[LeaseTable, FakeMemory]:
    memory = FakeMemory()
    ids = count(1)
    table = LeaseTable(ceiling, page_size=PAGE, abi=FakeAbi(), memory=memory, next_ring_id=lambda: next(ids))
    table.boot_succeeded("test")
    for h in holders:
        table.holder_joined(h, pid=1000 + h, uid=0)
    return table, memory


_request_ids = count(1)


def req(
    capacity: int = PAGE, *, holder: int = 1, alignment: int = 64, edge_id: int = 7, **kw: object
) -> RingRequest:
    fields: dict[str, object] = {
        "request_id": next(_request_ids),
        "requester": "test",
        "edge_id": edge_id,
        "direction": 1,
        "data_capacity": capacity,
        "alignment": alignment,
        "holder_id": holder,
    }
    fields.update(kw)
    return RingRequest(**fields)  # type: ignore[arg-type]


def pages_for(capacity: int) -> int:
    """Pages a ring of `capacity` data bytes at alignment 64 occupies."""
    return round_up(HEADER + capacity, PAGE) // PAGE
