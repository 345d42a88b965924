"""In-memory stand-ins for unit tests only: a byte ring, a header codec, a host sink."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from swactor.common.ringerrors import RingBroken, RingClosed
from swactor.edgeend.objects import HeaderFacts, HeaderInvalid, SinkFailed
from swactor.v1 import common_pb2 as pb

MAGIC = 0x4A424F53
_FMT = "<IHHQQQII"


class FakeCodec:
    header_len = struct.calcsize(_FMT)

    def parse(self, data: bytes) -> HeaderFacts:
        magic, version, hlen, oid, seq, extent, flags, _ = struct.unpack(_FMT, data)
        if magic != MAGIC or hlen != self.header_len:
            raise HeaderInvalid(pb.OBJECT_FAILURE_HEADER_MALFORMED, f"magic {magic:#x} header_len {hlen}")
        if version != 1:
            raise HeaderInvalid(pb.OBJECT_FAILURE_UNSUPPORTED_OBJECT_VERSION, f"version {version}")
        return HeaderFacts(oid, seq, extent, flags)

    def encode(self, f: HeaderFacts, *, magic: int = MAGIC, version: int = 1) -> bytes:
        return struct.pack(_FMT, magic, version, self.header_len, f.object_id, f.sequence, f.extent, f.flags, 0)


class FakeRing:
    """SPSC byte ring with logical cursors; spans never cross the physical end."""

    def __init__(self, capacity: int) -> None:
        self.data = bytearray(capacity)
        self.capacity = capacity
        self.commit = 0
        self.consume = 0
        self.write = 0
        self.closed = False
        self.broken: int | None = None

    def _check(self) -> None:
        if self.broken:
            raise RingBroken(self.broken, "fake ring faulted")

    # consumer
    def readable(self) -> memoryview:
        self._check()
        phys = self.consume % self.capacity
        n = min(self.commit - self.consume, self.capacity - phys)
        if n == 0 and self.closed:
            raise RingClosed("fake ring closed")
        return memoryview(self.data)[phys:phys + n]

    def advance_consume(self, n: int) -> None:
        assert self.consume + n <= self.commit
        self.consume += n

    # producer
    def writable(self) -> memoryview:
        self._check()
        phys = self.commit % self.capacity
        n = min(self.capacity - (self.commit - self.consume), self.capacity - phys)
        return memoryview(self.data)[phys:phys + n]

    def advance_commit(self, n: int) -> None:
        assert self.commit + n - self.consume <= self.capacity
        self.commit += n

    # test helpers
    def push(self, data: bytes) -> int:
        """Write as much of `data` as fits; returns bytes written."""
        done = 0
        while done < len(data):
            span = self.writable()
            if not len(span):
                break
            n = min(len(span), len(data) - done)
            span[:n] = data[done:done + n]
            self.advance_commit(n)
            done += n
        return done

    def drain(self) -> bytes:
        out = bytearray()
        while True:
            try:
                span = self.readable()
            except RingClosed:
                return bytes(out)
            if not len(span):
                return bytes(out)
            out += span
            self.advance_consume(len(span))


@dataclass
class HostBuffer:
    data: bytearray
    fail_write: bool = False

    def write(self, offset: int, data: memoryview) -> None:
        if self.fail_write:
            raise SinkFailed(pb.OBJECT_FAILURE_DEVICE_COPY_FAILED, "fake copy failure")
        self.data[offset:offset + len(data)] = data


@dataclass
class HostSink:
    fail_alloc: bool = False
    fail_write: bool = False
    live: list[HostBuffer] = field(default_factory=list)

    def allocate(self, facts: HeaderFacts) -> HostBuffer:
        if self.fail_alloc:
            raise SinkFailed(pb.OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED, "fake allocation failure")
        buf = HostBuffer(bytearray(facts.extent), self.fail_write)
        self.live.append(buf)
        return buf

    def discard(self, buffer: HostBuffer) -> None:
        self.live.remove(buffer)


@dataclass
class BytesSource:
    payload: bytes
    fail: bool = False

    @property
    def extent(self) -> int:
        return len(self.payload)

    def read_into(self, offset: int, dest: memoryview) -> None:
        if self.fail:
            raise SinkFailed(pb.OBJECT_FAILURE_DEVICE_COPY_FAILED, "fake read failure")
        dest[:] = self.payload[offset:offset + len(dest)]

