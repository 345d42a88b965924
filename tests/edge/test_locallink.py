"""The local link (locallink.py) on an asyncio loop, with a listener that records what a driver would
hear: credit limits delivery, FIN after the last byte, STOP_SENDING answered by RESET_STREAM, reset,
close, and delivery never inside the caller's input. Waits are loop turns (passes are `call_soon`),
never time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from swactor.edge.locallink import LocalLink
from swactor.edge.streamport import StreamPort, new_uid

NODE = 7
WINDOW = 100


@dataclass
class Recorder:
    """A LinkListener that records events; `react` hooks run inside a callback, as the table's would."""

    got: dict[int, bytearray] = field(default_factory=dict)
    fins: list[int] = field(default_factory=list)
    events: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, stream id, code)
    progress: int = 0
    lost: list[StreamPort] = field(default_factory=list)
    inside: bool = False  # a callback is running: a nested one would be re-entry
    on_data: Callable[[int, bytes, bool], None] | None = None
    on_ack: Callable[[], None] | None = None
    link: LocalLink | None = None

    def _enter(self) -> None:
        assert not self.inside, "the link re-entered its listener"
        self.inside = True

    def on_stream_data(self, conn: StreamPort, stream_id: int, data: bytes, end: bool) -> None:
        self._enter()
        assert self.link is not None and conn is self.link.receiver
        self.got.setdefault(stream_id, bytearray()).extend(data)
        if end:
            self.fins.append(stream_id)
        if self.on_data is not None:
            self.on_data(stream_id, data, end)
        self.inside = False

    def on_stream_reset(self, conn: StreamPort, stream_id: int, error_code: int) -> None:
        assert self.link is not None and conn is self.link.receiver
        self.events.append(("reset", stream_id, error_code))

    def on_stop_sending(self, conn: StreamPort, stream_id: int, error_code: int) -> None:
        assert self.link is not None and conn is self.link.sender
        self.events.append(("stop", stream_id, error_code))

    def on_progress(self, conn: StreamPort) -> None:
        self._enter()
        assert self.link is not None and conn is self.link.sender
        self.progress += 1
        if self.on_ack is not None:
            self.on_ack()
        self.inside = False

    def on_connection_lost(self, conn: StreamPort, reason: str, not_authorized: bool) -> None:
        assert conn.closed and not not_authorized
        self.lost.append(conn)


