"""Token endpoints' ring halves over real ring-rs rings in a memfd arena: token-in objects as a
stage reads them, token-out objects reported as TokenReceived, backpressure, and faults by name."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from structlog.testing import capture_logs

import swactor_ring as sr
from swactor.common import ringport
from swactor.common.layout import Layout
from swactor.common.objflags import MAX_DRAFT, VERIFY, with_rewind
from swactor.orchestrator.fleet.fleet import FleetError
from swactor.orchestrator.planning.planner import token_spec
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.tokens import token_rings
from swactor.v1 import common_pb2 as pb

pytestmark = pytest.mark.timeout(30)


class Rings:
    def __init__(self) -> None:
        self.fd = sr.Arena.create_memfd("token-rings-test", 1 << 20)
        self.arena = sr.Arena.from_fd(self.fd, 1 << 20)
        self.next_offset = 0

    def pair(self, capacity: int, ring_id: int, *, shared_fds: bool = True):
        """Both ends of a fresh ring; `shared_fds=False`: each end is given eventfds of its own, so neither's
        commits or consumes ever signal the other (a lost wake-up on every step)."""
        native = sr.RingLayout.for_range(ring_id, self.next_offset, capacity, 64)
        self.next_offset += 256 << 10
        sr.init_ring(self.arena, native)
        layout = Layout(native.ring_id, native.arena_offset, native.total_len, native.header_offset,
                             native.data_offset, native.data_capacity, native.alignment)
        if shared_fds:
            prod = ringport.open_producer(self.arena, layout)
            cons = ringport.open_consumer(self.arena, layout, readable_fd=prod.readable_fd,
                                          writable_fd=prod.writable_fd)
            return prod, cons
        mine, theirs = (sr.eventfd(), sr.eventfd()), (sr.eventfd(), sr.eventfd())
        prod = ringport.open_producer(self.arena, layout, readable_fd=mine[0], writable_fd=mine[1])
        cons = ringport.open_consumer(self.arena, layout, readable_fd=theirs[0], writable_fd=theirs[1])
        for fd in mine + theirs:
            os.close(fd)  # the ends hold their own duplicates
        return prod, cons

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def rings():
    r = Rings()
    yield r
    r.close()


def read(cons: ringport.ConsumerEnd, max_bytes: int) -> bytes:
    """Up to `max_bytes` committed bytes, consumed (the test's side of the ring)."""
    data = bytes(cons.readable(max_bytes))
    cons.advance_consume(len(data))
    return data


def read_object(cons) -> tuple[int, list[int]]:
    """What stage 0 sees: one §17 header, then int32 ids."""
    raw = read(cons, sr.OBJECT_HEADER_LEN)
    header = sr.ObjectHeader.parse(raw, 2**64 - 1, 1)
    payload = b""
    while len(payload) < header.extent:
        payload += read(cons, header.extent - len(payload))
    return header.sequence, np.frombuffer(payload, dtype="<i4").tolist()


def test_token_in_objects_carry_the_prompt_then_single_tokens(rings: Rings) -> None:
    prod, cons = rings.pair(64 << 10, 1)
    writer = token_rings.TokenWriter(prod, token_spec(4096), edge_id=5)
    prompt = [1, 9690, 198, 2683, 359, 253]

    async def main():
        await writer.write(0, prompt)
        await writer.write(1, [42])
        with pytest.raises(FleetError) as err:
            await writer.write(5, [43])  # strictly consecutive: 2 was expected
        return err.value

    err = asyncio.run(main())
    assert read_object(cons) == (0, prompt)
    assert read_object(cons) == (1, [42])
    assert err.reason == pb.RUN_FAULT_OBJECT_FAILED and "expects 2" in err.detail


def test_backpressure_on_a_small_ring_delivers_every_byte(rings: Rings) -> None:
    prod, cons = rings.pair(128, 2)
    writer = token_rings.TokenWriter(prod, token_spec(4096))
    prompt = list(range(3000))  # 12 KB through a 128-byte ring

    async def drain():
        got = bytearray()
        want = sr.OBJECT_HEADER_LEN + 4 * len(prompt)
        while len(got) < want:
            if cons.arm_wait() is not None:
                await asyncio.sleep(0.001)  # the test's slow consumer
                cons.ack()
            got += read(cons, want - len(got))
        return bytes(got)

    async def main():
        reader = asyncio.create_task(drain())
        await asyncio.wait_for(writer.write(0, prompt), 10)
        return await reader

    raw = asyncio.run(main())
    header = sr.ObjectHeader.parse(raw[:sr.OBJECT_HEADER_LEN], 2**64 - 1, 1)
    assert header.extent == 4 * len(prompt)
    assert np.frombuffer(raw[sr.OBJECT_HEADER_LEN:], dtype="<i4").tolist() == prompt


def test_token_out_objects_become_token_received_until_close(rings: Rings) -> None:
    prod, cons = rings.pair(64 << 10, 3)
    stage_side = token_rings.TokenWriter(prod, token_spec(1))  # what the last stage writes
    reader = token_rings.TokenReader(cons, token_spec(1), edge_id=6)
    got: list[F.Input] = []

    async def main():
        run = asyncio.create_task(reader.run(got.append))
        for seq, tid in enumerate([100, 101, 2]):
            await stage_side.write(seq, [tid])
            await asyncio.sleep(0.01)  # the reader sleeps on its eventfd in between
        prod.close_stream()
        await asyncio.wait_for(run, 5)

    asyncio.run(main())
    assert got == [F.TokenReceived(0, 100), F.TokenReceived(1, 101), F.TokenReceived(2, 2)]


def test_ends_whose_wake_ups_are_lost_are_looked_at_again_and_say_so(rings: Rings) -> None:
    """Neither end is ever signalled: the token-in writer waits for space and the token-out reader for
    objects, and each finds its progress by ringport.wait_ready's look every WAKE_CHECK_S."""
    prod, cons = rings.pair(64 << 10, 7, shared_fds=False)
    writer = token_rings.TokenWriter(prod, token_spec(1), edge_id=8)
    reader = token_rings.TokenReader(cons, token_spec(1), edge_id=8)
    got: list[F.Input] = []

    async def main():
        with capture_logs() as logs:
            run = asyncio.create_task(reader.run(got.append))
            await asyncio.sleep(0.05)  # the reader sleeps on its own eventfd
            await writer.write(0, [100])
            await asyncio.wait_for(_until(lambda: got), 5)
            filler = prod.free()
            assert prod.write(b"x" * filler) == filler  # the ring full: the writer must wait for space
            writing = asyncio.create_task(writer.write(1, [101]))
            await asyncio.sleep(0.05)
            assert not writing.done()
            run.cancel()
            read(cons, filler)
            await asyncio.wait_for(writing, 5)
        return [e for e in logs if e["event"] == "ring_wake_missed"]

    missed = asyncio.run(main())
    assert got == [F.TokenReceived(0, 100)]
    assert [(e["ring_id"], e["edge_id"]) for e in missed] == [(7, 8), (7, 8)]


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)


