"""Two real processes share one memfd arena passed with SCM_RIGHTS (spec §19-22)."""

from __future__ import annotations

import random
import zlib
from types import ModuleType

import pytest

import swactor_ring as sr

STREAM_BYTES = 1 << 30  # 1 GiB through a 64 KiB ring: > 16k wraparounds
RING_CAPACITY = 64 << 10
PATTERN_LEN = 1_000_003  # prime, so a misplaced wrap cannot realign with the pattern


def _ring(arena: sr.Arena, ring_id: int, offset: int, capacity: int) -> tuple[sr.RingLayout, sr.Producer]:
    layout = sr.RingLayout.for_range(ring_id, offset, capacity, 64)
    sr.init_ring(arena, layout)
    return layout, sr.Producer(arena, layout)


@pytest.mark.timeout(180)
def test_one_gib_stream_through_small_ring_checksums_match(
    ringproc: ModuleType, arena_fd: tuple[int, int], arena: sr.Arena
) -> None:
    fd, size = arena_fd
    layout, producer = _ring(arena, 1, 0, RING_CAPACITY)
    seed = 20261129
    proc, sock = ringproc.spawn("stream-consumer")
    ringproc.send_ring(
        sock,
        fd,
        size,
        [(layout, producer.readable_fd, producer.writable_fd)],
        {"seed": seed, "max_chunk": 3 * RING_CAPACITY // 2},
    )
    data = memoryview(ringproc.pattern(PATTERN_LEN, seed))
    rng = random.Random(seed)
    crc = 0
    sent = 0
    waits = 0
    while sent < STREAM_BYTES:
        want = min(rng.randint(1, 3 * RING_CAPACITY // 2), STREAM_BYTES - sent)
        off = sent % PATTERN_LEN
        chunk = data[off : off + want]
        done = 0
        while done < want:
            n = producer.write(chunk[done:])
            if n == 0:
                waits += 1
                assert producer.wait_writable(10.0), "producer wait timed out (lost writable wake?)"
                continue
            crc = zlib.crc32(chunk[done : done + n], crc)
            done += n
        sent += want
    producer.close()
    result = ringproc.collect(proc, sock, 60)
    assert result["timeouts"] == 0
    assert result["total"] == STREAM_BYTES
    assert result["crc"] == crc
    assert result["state"] == int(sr.RingState.CLOSED)
    assert producer.commit == STREAM_BYTES
    assert producer.commit // RING_CAPACITY > 16_000  # wraparounds
    assert waits > 0  # the producer really filled the ring and slept


@pytest.mark.timeout(120)
def test_100k_one_byte_handoffs_with_sleeping_consumer_never_lose_a_wake(
    ringproc: ModuleType, arena_fd: tuple[int, int], arena: sr.Arena
) -> None:
    """Ping-pong: every hand-off finds the peer's ring empty, so each side sleeps on its eventfd."""
    fd, size = arena_fd
    fwd_layout, fwd = _ring(arena, 10, 0, 64)
    back_layout = sr.RingLayout.for_range(11, 64 << 10, 64, 64)
    sr.init_ring(arena, back_layout)
    back = sr.Consumer(arena, back_layout)
    count = 100_000
    proc, sock = ringproc.spawn("pingpong")
    ringproc.send_ring(
        sock,
        fd,
        size,
        [(fwd_layout, fwd.readable_fd, fwd.writable_fd), (back_layout, back.readable_fd, back.writable_fd)],
        {"count": count},
    )
    buf = bytearray(1)
    for i in range(count):
        buf[0] = i & 0xFF
        assert fwd.write(buf) == 1
        while back.read_into(buf) == 0:
            assert back.wait_readable(5.0), f"hand-off {i}: echo never woke us (lost wake)"
        assert buf[0] == i & 0xFF
    result = ringproc.collect(proc, sock, 30)
    assert result.get("error") is None, result
    assert result["timeouts"] == 0
    assert result["done"] == count
    # the child found the ring empty and slept for most hand-offs, in both wait styles
    assert result["slept"] > count // 2, result


@pytest.mark.timeout(120)
def test_single_byte_burst_through_tiny_ring_full_and_empty_races(
    ringproc: ModuleType, arena_fd: tuple[int, int], arena: sr.Arena
) -> None:
    """Free-running producer and consumer on a 64-byte ring hit empty->readable and full->writable
    transitions concurrently; a lost wake would stall one side until its timeout."""
    fd, size = arena_fd
    layout, producer = _ring(arena, 20, 0, 64)
    count = 200_000
    proc, sock = ringproc.spawn("bytes-consumer")
    ringproc.send_ring(
        sock, fd, size, [(layout, producer.readable_fd, producer.writable_fd)], {"count": count}
    )
    buf = bytearray(1)
    slept = 0
    for i in range(count):
        buf[0] = i & 0xFF
        while producer.write(buf) == 0:
            slept += 1
            assert producer.wait_writable(5.0), f"byte {i}: producer never woken (lost writable wake)"
    result = ringproc.collect(proc, sock, 30)
    assert result.get("error") is None, result
    assert result == result | {"done": count, "timeouts": 0}
    assert producer.status().readable == 0
