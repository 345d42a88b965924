"""Ring objects in host memory: what a token endpoint (the orchestrator, §13) needs around `objects`.

    producer = TokenProducer(ringport.open_producer(arena, layout, readable_fd=r, writable_fd=w), spec)
    producer.start(sequence=0, object_id=oid, payload=np.array(ids, np.int32).tobytes())
    producer.pump()            # again after each writable wake until it returns Produced
    consumer = TokenConsumer(ringport.open_consumer(arena, layout, ...), spec)
    for ev in consumer.pump(): # after each readable wake
        Loaded(facts, buf) -> bytes(buf.data) is the object's payload (e.g. one int32 token id)

Same FSMs, same ObjectFailure semantics as the compute process; only the sink/source differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swactor.worker import wire
from swactor.worker.objects import (
    EgressEvent,
    EgressProducer,
    HeaderFacts,
    IngressEvent,
    IngressParser,
    ObjectRules,
    ReadRing,
    WriteRing,
)


@dataclass
class HostBuffer:
    data: bytearray

    def write(self, offset: int, data: memoryview) -> None:
        self.data[offset:offset + len(data)] = data


class HostSink:
    def allocate(self, facts: HeaderFacts) -> HostBuffer:
        return HostBuffer(bytearray(facts.extent))

    def discard(self, buffer: HostBuffer) -> None:
        buffer.data = bytearray()


@dataclass
class HostSource:
    payload: bytes

    @property
    def extent(self) -> int:
        return len(self.payload)

    def read_into(self, offset: int, dest: memoryview) -> None:
        dest[:] = self.payload[offset:offset + len(dest)]


def rules(spec: wire.ObjSpec) -> ObjectRules:
    return ObjectRules.from_spec(spec.max_extent, spec.dtype_width_bytes, spec.row_elements, spec.alignment,
                                 spec.sequence_policy)


def _codec() -> Any:
    from swactor.worker.ringport import HEADER_CODEC

    return HEADER_CODEC


class TokenProducer:
    """Egress producer of host objects (token-in at the orchestrator)."""

    def __init__(self, ring: WriteRing, spec: wire.ObjSpec, **identities: int) -> None:
        self.fsm = EgressProducer(ring, _codec(), rules(spec), **identities)

    def start(self, *, sequence: int, object_id: int, payload: bytes, flags: int = 0) -> None:
        """Raises objects.OutputRejected for a bad extent or an out-of-order sequence."""
        self.fsm.start(HeaderFacts(object_id, sequence, len(payload), flags), HostSource(payload))

    def pump(self) -> list[EgressEvent]:
        return self.fsm.pump()


class TokenConsumer:
    """Ingress parser into host memory (token-out at the orchestrator)."""

    def __init__(self, ring: ReadRing, spec: wire.ObjSpec, **identities: int) -> None:
        self.fsm = IngressParser(ring, _codec(), rules(spec), HostSink(), **identities)

    def pump(self) -> list[IngressEvent]:
        return self.fsm.pump()
