"""Pure cores: credit policy, preamble codec, rendezvous (both orders, timeout, duplicates)."""

from __future__ import annotations

import pytest

from swactor.edge import credit, preamble
from swactor.edge.rendezvous import RejectStream, Rendezvous, StartRecvPump
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


def test_rendezvous_spec_first() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    assert rv.establish_recv(1, "spec") is None
    act = rv.stream_arrived(1, "stream", now=0.0, initial=b"ab")
    assert act == StartRecvPump(1, "spec", "stream", b"ab")
    assert rv.next_deadline() is None


def test_rendezvous_stream_first_keeps_bytes() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    assert rv.stream_arrived(1, "stream", now=10.0, initial=b"ab") is None
    assert rv.parked_data(1, b"cd")
    assert rv.next_deadline() == 15.0
    assert rv.establish_recv(1, "spec") == StartRecvPump(1, "spec", "stream", b"abcd")
    with pytest.raises(ValueError):
        rv.establish_recv(1, "again")


def test_rendezvous_timeout_and_duplicates() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    rv.stream_arrived(1, "s1", now=0.0)
    dup = rv.stream_arrived(1, "s2", now=1.0)
    assert isinstance(dup, RejectStream) and dup.reason == common_pb2.STREAM_FAULT_UNKNOWN_EDGE
    assert rv.expire(4.9) == []
    (rej,) = rv.expire(5.0)
    assert rej.edge_id == 1 and rej.stream == "s1" and rej.reason == common_pb2.STREAM_FAULT_RENDEZVOUS_TIMEOUT
    assert rv.pending_streams == {}


def test_rendezvous_stop_returns_parked_stream() -> None:
    rv: Rendezvous[str, str] = Rendezvous(timeout=5)
    rv.stream_arrived(2, "s", now=0.0)
    assert rv.stop(2) == "s"
    assert rv.stop(2) is None


def test_datagram_size_follows_route_and_limits() -> None:
    from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE

    from swactor.edge.mtu import UDP_MAX_PAYLOAD, datagram_size_for, route_mtu

    mtu = route_mtu(("127.0.0.1", 9))
    assert mtu is not None and mtu >= 1500
    assert datagram_size_for(("127.0.0.1", 9), 0, 1 << 20) == min(mtu - 28, UDP_MAX_PAYLOAD)
    assert datagram_size_for(("127.0.0.1", 9), 0, 4000) == 4000
    assert datagram_size_for(("127.0.0.1", 9), 100, 4000) == SMALLEST_MAX_DATAGRAM_SIZE
    assert datagram_size_for(("127.0.0.1", 9), 1 << 20, 4000) == UDP_MAX_PAYLOAD