def test_a_verify_object_reports_one_token_per_row(rings: Rings) -> None:
    """objflags.VERIFY: the last stage's object after drafts holds a token per row; a plain object after it one."""
    prod, cons = rings.pair(64 << 10, 5)
    stage_side = token_rings.TokenWriter(prod, token_spec(1 + MAX_DRAFT))
    reader = token_rings.TokenReader(cons, token_spec(1 + MAX_DRAFT))
    got: list[F.Input] = []

    async def main():
        run = asyncio.create_task(reader.run(got.append))
        await stage_side.write(0, [7, 8, 9], VERIFY)
        await stage_side.write(1, [10], with_rewind(0, 1))
        prod.close_stream()
        await asyncio.wait_for(run, 5)

    asyncio.run(main())
    assert got == [F.DraftsVerified(0, (7, 8, 9)), F.TokenReceived(1, 10)]


@pytest.mark.parametrize(("raw", "reason", "needle"), [
    (b"\x00" * 40, pb.RUN_FAULT_OBJECT_FAILED, "token-out object None: OBJECT_FAILURE_"),
    (bytes(sr.ObjectHeader(7, 0, 8, 0).encode()) + bytes(8), pb.RUN_FAULT_OBJECT_FAILED, "OBJECT_FAILURE_EXTENT_EXCEEDS_MAX"),
    (bytes(sr.ObjectHeader(7, 3, 4, 0).encode()) + bytes(4), pb.RUN_FAULT_SEQUENCE_VIOLATION, "expected 0"),
    (bytes(sr.ObjectHeader(7, 0, 4, 0).encode()) + bytes(2), pb.RUN_FAULT_OBJECT_FAILED, "OBJECT_FAILURE_EOF_MID_OBJECT"),
])
def test_bad_token_out_objects_fault_by_name(rings: Rings, raw: bytes, reason: int, needle: str) -> None:
    prod, cons = rings.pair(64 << 10, 4)
    reader = token_rings.TokenReader(cons, token_spec(1))
    got: list[F.Input] = []
    assert prod.write(raw) == len(raw)
    prod.close_stream()
    asyncio.run(asyncio.wait_for(reader.run(got.append), 5))
    assert len(got) == 1 and isinstance(got[0], F.EndpointFault)
    assert got[0].reason == reason and needle in got[0].detail, got[0].detail
