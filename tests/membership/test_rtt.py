"""The RTT core (membership/rtt.py): samples from echoed pings, medians, broadcast rows and staleness."""

from __future__ import annotations

from swactor.membership.rtt import MAX_BROADCAST, PING, ROW_ENTRIES, RttTable


def _sample(t: RttTable, peer: int, sent_ns: int, rtt_us: int, now_s: float) -> int | None:
    pong = RttTable.pong_for(RttTable.ping(sent_ns))
    assert pong is not None
    return t.on_pong(peer, pong, sent_ns + rtt_us * 1000, now_s)


def test_an_echoed_ping_is_one_sample_and_the_rtt_is_the_median_of_the_last_ones() -> None:
    t = RttTable(1, stale_s=10)
    for i, rtt in enumerate([500, 40_000, 510, 520, 505]):  # one sample held behind a burst
        assert _sample(t, 2, 10**9 * i, rtt, now_s=i) == rtt
    [r] = t.matrix(now_s=5)
    assert (r.from_node, r.to_node, r.rtt_us, r.age_s) == (1, 2, 510, 1)


def test_malformed_messages_are_refused_not_trusted() -> None:
    t = RttTable(1, stale_s=10)
    assert RttTable.pong_for(PING + b"short") is None
    assert RttTable.pong_for(b"xx" + bytes(8)) is None
    assert t.on_pong(2, b"rq" + bytes(3), 10, 0) is None
    assert _sample(t, 2, sent_ns=5_000_000, rtt_us=-4, now_s=0) is None  # from the future
    assert _sample(t, 1, sent_ns=0, rtt_us=100, now_s=0) is None  # from itself
    assert not t.on_row(b"rr" + bytes(8) + bytes(5), 0)  # not whole entries
    assert not t.on_row(b"zz" + bytes(8), 0)
    assert t.matrix(0) == []


def test_rows_travel_in_broadcasts_that_fit_and_are_learned_whole() -> None:
    a, b = RttTable(1, stale_s=10), RttTable(99, stale_s=10)
    peers = range(100, 100 + ROW_ENTRIES + 3)
    for p in peers:
        _sample(a, p, 0, 1000 + p, now_s=0)
    rows = a.rows(now_s=1)
    assert len(rows) == 2 and all(len(r) <= MAX_BROADCAST for r in rows)
    assert all(b.on_row(r, now_s=2) for r in rows)
    learned = {(r.from_node, r.to_node): r.rtt_us for r in b.matrix(now_s=2)}
    assert learned == {(1, p): 1000 + p for p in peers}
    assert not a.on_row(rows[0], 2)  # its own row coming back is not a peer's


def test_stale_samples_and_rows_are_dropped_and_departed_members_forgotten() -> None:
    a, b = RttTable(1, stale_s=10), RttTable(2, stale_s=10)
    _sample(a, 2, 0, 700, now_s=0)
    _sample(a, 3, 0, 800, now_s=8)
    b.on_row(a.rows(now_s=8)[0], now_s=8)
    assert [(r.to_node, r.rtt_us) for r in a.matrix(now_s=11)] == [(3, 800)]  # 2's sample is 11 s old
    assert len(b.matrix(now_s=18)) == 2 and b.matrix(now_s=19) == []
    a.forget([3])
    assert a.matrix(now_s=11) == [] and a.rows(now_s=11) == []
