"""What a ring end raises (`ringport`, and the in-memory rings of tests). Kept apart from `ringport`
so that the I/O-free ring-object FSMs, and a process that imports the native ring helper late (to
report a broken one as an event), can name these without importing `swactor_ring`."""

from __future__ import annotations

from swactor.common.reasons import ReasonError


class RingBroken(ReasonError):
    """The ring is unusable (faulted, closed under a producer, layout/ABI problem, handle released):
    `reason` is a §37 RingFaultReason (common_pb2 value), `detail` says what happened."""


class RingClosed(Exception):
    """The producer closed the ring and every committed byte has been read: the end of the data."""
