"""Pure cores: credit policy, preamble codec, rendezvous (both orders, timeout, duplicates, planned producers)."""

from __future__ import annotations

import pytest

from swactor.edge import credit, preamble
from swactor.edge.rendezvous import ProducerMissing, RejectStream, Rendezvous, StartRecvPump
from swactor.v1 import common_pb2


@pytest.mark.parametrize(
    ("delivered", "free", "window", "limit"),
    [(0, 100, 50, 50), (1000, 10, 50, 1010), (1000, 0, 50, 1000), (5, 1 << 30, 1 << 20, 5 + (1 << 20))],
)
def test_credit_limit_follows_ring_free_space(delivered: int, free: int, window: int, limit: int) -> None:
    assert credit.credit_limit(delivered, free, window) == limit


def test_announcement_batches_and_unblocks() -> None:
    # plenty of headroom, small move: no update
    assert credit.next_announcement(delivered=100, ring_free=1000, window=1000, announced=1050, received=100) is None
    # sender nearly blocked: any increase is announced
    assert credit.next_announcement(delivered=1000, ring_free=10, window=1000, announced=1000, received=1000) == 1010
    # a quarter window of new room: announced
    assert credit.next_announcement(delivered=300, ring_free=1000, window=1000, announced=1000, received=300) == 1300
    # never shrinks
    assert credit.next_announcement(delivered=0, ring_free=0, window=1000, announced=1000, received=0) is None


def test_preamble_roundtrip_and_errors() -> None:
    data = preamble.encode(0xDEADBEEF)
    assert len(data) == preamble.PREAMBLE_LEN and preamble.decode(data) == 0xDEADBEEF
    r = preamble.PreambleReader()
    assert r.feed(data[:5]) is None
    assert r.feed(data[5:] + b"rest") == (0xDEADBEEF, b"rest")
    with pytest.raises(preamble.MalformedPreamble):
        preamble.PreambleReader().feed(b"GET / HTTP")
    with pytest.raises(preamble.MalformedPreamble):
        preamble.decode(preamble.MAGIC + bytes(8))
    with pytest.raises(ValueError):
        preamble.encode(0)


P, Q, R = 10, 20, 30  # node ids: P is the edges' planned producer, Q and R are not


def test_rendezvous_spec_first() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    assert rv.establish_recv(1, P, "spec", now=0.0) == []
    act = rv.stream_arrived(1, P, "stream", now=0.0, initial=b"ab")
    assert act == StartRecvPump(1, "spec", "stream", b"ab")
    assert rv.next_deadline() is None


def test_rendezvous_stream_first_keeps_bytes() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    assert rv.stream_arrived(1, P, "stream", now=10.0, initial=b"ab") is None
    assert rv.parked_data(1, P, b"cd")
    assert not rv.parked_data(1, Q, b"xx")
    assert rv.next_deadline() == 15.0
    assert rv.establish_recv(1, P, "spec", now=11.0) == [StartRecvPump(1, "spec", "stream", b"abcd")]
    with pytest.raises(ValueError):
        rv.establish_recv(1, P, "again", now=11.0)


def test_rendezvous_timeout_and_duplicates() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    rv.stream_arrived(1, P, "s1", now=0.0)
    dup = rv.stream_arrived(1, P, "s2", now=1.0)
    assert isinstance(dup, RejectStream) and dup.reason == common_pb2.STREAM_FAULT_UNKNOWN_EDGE
    assert rv.expire(4.9) == []
    (rej,) = rv.expire(5.0)
    assert isinstance(rej, RejectStream)
    assert rej.edge_id == 1 and rej.stream == "s1" and rej.reason == common_pb2.STREAM_FAULT_RENDEZVOUS_TIMEOUT
    assert rv.pending_streams == {} and rv.parked == 0


def test_rendezvous_stop_returns_parked_streams() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    rv.stream_arrived(2, P, "s", now=0.0)
    rv.stream_arrived(2, Q, "t", now=0.0)
    assert sorted(rv.stop(2)) == ["s", "t"]
    assert rv.stop(2) == [] and rv.parked == 0


# ---- the producer check (spec §4, §39) ----


def test_stream_from_another_node_is_refused_while_the_spec_waits() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    rv.establish_recv(1, P, "spec", now=0.0)
    rej = rv.stream_arrived(1, Q, "foreign", now=1.0)
    assert isinstance(rej, RejectStream)
    assert (rej.reason, rej.stream, rej.node_id) == (common_pb2.STREAM_FAULT_WRONG_PRODUCER, "foreign", Q)
    assert f"node {P}" in rej.detail
    assert rv.next_deadline() == 6.0  # the planned producer has one rendezvous timeout to come
    assert rv.stream_arrived(1, P, "mine", now=2.0) == StartRecvPump(1, "spec", "mine", b"")
    assert rv.next_deadline() is None and rv.expire(100.0) == []
    late = rv.stream_arrived(1, R, "late", now=3.0)  # after the match: still not the producer
    assert isinstance(late, RejectStream) and late.reason == common_pb2.STREAM_FAULT_WRONG_PRODUCER


def test_a_foreign_stream_parked_first_cannot_take_the_edge() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    assert rv.stream_arrived(1, Q, "foreign", now=0.0) is None  # nobody knows the producer yet
    assert rv.stream_arrived(1, P, "mine", now=0.5, initial=b"x") is None  # parks beside it
    assert rv.parked == 2
    out = rv.establish_recv(1, P, "spec", now=1.0)
    assert StartRecvPump(1, "spec", "mine", b"x") in out
    (rej,) = [a for a in out if isinstance(a, RejectStream)]
    assert (rej.stream, rej.reason) == ("foreign", common_pb2.STREAM_FAULT_WRONG_PRODUCER)
    assert rv.parked == 0 and rv.next_deadline() is None


def test_planned_producer_that_never_comes_faults_the_edge() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    rv.stream_arrived(1, Q, "foreign", now=0.0)
    (rej,) = rv.establish_recv(1, P, "spec", now=2.0)
    assert isinstance(rej, RejectStream) and rej.reason == common_pb2.STREAM_FAULT_WRONG_PRODUCER
    assert rv.next_deadline() == 7.0
    assert rv.expire(6.9) == []
    (missing,) = rv.expire(7.0)
    assert isinstance(missing, ProducerMissing)
    assert (missing.edge_id, missing.spec, missing.reason) == (1, "spec", common_pb2.STREAM_FAULT_WRONG_PRODUCER)
    assert f"node {Q}" in missing.detail and f"node {P}" in missing.detail
    assert rv.recv_specs == {} and rv.next_deadline() is None


def test_datagram_size_follows_route_and_limits() -> None:
    from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE

    from swactor.edge.mtu import UDP_MAX_PAYLOAD, datagram_size_for, route_mtu

    mtu = route_mtu(("127.0.0.1", 9))
    assert mtu is not None and mtu >= 1500
    assert datagram_size_for(("127.0.0.1", 9), 0, 1 << 20) == min(mtu - 28, UDP_MAX_PAYLOAD)
    assert datagram_size_for(("127.0.0.1", 9), 0, 4000) == 4000
    assert datagram_size_for(("127.0.0.1", 9), 100, 4000) == SMALLEST_MAX_DATAGRAM_SIZE
    assert datagram_size_for(("127.0.0.1", 9), 1 << 20, 4000) == UDP_MAX_PAYLOAD
