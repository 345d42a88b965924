"""Ring objects in host memory: the `objects` sink and source a token endpoint (the orchestrator,
§13) plugs into the ring-object FSMs, where the compute process plugs in device memory (§33).

    producer = EgressProducer(ring, HEADER_CODEC, rules)
    producer.start(HeaderFacts(oid, seq, len(payload)), HostSource(payload)); producer.pump() ...
    consumer = IngressParser(ring, HEADER_CODEC, rules, HostSink())
    Loaded(facts, buffer) -> bytes(buffer.data) is the object's payload

Same FSMs, same ObjectFailure semantics as the compute process; only the sink/source differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.edgeend.objects import HeaderFacts


@dataclass
class HostBuffer:
    """objects.ObjectBuffer: one incoming object's payload in host memory."""

    data: bytearray

    def write(self, offset: int, data: memoryview) -> None:
        self.data[offset:offset + len(data)] = data


class HostSink:
    """objects.ObjectSink: incoming objects land in host memory."""

    def allocate(self, facts: HeaderFacts) -> HostBuffer:
        return HostBuffer(bytearray(facts.extent))

    def discard(self, buffer: HostBuffer) -> None:
        buffer.data = bytearray()


@dataclass
class HostSource:
    """objects.ObjectSource over the host bytes of one outgoing object."""

    payload: bytes

    @property
    def extent(self) -> int:
        return len(self.payload)

    def read_into(self, offset: int, dest: memoryview) -> None:
        dest[:] = self.payload[offset:offset + len(dest)]
