"""Hypothesis state machine: ring-rs spans and cursors against a byte-level model (spec §20-21).

The model is a FIFO of committed, unconsumed bytes. Properties checked after every step:
- a producer span never overlaps physical bytes that are committed but unread
  (the producer scribbles 0xEE over its whole span; the consumer would see it);
- a consumer span only ever contains committed bytes, in order;
- spans never cross the physical end of the data region;
- advancing past the span / readable count raises RingError(field="n") and changes nothing.
"""

from __future__ import annotations

from collections import deque

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import swactor_ring as sr

ARENA_SIZE = 1 << 16


class RingModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.unread: deque[int] = deque()
        self.next_byte = 0
        self.span_len = 0  # last writable span length (producer reservation)

    @initialize(capacity=st.integers(1, 97), alignment=st.sampled_from([1, 1, 1, 8]))
    def setup(self, capacity: int, alignment: int) -> None:
        capacity = max(alignment, capacity - capacity % alignment)
        self.fd = sr.Arena.create_memfd("ring-model", ARENA_SIZE)
        self.arena = sr.Arena.from_fd(self.fd, ARENA_SIZE)
        self.layout = sr.RingLayout.for_range(1, 4096, capacity, alignment)
        sr.init_ring(self.arena, self.layout)
        self.p = sr.Producer(self.arena, self.layout)
        self.c = sr.Consumer(
            self.arena, self.layout, readable_fd=self.p.readable_fd, writable_fd=self.p.writable_fd
        )
        self.capacity = capacity

    def teardown(self) -> None:
        import os

        if hasattr(self, "fd"):
            os.close(self.fd)

    def _fresh(self, n: int) -> bytes:
        out = bytes((self.next_byte + i) % 251 for i in range(n))
        self.next_byte += n
        return out

    def _unread_phys(self) -> set[int]:
        start = self.c.consume
        return {(start + i) % self.capacity for i in range(len(self.unread))}

    @rule(max_len=st.one_of(st.none(), st.integers(0, 128)), frac=st.floats(0, 1))
    def produce_span(self, max_len: int | None, frac: float) -> None:
        span = self.p.writable_span(max_len)
        n_span = len(span)
        free = self.capacity - len(self.unread)
        phys = span.cursor % self.capacity
        assert span.cursor == self.p.commit
        assert phys + n_span <= self.capacity, "span crosses the physical end"
        assert span.arena_offset == self.layout.data_offset + phys
        assert n_span == min(free, self.capacity - phys, self.capacity if max_len is None else max_len)
        assert not ({(phys + i) for i in range(n_span)} & self._unread_phys()), "span overlaps unread bytes"
        k = int(n_span * frac)
        with memoryview(span) as mv:
            mv[:] = b"\xee" * n_span  # scribble everything we were given
            mv[:k] = data = self._fresh(k)
        self.p.advance_commit(k)
        self.unread.extend(data)
        self.span_len = 0

    @rule(extra=st.integers(1, 5))
    def over_commit_is_rejected(self, extra: int) -> None:
        span = self.p.writable_span()
        before = self.p.commit
        with pytest.raises(sr.RingError) as e:
            self.p.advance_commit(len(span) + extra)
        assert e.value.field == "n"
        assert self.p.commit == before

    @rule(n=st.integers(0, 200))
    def bulk_write(self, n: int) -> None:
        data = self._fresh(n)
        written = self.p.write(data)
        assert written == min(n, self.capacity - len(self.unread))
        self.unread.extend(data[:written])
        self.next_byte -= n - written

    @rule(max_len=st.one_of(st.none(), st.integers(0, 128)), frac=st.floats(0, 1))
    def consume_span(self, max_len: int | None, frac: float) -> None:
        span = self.c.readable_span(max_len)
        phys = span.cursor % self.capacity
        assert span.cursor == self.c.consume
        assert phys + len(span) <= self.capacity
        assert len(span) <= len(self.unread), "consumer sees uncommitted bytes"
        assert bytes(span) == bytes(list(self.unread)[: len(span)])
        if len(span):
            with pytest.raises(TypeError):  # consumer spans are read-only
                memoryview(span)[:1] = b"x"
        k = int(len(span) * frac)
        self.c.advance_consume(k)
        for _ in range(k):
            self.unread.popleft()

    @rule(extra=st.integers(1, 5))
    def over_consume_is_rejected(self, extra: int) -> None:
        before = self.c.consume
        with pytest.raises(sr.RingError) as e:
            self.c.advance_consume(len(self.unread) + extra)
        assert e.value.field == "n"
        assert self.c.consume == before

    @rule(n=st.integers(0, 200), peek=st.booleans())
    def bulk_read(self, n: int, peek: bool) -> None:
        buf = bytearray(n)
        got = self.c.peek_into(buf) if peek else self.c.read_into(buf)
        assert got == min(n, len(self.unread))
        assert bytes(buf[:got]) == bytes(list(self.unread)[:got])
        if not peek:
            for _ in range(got):
                self.unread.popleft()

    @precondition(lambda self: hasattr(self, "p"))
    @invariant()
    def cursors_match_model(self) -> None:
        st_ = self.p.status()
        assert st_.commit - st_.consume == len(self.unread)
        assert self.c.readable() == len(self.unread)
        assert self.p.free() == self.capacity - len(self.unread)


RingModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRingModel = RingModel.TestCase
