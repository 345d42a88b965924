"""Python-facing ring semantics: zero-copy spans at the wrap, the span lifetime guard,
close/fault, timeouts, and waking an asyncio consumer through its eventfd."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import numpy as np
import pytest

import swactor_ring as sr


def pair(arena: sr.Arena, capacity: int = 1024, ring_id: int = 1) -> tuple[sr.Producer, sr.Consumer]:
    layout = sr.RingLayout.for_range(ring_id, 0, capacity, 64)
    sr.init_ring(arena, layout)
    p = sr.Producer(arena, layout)
    c = sr.Consumer(arena, layout, readable_fd=p.readable_fd, writable_fd=p.writable_fd)
    return p, c


def test_spans_are_zero_copy_and_stop_at_the_physical_end(arena: sr.Arena) -> None:
    p, c = pair(arena, 1024)
    assert p.write(bytes(1000)) == 1000
    assert c.read_into(bytearray(1000)) == 1000
    span = p.writable_span()
    assert (span.cursor, len(span), span.readonly) == (1000, 24, False)
    np.frombuffer(span, dtype=np.uint8)[:] = np.arange(
        24, dtype=np.uint8
    )  # numpy writes straight into the ring
    p.advance_commit(24)
    span = p.writable_span(max_len=100)
    assert (span.cursor % 1024, len(span)) == (0, 100), "the rest comes from the start on the next call"
    with memoryview(span) as mv:
        mv[:] = bytes(range(100))
    p.advance_commit(100)
    first = c.readable_span()
    assert len(first) == 24 and first.readonly
    assert bytes(first) == bytes(range(24))
    assert first.address == c.readable_span().address  # same memory, no copy
    c.advance_consume(24)
    assert not first.valid
    assert bytes(c.readable_span()) == bytes(range(100))
    assert c.read(1000) == bytes(range(100))


def test_live_exports_block_advance_and_stale_spans_refuse_exports(arena: sr.Arena) -> None:
    p, c = pair(arena)
    span = p.writable_span(8)
    mv = memoryview(span)
    mv[:4] = b"abcd"
    with pytest.raises(BufferError, match="still alive"):
        p.advance_commit(4)
    with pytest.raises(BufferError):
        p.write(b"x")
    mv.release()
    p.advance_commit(4)
    assert not span.valid
    with pytest.raises(BufferError, match="stale span"):
        memoryview(span)
    r = c.readable_span()
    arr = np.frombuffer(r, dtype=np.uint8)
    with pytest.raises(BufferError):
        c.advance_consume(4)
    with pytest.raises(BufferError):
        c.read_into(bytearray(4))
    assert bytes(arr) == b"abcd"
    del arr
    c.advance_consume(4)
    # spans of one handle do not block the other handle, nor another ring
    r2 = c.readable_span()
    with memoryview(r2):
        assert p.write(b"zz") == 2


def test_advancing_past_the_span_is_an_error_not_corruption(arena: sr.Arena) -> None:
    p, c = pair(arena, 64)
    span = p.writable_span(10)
    with pytest.raises(sr.RingError) as e:
        p.advance_commit(11)
    assert (e.value.field, e.value.reason) == ("n", None)
    p.advance_commit(len(span))
    with pytest.raises(sr.RingError):
        p.advance_commit(1)  # the reservation was used up
    with pytest.raises(sr.RingError) as e:
        c.advance_consume(11)
    assert e.value.field == "n"
    with pytest.raises(OverflowError):
        c.advance_consume(-1)
    assert c.readable() == 10
    assert p.write(bytes(100)) == 54  # copies only what fits
    assert p.free() == 0 and len(p.writable_span()) == 0
    with pytest.raises(TypeError):
        c.read_into(b"immutable")


def test_close_lets_the_consumer_drain_then_eof_and_fault_stops_both(arena: sr.Arena) -> None:
    p, c = pair(arena)
    p.write(b"tail")
    p.close()
    assert p.state == sr.RingState.CLOSED == c.state
    with pytest.raises(sr.RingClosedError) as e:
        p.write(b"more")
    assert (e.value.state, e.value.field) == ("closed", "state")
    with pytest.raises(sr.RingClosedError):
        p.writable_span()
    assert c.wait_readable(0) is True
    assert c.read(100) == b"tail"
    assert len(c.readable_span()) == 0 and c.state == sr.RingState.CLOSED  # EOF
    c.fault()
    c.close()  # a faulted ring stays faulted
    assert c.state == sr.RingState.FAULTED
    with pytest.raises(sr.RingClosedError) as e:
        c.readable_span()
    assert e.value.state == "faulted"
    assert p.wait_writable(0) is True  # waits end on a non-open ring


def test_waits_time_out_release_the_gil_and_clear_their_pending_bit(arena: sr.Arena) -> None:
    p, c = pair(arena, 64)
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    t0 = time.monotonic()
    assert c.wait_readable(0.2) is False
    stop.set()
    t.join()
    assert time.monotonic() - t0 >= 0.2
    assert ticks > 20, "the GIL was held during the wait"
    st = c.status()
    assert not st.consumer_waiting and not st.producer_waiting
    p.write(bytes(64))
    assert p.wait_writable(0.01) is False
    with pytest.raises(ValueError):
        c.wait_readable(-1)
    with pytest.raises(ValueError):
        c.wait_readable(float("nan"))


def test_blocking_wait_is_woken_by_a_writer_thread(arena: sr.Arena) -> None:
    p, c = pair(arena, 64)

    def later() -> None:
        time.sleep(0.05)
        p.write(b"!")

    t = threading.Thread(target=later)
    t.start()
    t0 = time.monotonic()
    assert c.wait_readable(10.0) is True
    assert time.monotonic() - t0 < 5
    t.join()
    assert c.read(1) == b"!"


def test_asyncio_consumer_sleeps_on_the_eventfd(arena: sr.Arena) -> None:
    """The external-poller protocol: arm_readable, add_reader(fd), ack_wake, retry."""
    p, c = pair(arena, 256)
    total = 5000

    async def consume() -> bytes:
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        loop.add_reader(c.fileno(), woken.set)
        got = bytearray()
        sleeps = 0
        try:
            while len(got) < total:
                buf = bytearray(97)
                n = c.read_into(buf)
                if n:
                    got += buf[:n]
                    continue
                if c.arm_readable():
                    continue
                sleeps += 1
                await asyncio.wait_for(woken.wait(), 5.0)
                woken.clear()
                c.ack_wake()
        finally:
            loop.remove_reader(c.fileno())
        assert sleeps > 0
        return bytes(got)

    data = os.urandom(total)

    def produce() -> None:
        off = 0
        while off < total:
            n = p.write(data[off : off + 61])
            off += n
            if n == 0:
                assert p.wait_writable(5.0)
            elif off % 5 == 0:
                time.sleep(0.0005)

    t = threading.Thread(target=produce)
    t.start()
    assert asyncio.run(consume()) == data
    t.join()


def test_status_and_properties(arena: sr.Arena) -> None:
    p, c = pair(arena, 128, ring_id=77)
    assert (p.ring_id, p.capacity, c.ring_id, c.capacity) == (77, 128, 77, 128)
    assert p.fileno() == p.writable_fd and c.fileno() == c.readable_fd
    assert p.readable_fd != c.readable_fd  # each handle owns a dup of the shared eventfds
    p.writable_span(16)
    assert (p.commit, p.write_cursor) == (0, 16)
    p.advance_commit(5)
    st = sr.open_ring(arena, sr.RingLayout.for_range(77, 0, 128, 64))
    assert (st.ring_id, st.capacity, st.commit, st.consume, st.readable, st.state) == (
        77,
        128,
        5,
        0,
        5,
        sr.RingState.OPEN,
    )
    assert "RingStatus(" in repr(st)
    assert int(sr.RingState.OPEN) == 1 and int(sr.RingState.CLOSED) == 2 and int(sr.RingState.FAULTED) == 3


def test_eventfds_passed_in_are_duplicated(arena: sr.Arena) -> None:
    layout = sr.RingLayout.for_range(1, 0, 64, 64)
    sr.init_ring(arena, layout)
    rfd, wfd = sr.eventfd(), sr.eventfd()
    p = sr.Producer(arena, layout, readable_fd=rfd, writable_fd=wfd)
    c = sr.Consumer(arena, layout, readable_fd=rfd, writable_fd=wfd)
    os.close(rfd)
    os.close(wfd)  # the handles keep their own dups
    assert not c.arm_readable()
    p.write(b"x")
    assert c.wait_readable(1.0)
    assert c.ack_wake() in (True, False)
    assert c.read(1) == b"x"


def test_infinite_wait_is_interruptible_by_a_signal(arena: sr.Arena) -> None:
    """EINTR returns to Python so signal handlers run (Ctrl-C never hangs in a wait)."""
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Interrupted

    _, c = pair(arena, 64)
    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        t0 = time.monotonic()
        with pytest.raises(Interrupted):
            c.wait_readable(None)
        assert time.monotonic() - t0 < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not c.status().consumer_waiting


def test_supervisor_fault_wakes_a_blocked_waiter(arena: sr.Arena) -> None:
    layout = sr.RingLayout.for_range(5, 0, 64, 64)
    sr.init_ring(arena, layout)
    c = sr.Consumer(arena, layout)
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(c.wait_readable(10.0)))
    t.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    sr.fault_ring(arena, layout, readable_fd=c.readable_fd, writable_fd=c.writable_fd)
    t.join()
    assert woke == [True] and time.monotonic() - t0 < 5
    assert c.state == sr.RingState.FAULTED
    # a stale request naming another ring id for the same range is refused
    with pytest.raises(sr.RingError) as e:
        sr.fault_ring(arena, sr.RingLayout.for_range(4, 0, 64, 64))
    assert e.value.field == "ring_id"
