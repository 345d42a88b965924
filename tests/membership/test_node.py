"""MembershipNode with an in-memory engine (a unit-test fake): watch fan-out, local state,
join retries while alone, graceful stop, RTT probes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace

import pytest

from swactor.membership.node import MembershipNode, NodeTimings
from swactor.membership.rtt import PING, ROW, RttTable
from swactor.membership.swim import (
    JoinFailed,
    Liveness,
    MessageFailed,
    SwimCounters,
    SwimEvent,
    SwimEventKind,
    SwimMember,
)
from swactor.membership.view import ViewEventKind
from swactor.v1 import membership_pb2 as pb

SELF = SwimMember("1", "10.0.0.1:7946", Liveness.ALIVE, 0, {"id": "1", "v": "t", "st": "booting"})
PEER = SwimMember("2", "10.0.0.2:7946", Liveness.ALIVE, 0, {"id": "2", "v": "t", "st": "booting"})


class FakeEngine:
    def __init__(self, join_failures: int = 0) -> None:
        self.local_member = SELF
        self.live: dict[str, SwimMember] = {}
        self.queue: asyncio.Queue[SwimEvent | None] = asyncio.Queue()
        self.join_failures = join_failures
        self.joins = 0
        self.calls: list[str] = []
        self.sent: list[tuple[str, bytes]] = []  # user messages: (member name, data); "*" for a broadcast

    async def send(self, name: str, data: bytes) -> None:
        if name not in self.live:
            raise MessageFailed(f"{name} is not a live member")
        self.sent.append((name, data))

    async def broadcast(self, data: bytes) -> None:
        self.sent.append(("*", data))

    async def start(self) -> None:
        self.calls.append("start")

    async def join(self, seeds: list[str]) -> int:
        self.joins += 1
        if self.joins <= self.join_failures:
            raise JoinFailed("no seed answered")
        self.emit(SwimEventKind.JOINED, PEER)
        return 1

    def emit(self, kind: SwimEventKind, m: SwimMember) -> None:
        if kind in (SwimEventKind.DEAD, SwimEventKind.LEFT):
            self.live.pop(m.name, None)
        else:
            self.live[m.name] = m
        self.queue.put_nowait(SwimEvent(kind, m))

    def local(self) -> SwimMember:
        return self.local_member

    def members(self) -> list[SwimMember]:
        return [self.local_member, *self.live.values()]

    def member(self, name: str) -> SwimMember | None:
        return self.live.get(name)

    async def events(self) -> AsyncIterator[SwimEvent]:
        while (ev := await self.queue.get()) is not None:
            yield ev

    async def set_meta(self, meta: Mapping[str, str]) -> None:
        self.local_member = replace(self.local_member, meta=dict(meta), incarnation=self.local_member.incarnation + 1)

    def counters(self) -> SwimCounters:
        return SwimCounters()

    async def leave(self, timeout_s: float) -> None:
        self.calls.append("leave")

    async def close(self) -> None:
        self.calls.append("close")
        self.queue.put_nowait(None)


def make(engine: FakeEngine, seeds: list[str] | None = None) -> MembershipNode:
    md = pb.NodeMetadata(node_id=1, software_version="t", state=pb.NODE_STATE_BOOTING)
    return MembershipNode(engine, md, seeds or [], NodeTimings(0.01, 60.0, 1.0))


async def _next(q: asyncio.Queue) -> object:
    return await asyncio.wait_for(q.get(), timeout=2)


def test_join_is_retried_while_alone_and_events_reach_watchers() -> None:
    async def body() -> None:
        engine = FakeEngine(join_failures=3)
        node = make(engine, seeds=["10.0.0.2:7946"])
        await node.start()
        sub = node.subscribe()
        ev = await _next(sub.queue)
        assert ev.kind is ViewEventKind.JOIN and ev.record.member.name == "2"
        assert engine.joins == 4
        assert node.has_live_peer()
        engine.emit(SwimEventKind.SUSPECT, PEER)
        assert (await _next(sub.queue)).kind is ViewEventKind.SUSPECT
        await node.stop(graceful=True)
        assert await _next(sub.queue) is None
        assert engine.calls == ["start", "leave", "close"]

    asyncio.run(body())


def test_set_local_state_gossips_and_emits_a_self_event() -> None:
    async def body() -> None:
        engine = FakeEngine()
        node = make(engine)
        await node.start()
        sub = node.subscribe()
        rec = await node.set_local_state(pb.SetLocalStateRequest(
            state=pb.NODE_STATE_AVAILABLE, edge_endpoint="10.0.0.1:4433", stage_memory_bytes=3 << 30))
        assert rec.is_self and rec.member.incarnation == 1
        assert engine.local_member.meta["st"] == "available"
        assert engine.local_member.meta["edge"] == "10.0.0.1:4433" and engine.local_member.meta["mem"] == str(3 << 30)
        ev = await _next(sub.queue)
        assert ev.kind is ViewEventKind.METADATA_CHANGED and ev.record.is_self
        # Setting the same state again changes nothing and gossips nothing.
        await node.set_local_state(pb.SetLocalStateRequest(state=pb.NODE_STATE_AVAILABLE))
        assert engine.local_member.incarnation == 1 and sub.queue.empty()
        await node.stop(graceful=False)
        assert "leave" not in engine.calls

    asyncio.run(body())


@pytest.mark.parametrize(
    ("state", "reason", "kw", "match"),
    [
        (pb.NODE_STATE_UNSPECIFIED, "", {}, "BOOTING, AVAILABLE or FAULTED"),
        (pb.NODE_STATE_AVAILABLE, "RUN_FAULT_X", {}, "only for state FAULTED"),
        (pb.NODE_STATE_AVAILABLE, "", {"edge_endpoint": "nope"}, "host:port"),
        (pb.NODE_STATE_AVAILABLE, "", {"edge_cert_fingerprint": "zz"}, "64 hex"),
    ],
)
def test_bad_local_state_requests_are_refused_by_name(state: int, reason: str, kw: dict, match: str) -> None:
    async def body() -> None:
        engine = FakeEngine()
        node = make(engine)
        await node.start()
        with pytest.raises(ValueError, match=match):
            await node.set_local_state(pb.SetLocalStateRequest(state=state, reason=reason, **kw))
        assert engine.local_member.incarnation == 0
        await node.stop(graceful=False)

    asyncio.run(body())


def test_lost_events_are_recovered_by_resync() -> None:
    async def body() -> None:
        engine = FakeEngine()
        node = make(engine)
        await node.start()
        sub = node.subscribe()
        engine.live["2"] = PEER  # the engine knows a member whose event was dropped
        engine.queue.put_nowait(SwimEvent(SwimEventKind.RESYNC))
        ev = await _next(sub.queue)
        assert ev.kind is ViewEventKind.JOIN and ev.record.member.name == "2"
        await node.stop(graceful=False)

    asyncio.run(body())


def test_an_engine_stream_that_ends_on_its_own_marks_the_node_failed() -> None:
    async def body() -> None:
        engine = FakeEngine()
        node = make(engine)
        await node.start()
        engine.queue.put_nowait(None)  # the engine stopped without being asked
        await asyncio.wait_for(node.failed.wait(), timeout=2)
        assert "membership-pump" in node.failure
        await node.stop(graceful=True)

    asyncio.run(body())


def test_rtt_pings_are_echoed_sampled_broadcast_and_peer_rows_learned() -> None:
    async def until(what: Callable[[], object]) -> None:
        for _ in range(200):
            if what():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")

    async def body() -> None:
        engine = FakeEngine()
        md = pb.NodeMetadata(node_id=1, software_version="t", state=pb.NODE_STATE_BOOTING)
        node = MembershipNode(engine, md, [], NodeTimings(0.01, 60.0, 1.0, rtt_interval_s=0.02))
        await node.start()
        engine.emit(SwimEventKind.JOINED, PEER)
        await until(lambda: any(n == "2" and d.startswith(PING) for n, d in engine.sent))  # the loop pings the peer
        ours = next(d for n, d in engine.sent if n == "2" and d.startswith(PING))
        theirs = RttTable.ping(12345)
        engine.queue.put_nowait(SwimEvent(SwimEventKind.MESSAGE, PEER, theirs))
        await until(lambda: ("2", RttTable.pong_for(theirs)) in engine.sent)  # a peer's ping is echoed at once
        engine.queue.put_nowait(SwimEvent(SwimEventKind.MESSAGE, PEER, RttTable.pong_for(ours)))
        await until(lambda: [(r.from_node, r.to_node) for r in node.rtts()] == [(1, 2)])
        await until(lambda: any(n == "*" and d.startswith(ROW) for n, d in engine.sent))  # its row goes to everyone
        peer = RttTable(2, stale_s=10)
        peer.on_pong(3, RttTable.pong_for(RttTable.ping(0)), 7_000_000, 0.0)
        engine.queue.put_nowait(SwimEvent(SwimEventKind.MESSAGE, PEER, peer.rows(0.0)[0]))
        engine.queue.put_nowait(SwimEvent(SwimEventKind.MESSAGE, PEER, b"not ours"))  # dropped, nothing breaks
        await until(lambda: any((r.from_node, r.to_node, r.rtt_us) == (2, 3, 7000) for r in node.rtts()))
        engine.emit(SwimEventKind.DEAD, PEER)
        await until(lambda: [(r.from_node, r.to_node) for r in node.rtts()] == [])  # a dead member's row goes
        assert not node.failed.is_set()
        await node.stop(graceful=False)

    asyncio.run(body())


def test_probe_timing_advice_is_handed_over_to_be_kept() -> None:
    """A peer measured at 300 ms: the node hands the advice (longer timings) to on_advice; one that cannot be kept
    (OSError) is said, and the node goes on."""
    async def body() -> None:
        engine = FakeEngine()
        md = pb.NodeMetadata(node_id=1, software_version="t", state=pb.NODE_STATE_BOOTING)
        kept: list[object] = []

        def keep(advice: object) -> None:
            kept.append(advice)
            raise OSError("read-only state directory")

        node = MembershipNode(engine, md, [], NodeTimings(0.01, 60.0, 1.0, rtt_interval_s=0.02), on_advice=keep)
        await node.start()
        engine.emit(SwimEventKind.JOINED, PEER)
        for _ in range(200):
            pong = RttTable.pong_for(RttTable.ping(time.monotonic_ns() - 300_000_000))  # sent 300 ms ago
            engine.queue.put_nowait(SwimEvent(SwimEventKind.MESSAGE, PEER, pong))
            if kept:
                break
            await asyncio.sleep(0.01)
        assert kept and kept[0].timing.probe_timeout_s == pytest.approx(1.95, rel=0.05)  # type: ignore[attr-defined]
        assert not kept[0].sufficient  # type: ignore[attr-defined]
        assert not node.failed.is_set()
        await node.stop(graceful=False)

    asyncio.run(body())