def run(test: Callable[[LocalLink, Recorder], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        rec = Recorder()
        link = rec.link = LocalLink(node_id=NODE, listener=rec, initial_window=WINDOW,
                                    loop=asyncio.get_running_loop())
        await test(link, rec)

    asyncio.run(main())


async def turns(n: int = 20) -> None:
    """Let the loop run `n` rounds of ready callbacks (each delivery pass is one)."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_ends_are_connections_to_this_node_with_their_own_uids() -> None:
    async def t(link: LocalLink, rec: Recorder) -> None:
        ends: list[StreamPort] = [link.sender, link.receiver]
        assert [e.peer_node_id for e in ends] == [NODE, NODE]
        assert len({link.sender.uid, link.receiver.uid, new_uid()}) == 3
        assert [link.sender.open_stream(b"a"), link.sender.open_stream(b"b")] == [2, 6]  # client uni-streams

    run(t)


def test_nothing_moves_inside_the_callers_input_and_transmit_coalesces() -> None:
    async def t(link: LocalLink, rec: Recorder) -> None:
        sid = link.sender.open_stream(b"x" * 10)
        link.sender.send(sid, b"y" * 10)
        link.sender.transmit()
        link.receiver.transmit()
        assert not rec.got and link.sender.queued(sid) == 20
        await turns(1)
        assert rec.got[sid] == b"x" * 10 + b"y" * 10 and rec.progress == 1  # one pass for both transmits
        assert link.sender.queued(sid) == 0 and link.delivered_bytes == 20

    run(t)


def test_credit_limits_delivery_and_a_grant_moves_the_rest() -> None:
    async def t(link: LocalLink, rec: Recorder) -> None:
        sid = link.sender.open_stream(b"p" * 12)
        span = memoryview(bytearray(b"0123456789" * 30))
        link.sender.send(sid, span)
        span[:10] = b"!" * 10  # the link holds a copy: the ring span may be reused at once
        link.sender.transmit()
        await turns()
        assert len(rec.got[sid]) == WINDOW  # the initial window, no more
        assert link.receiver.credit(sid) == (WINDOW, WINDOW)
        assert link.sender.queued(sid) == 312 - WINDOW  # undelivered: what the send pump counts
        assert not link.receiver.grant(sid, WINDOW)  # credit never shrinks or repeats
        assert link.receiver.grant(sid, 250)  # no transmit: a grant gets the waiting bytes going itself
        await turns()
        assert len(rec.got[sid]) == 250 and link.sender.queued(sid) == 62
        assert link.receiver.grant(sid, 10_000)
        await turns()
        assert bytes(rec.got[sid]) == b"p" * 12 + b"0123456789" * 30 and not rec.fins
        assert link.receiver.credit(sid) == (10_000, 312)

    run(t)


def test_fin_comes_with_the_last_byte_and_waits_for_credit() -> None:
    async def t(link: LocalLink, rec: Recorder) -> None:
        sid = link.sender.open_stream(b"p" * 12)
        link.sender.send(sid, b"d" * 150, end=True)
        link.sender.transmit()
        await turns()
        assert len(rec.got[sid]) == WINDOW and not rec.fins
        link.receiver.grant(sid, 162)
        await turns()
        assert len(rec.got[sid]) == 162 and rec.fins == [sid]
        # finished: gone on both sides, as QUIC's stream once every byte and FIN are through
        assert link.receiver.credit(sid) == (0, 0) and link.sender.queued(sid) == 0
        # an empty stream's FIN needs no credit
        sid2 = link.sender.open_stream(b"")
        link.sender.send(sid2, b"", end=True)
        link.sender.transmit()
        await turns()
        assert rec.fins == [sid, sid2] and rec.got[sid2] == b""

    run(t)


def test_stop_sending_is_answered_by_a_reset_and_drops_what_waits() -> None:
    async def t(link: LocalLink, rec: Recorder) -> None:
        sid = link.sender.open_stream(b"p" * 12)
        link.sender.send(sid, b"d" * 500)
        link.sender.transmit()
        await turns()
        assert len(rec.got[sid]) == WINDOW
        link.receiver.stop_stream(sid, 0x5)  # no transmit: a control call schedules its own pass
        await turns()
        assert rec.events == [("stop", sid, 0x5), ("reset", sid, 0x5)]
        assert link.sender.queued(sid) == 0 and link.receiver.credit(sid) == (0, 0)
        link.sender.send(sid, b"late", end=True)  # a pump that has not heard yet: dropped
        link.receiver.stop_stream(sid, 0x5)  # the stream is gone: still only a reset, no error
        link.sender.transmit()
        await turns()
        assert len(rec.got[sid]) == WINDOW and not rec.fins
        assert rec.events[2:] == [("reset", sid, 0x5)]

    run(t)


def test_stop_after_fin_still_resets_so_the_receiver_forgets_the_stream() -> None:
    async def t(link: LocalLink, rec: Recorder) -> None:
        sid = link.sender.open_stream(b"p" * 12)
        link.sender.send(sid, b"", end=True)
        link.sender.transmit()
        await turns()
        assert rec.fins == [sid]
        link.receiver.stop_stream(sid, 0x1)
        await turns()
        assert rec.events == [("reset", sid, 0x1)]  # the sender finished long ago: no stop for it

    run(t)


def test_reset_by_the_sender_drops_what_was_not_delivered() -> None:
    async def t(link: LocalLink, rec: Recorder) -> None:
        sid = link.sender.open_stream(b"p" * 12)
        link.sender.send(sid, b"d" * 500, end=True)
        link.sender.transmit()
        await turns()
        link.sender.reset_stream(sid, 0x4)
        link.sender.reset_stream(sid, 0x6)  # the first reset wins, as in aioquic
        link.receiver.stop_stream(sid, 0x1)  # crossing: no second reset
        assert link.sender.queued(sid) == 0
        link.receiver.grant(sid, 10_000)
        await turns()
        assert len(rec.got[sid]) == WINDOW and not rec.fins
        assert rec.events == [("reset", sid, 0x4)]

    run(t)


def test_close_loses_both_ends_and_cancels_the_pending_pass() -> None:
    async def t(link: LocalLink, rec: Recorder) -> None:
        sid = link.sender.open_stream(b"p" * 12)
        link.sender.transmit()
        link.close("driver stopping")
        assert link.sender.closed and link.receiver.closed
        assert rec.lost == [link.sender, link.receiver]
        link.close("again")
        link.sender.send(sid, b"x")
        link.sender.transmit()
        link.receiver.stop_stream(sid, 1)
        await turns()
        assert not rec.got and not rec.events and len(rec.lost) == 2
        assert link.sender.queued(sid) == 0 and link.receiver.credit(sid) == (0, 0)

    run(t)


def test_what_a_callback_queues_moves_without_a_transmit_of_that_end() -> None:
    """The driver does not transmit the end whose event it is handling (the endpoint does that for
    QUIC): a send pump refilling on progress, a recv pump granting on data, must still move."""

    async def t(link: LocalLink, rec: Recorder) -> None:
        sid = link.sender.open_stream(b"p" * 12)
        chunks = [b"%03d" % i * 20 for i in range(50)]  # 60 bytes each
        it = iter(chunks)

        def refill() -> None:  # the send pump: one more chunk per acknowledgement, FIN at the end
            nxt = next(it, None)
            link.sender.send(sid, nxt or b"", end=nxt is None)

        def regrant(stream_id: int, data: bytes, end: bool) -> None:  # the recv pump: credit as it writes
            _, received = link.receiver.credit(stream_id)
            link.receiver.grant(stream_id, received + 64)

        rec.on_ack, rec.on_data = refill, regrant
        link.sender.send(sid, next(it))
        link.sender.transmit()
        for _ in range(1000):
            if rec.fins:
                break
            await turns(1)
        assert rec.fins == [sid] and bytes(rec.got[sid]) == b"p" * 12 + b"".join(chunks)
        assert link.sender.queued(sid) == 0

    run(t)

