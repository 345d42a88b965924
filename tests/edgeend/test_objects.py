"""§32 ring-object FSMs over an in-memory ring: every ObjectFailure, wrap-around, backpressure."""

from __future__ import annotations

import pytest

from swactor.edgeend.objects import (
    Broken,
    Closed,
    EgressProducer,
    EgressState,
    Failed,
    HeaderFacts,
    IngressParser,
    IngressState,
    Loaded,
    ObjectRules,
    OutputRejected,
    Produced,
)
from swactor.v1 import common_pb2 as pb

from .fakes import BytesSource, FakeCodec, FakeRing, HostSink

CODEC = FakeCodec()
RULES = ObjectRules.from_spec(max_extent=64, dtype_width_bytes=4, row_elements=2, alignment=4)


def record(seq: int, payload: bytes, **kw: int) -> bytes:
    return CODEC.encode(HeaderFacts(100 + seq, seq, len(payload)), **kw) + payload


def parser(ring: FakeRing, sink: HostSink | None = None) -> IngressParser:
    return IngressParser(ring, CODEC, RULES, sink or HostSink(), ring_id=1, edge_id=2)


def test_complete_object_loads_and_partial_does_not() -> None:
    ring = FakeRing(256)
    p = parser(ring)
    rec = record(0, bytes(range(16)))
    ring.push(rec[:-1])
    assert p.pump() == []  # one byte missing: no ObjectLoaded (§16)
    assert p.state is IngressState.NEED_PAYLOAD
    ring.push(rec[-1:])
    (ev,) = p.pump()
    assert isinstance(ev, Loaded) and ev.facts.sequence == 0 and bytes(ev.buffer.data) == bytes(range(16))
    assert ring.consume == ring.commit
    assert p.state is IngressState.NEED_HEADER


def test_objects_larger_than_ring_and_wrapped_headers() -> None:
    ring = FakeRing(48)  # smaller than header + payload: the ring is a window
    p = parser(ring)
    stream = b"".join(record(s, bytes([s]) * 64) for s in range(3))
    loaded: list[Loaded] = []
    sent = 0
    for _ in range(100):
        sent += ring.push(stream[sent:])
        loaded += [e for e in p.pump() if isinstance(e, Loaded)]
        if sent == len(stream) and len(loaded) == 3:
            break
    assert [e.facts.sequence for e in loaded] == [0, 1, 2]
    assert [bytes(e.buffer.data) for e in loaded] == [bytes([s]) * 64 for s in range(3)]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (record(0, b"\0" * 8, magic=0xDEAD), pb.OBJECT_FAILURE_HEADER_MALFORMED),
        (record(0, b"\0" * 8, version=9), pb.OBJECT_FAILURE_UNSUPPORTED_OBJECT_VERSION),
        (record(0, b"\0" * 72), pb.OBJECT_FAILURE_EXTENT_EXCEEDS_MAX),
        (record(0, b"\0" * 6), pb.OBJECT_FAILURE_EXTENT_ALIGNMENT_INVALID),
        (record(0, b""), pb.OBJECT_FAILURE_EXTENT_ALIGNMENT_INVALID),
        (record(1, b"\0" * 8), pb.OBJECT_FAILURE_SEQUENCE_VIOLATION),
    ],
)
def test_header_failures(data: bytes, reason: str) -> None:
    ring = FakeRing(256)
    p = parser(ring)
    ring.push(data)
    (ev,) = p.pump()
    assert isinstance(ev, Failed) and ev.reason == reason
    assert p.state is IngressState.FAULTED
    assert p.pump() == []  # Faulted stops consuming


def test_sequence_must_follow_previous() -> None:
    ring = FakeRing(256)
    p = parser(ring)
    ring.push(record(0, b"\1" * 8) + record(2, b"\2" * 8))
    ev = p.pump()
    assert isinstance(ev[0], Loaded)
    assert isinstance(ev[1], Failed) and ev[1].reason == pb.OBJECT_FAILURE_SEQUENCE_VIOLATION and ev[1].sequence == 2


@pytest.mark.parametrize("cut", [0, 10, FakeCodec.header_len + 3])
def test_eof(cut: int) -> None:
    ring = FakeRing(256)
    p = parser(ring)
    ring.push(record(0, b"\1" * 8)[:cut] if cut else record(0, b"\1" * 8))
    ring.closed = True
    events = p.pump()
    if cut == 0:
        assert isinstance(events[0], Loaded) and isinstance(events[1], Closed)
        assert p.state is IngressState.CLOSED
    else:
        (ev,) = events
        assert isinstance(ev, Failed) and ev.reason == pb.OBJECT_FAILURE_EOF_MID_OBJECT


def test_device_failures_free_the_partial_object() -> None:
    ring = FakeRing(256)
    sink = HostSink(fail_alloc=True)
    ring.push(record(0, b"\1" * 8))
    (ev,) = parser(ring, sink).pump()
    assert isinstance(ev, Failed) and ev.reason == pb.OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED and ev.object_id == 100
    ring = FakeRing(256)
    sink = HostSink(fail_write=True)
    ring.push(record(0, b"\1" * 8))
    (ev,) = parser(ring, sink).pump()
    assert isinstance(ev, Failed) and ev.reason == pb.OBJECT_FAILURE_DEVICE_COPY_FAILED and sink.live == []


def test_broken_ring_is_a_ring_fault() -> None:
    ring = FakeRing(256)
    ring.broken = pb.RING_FAULT_RING_STATE_INVALID
    p = parser(ring)
    (ev,) = p.pump()
    assert ev == Broken(pb.RING_FAULT_RING_STATE_INVALID, "fake ring faulted") and p.state is IngressState.FAULTED


def test_egress_backpressure_and_roundtrip() -> None:
    ring = FakeRing(40)
    e = EgressProducer(ring, CODEC, RULES, ring_id=3)
    payload = bytes(range(64))
    e.start(HeaderFacts(7, 0, 64), BytesSource(payload))
    rx = parser(FakeRing(1))  # parse what the producer wrote, through a second ring
    out = bytearray()
    produced: list[Produced] = []
    for _ in range(20):
        produced += [ev for ev in e.pump() if isinstance(ev, Produced)]
        out += ring.drain()  # the "send pump" frees space: the producer can continue
        if produced:
            break
    assert produced == [Produced(HeaderFacts(7, 0, 64))]
    assert e.state is EgressState.WAITING_FOR_OUTPUT
    back = FakeRing(256)
    back.push(bytes(out))
    rx.ring = back
    (ev,) = rx.pump()
    assert isinstance(ev, Loaded) and bytes(ev.buffer.data) == payload


def test_egress_full_ring_waits() -> None:
    ring = FakeRing(48)
    e = EgressProducer(ring, CODEC, RULES)
    e.start(HeaderFacts(7, 0, 16), BytesSource(b"\3" * 16))
    assert e.pump() == []
    assert e.state is EgressState.NEED_WRITABLE_FOR_PAYLOAD and ring.commit == 48


@pytest.mark.parametrize(
    ("facts", "payload", "reason"),
    [
        (HeaderFacts(1, 0, 72), b"\0" * 72, pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID),
        (HeaderFacts(1, 0, 8), b"\0" * 16, pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID),
        (HeaderFacts(1, 5, 8), b"\0" * 8, pb.STEP_FAILURE_INVALID_OUTPUT_RING),
    ],
)
def test_egress_rejects(facts: HeaderFacts, payload: bytes, reason: str) -> None:
    e = EgressProducer(FakeRing(256), CODEC, RULES)
    with pytest.raises(OutputRejected) as info:
        e.start(facts, BytesSource(payload))
    assert info.value.reason == reason


def test_egress_copy_failure_faults() -> None:
    e = EgressProducer(FakeRing(256), CODEC, RULES)
    e.start(HeaderFacts(1, 0, 8), BytesSource(b"\0" * 8, fail=True))
    (ev,) = e.pump()
    assert isinstance(ev, Broken) and ev.reason == pb.RING_FAULT_DEVICE_COPY_FAILED and e.state is EgressState.FAULTED
