"""Ring-object FSMs of spec §32: the ingress parser and the egress producer.

Both are I/O-free cores over three narrow interfaces, so the compute process (device memory) and
the orchestrator's token endpoints (host memory) share them:

- a ring end (`ReadRing` / `WriteRing`): spans, cursor advances, closed state; the real one is
  `swactor.common.ringport` over `swactor_ring` handles, tests use an in-memory ring. Ring ends
  raise `RingBroken` (a §37 RingFaultReason) and, at the orderly end of data, `RingClosed`
  (`swactor.common.ringerrors`);
- a `HeaderCodec` (the §17 ObjectHeader encode/parse of ring-rs, `header.py`);
- an `ObjectSink` that allocates the destination of an incoming object (a device allocation, a
  host bytearray) and an `ObjectSource` that yields the bytes of an outgoing one.

`pump()` makes all progress the committed bytes / free space allow and returns the resulting
events; the caller calls it again after a wake hint. Copies are synchronous (§33: copy returns ->
safe to advance the cursor), so ObjectComplete is passed through within one pump.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from swactor.common.events import get_logger
from swactor.common.msgbase import Failure
from swactor.common.reasons import ReasonError, name
from swactor.common.ringerrors import RingBroken, RingClosed
from swactor.v1 import common_pb2 as pb

# ---- interfaces ----


class ReadRing(Protocol):
    def readable(self) -> memoryview:
        """Contiguous committed bytes at the consume cursor (may be empty); RingClosed once the
        producer closed the ring and every committed byte was read."""

    def advance_consume(self, n: int) -> None: ...


class WriteRing(Protocol):
    def writable(self) -> memoryview:
        """Contiguous free bytes at the producer's write cursor (may be empty)."""

    def advance_commit(self, n: int) -> None: ...


@dataclass(frozen=True)
class HeaderFacts:
    """The runtime facts a §17 ObjectHeader carries."""

    object_id: int
    sequence: int
    extent: int
    flags: int = 0


class HeaderInvalid(ReasonError):
    """Header bytes rejected by the codec; `reason` is OBJECT_FAILURE_HEADER_MALFORMED or _UNSUPPORTED_OBJECT_VERSION."""


class HeaderCodec(Protocol):
    header_len: int

    def parse(self, data: bytes) -> HeaderFacts:
        """Raise HeaderInvalid for bad magic/header_len (HEADER_MALFORMED) or version."""

    def encode(self, facts: HeaderFacts) -> bytes: ...


class SinkFailed(ReasonError):
    """The destination could not be allocated or written: an ObjectFailure,
    OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED or OBJECT_FAILURE_DEVICE_COPY_FAILED."""


class ObjectBuffer(Protocol):
    def write(self, offset: int, data: memoryview) -> None:
        """Copy `data` to `offset`; synchronous; raise SinkFailed(OBJECT_FAILURE_DEVICE_COPY_FAILED)."""


class ObjectSink(Protocol):
    def allocate(self, facts: HeaderFacts) -> ObjectBuffer:
        """Destination for `facts.extent` bytes; raise SinkFailed(OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED)."""

    def discard(self, buffer: ObjectBuffer) -> None:
        """Free a partially filled destination after a failure."""


class ObjectSource(Protocol):
    extent: int

    def read_into(self, offset: int, dest: memoryview) -> None:
        """Copy `len(dest)` bytes starting at `offset`; raise SinkFailed(OBJECT_FAILURE_DEVICE_COPY_FAILED)."""


# ---- object rules ----


@dataclass(frozen=True)
class ObjSpec:
    """§17 ObjectSpec. kind: Tokens|Activations|Weights; dtype_family: Float|Int|Uint|Bfloat."""

    kind: str
    max_extent: int
    dtype_family: str
    dtype_width_bytes: int
    row_elements: int
    alignment: int
    sequence_policy: str = "StrictlyConsecutive"


@dataclass(frozen=True)
class ObjectRules:
    """The checks of §17 an ObjectSpec implies for one edge."""

    max_extent: int
    row_bytes: int  # dtype_width_bytes * row_elements: extent is a whole number of rows
    alignment: int  # extent is a multiple of this too
    strictly_consecutive: bool = True

    @staticmethod
    def from_spec(max_extent: int, dtype_width_bytes: int, row_elements: int, alignment: int,
                  sequence_policy: str = "StrictlyConsecutive") -> ObjectRules:
        if max_extent <= 0:
            raise ValueError("object_spec.max_extent must be > 0")
        if dtype_width_bytes <= 0 or row_elements <= 0:
            raise ValueError("object_spec.dtype_width_bytes and row_elements must be > 0")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"object_spec.alignment {alignment} is not a power of two")
        if sequence_policy != "StrictlyConsecutive":
            raise ValueError(f"object_spec.sequence_policy {sequence_policy!r} is not supported")
        return ObjectRules(max_extent, dtype_width_bytes * row_elements, alignment)

    def extent_failure(self, extent: int) -> int | None:
        """The ObjectFailure for a bad extent, or None."""
        if extent > self.max_extent:
            return pb.OBJECT_FAILURE_EXTENT_EXCEEDS_MAX
        if extent == 0 or extent % self.row_bytes or extent % self.alignment:
            return pb.OBJECT_FAILURE_EXTENT_ALIGNMENT_INVALID
        return None


# ---- events ----


@dataclass(frozen=True)
class Loaded:
    """A complete, validated object is in its destination (§16: only complete objects)."""

    facts: HeaderFacts
    buffer: Any


@dataclass(frozen=True)
class Failed(Failure):
    """ObjectFailed: an ObjectFailure; object_id/sequence are None when the header never parsed."""

    object_id: int | None = None
    sequence: int | None = None


@dataclass(frozen=True)
class Closed:
    """The producer closed the ring on an object boundary: orderly end of the edge."""


@dataclass(frozen=True)
class Produced:
    facts: HeaderFacts


@dataclass(frozen=True)
class Broken(Failure):
    """RingFault: the ring is unusable: a RingFaultReason."""


IngressEvent = Loaded | Failed | Closed | Broken
EgressEvent = Produced | Broken


# ---- ingress parser ----


class IngressState(enum.Enum):
    NEED_HEADER = "NeedHeader"
    NEED_PAYLOAD = "NeedPayload"
    CLOSED = "Closed"
    FAULTED = "Faulted"
    UNINSTALLED = "Uninstalled"


class IngressParser:
    """§32 ingress ring FSM: NeedHeader -> NeedPayload -> (ObjectComplete) -> NeedHeader | Faulted.

    Header bytes are staged in a small local buffer so a header split by the ring's wrap point
    costs nothing special; consume advances only after bytes are copied (safe to release).
    """

    def __init__(self, ring: ReadRing, codec: HeaderCodec, rules: ObjectRules, sink: ObjectSink,
                 *, first_sequence: int = 0, log: Callable[..., Any] | None = None, **identities: int) -> None:
        self.ring = ring
        self.codec = codec
        self.rules = rules
        self.sink = sink
        self.state = IngressState.NEED_HEADER
        self.expected_sequence = first_sequence
        self._identities = identities
        self._log = log or get_logger(**identities).info
        self._per_object_log = log or get_logger(**identities).debug  # NeedHeader <-> NeedPayload: every object
        self._header = bytearray()
        self._facts: HeaderFacts | None = None
        self._buffer: ObjectBuffer | None = None
        self._copied = 0

    def _transition(self, new: IngressState, **facts: Any) -> None:
        old, self.state = self.state, new
        if old is not new:
            per_object = {old, new} <= {IngressState.NEED_HEADER, IngressState.NEED_PAYLOAD}
            (self._per_object_log if per_object else self._log)("ingress_state", old=old.value, new=new.value, **facts)

    def _fail(self, reason: int, detail: str) -> Failed:
        facts = self._facts
        if self._buffer is not None:
            self.sink.discard(self._buffer)
            self._buffer = None
        self._transition(IngressState.FAULTED, reason=name(pb.ObjectFailure, reason),
                         object_id=facts.object_id if facts else None,
                         sequence=facts.sequence if facts else None)
        return Failed(reason, detail, facts.object_id if facts else None, facts.sequence if facts else None)

    def uninstall(self) -> None:
        """Stop consuming; the destination of a partial object is freed (copies are synchronous)."""
        if self._buffer is not None:
            self.sink.discard(self._buffer)
            self._buffer = None
        self._transition(IngressState.UNINSTALLED)

    def pump(self) -> list[IngressEvent]:
        events: list[IngressEvent] = []
        try:
            while self.state in (IngressState.NEED_HEADER, IngressState.NEED_PAYLOAD):
                try:
                    span = self.ring.readable()
                except RingClosed:
                    events.append(self._on_eof())
                    break
                if not len(span):
                    break
                if self.state is IngressState.NEED_HEADER:
                    event = self._take_header(span)
                else:
                    event = self._take_payload(span)
                if event is not None:
                    events.append(event)
        except RingBroken as e:
            self._transition(IngressState.FAULTED, reason=name(pb.RingFaultReason, e.reason))
            events.append(Broken(e.reason, e.detail))
        return events

    def _on_eof(self) -> IngressEvent:
        if self.state is IngressState.NEED_HEADER and not self._header:
            self._transition(IngressState.CLOSED)
            return Closed()
        got = self._copied if self.state is IngressState.NEED_PAYLOAD else len(self._header)
        part = "payload" if self.state is IngressState.NEED_PAYLOAD else "header"
        return self._fail(pb.OBJECT_FAILURE_EOF_MID_OBJECT, f"ring closed after {got} bytes of the {part}")

    def _take_header(self, span: memoryview) -> IngressEvent | None:
        n = min(len(span), self.codec.header_len - len(self._header))
        self._header += span[:n]
        self.ring.advance_consume(n)
        if len(self._header) < self.codec.header_len:
            return None
        raw, self._header = bytes(self._header), bytearray()
        try:
            facts = self.codec.parse(raw)
        except HeaderInvalid as e:
            return self._fail(e.reason, e.detail)
        self._facts = facts
        bad_extent = self.rules.extent_failure(facts.extent)
        if bad_extent is not None:
            return self._fail(bad_extent, f"extent {facts.extent} (max {self.rules.max_extent}, "
                                          f"row {self.rules.row_bytes} B, alignment {self.rules.alignment})")
        if self.rules.strictly_consecutive and facts.sequence != self.expected_sequence:
            return self._fail(pb.OBJECT_FAILURE_SEQUENCE_VIOLATION,
                              f"sequence {facts.sequence}, expected {self.expected_sequence}")
        try:
            self._buffer = self.sink.allocate(facts)
        except SinkFailed as e:
            return self._fail(e.reason, e.detail)
        self._copied = 0
        self._transition(IngressState.NEED_PAYLOAD, object_id=facts.object_id, sequence=facts.sequence,
                         extent=facts.extent)
        return None

    def _take_payload(self, span: memoryview) -> IngressEvent | None:
        assert self._facts is not None and self._buffer is not None
        n = min(len(span), self._facts.extent - self._copied)
        try:
            self._buffer.write(self._copied, span[:n])
        except SinkFailed as e:
            return self._fail(e.reason, e.detail)
        self.ring.advance_consume(n)  # the copy returned: the bytes are safe to release
        self._copied += n
        if self._copied < self._facts.extent:
            return None
        facts, buffer = self._facts, self._buffer
        self._facts, self._buffer = None, None
        self.expected_sequence = facts.sequence + 1
        self._transition(IngressState.NEED_HEADER, object_id=facts.object_id, sequence=facts.sequence)
        return Loaded(facts, buffer)


# ---- egress producer ----


class EgressState(enum.Enum):
    WAITING_FOR_OUTPUT = "WaitingForOutput"
    NEED_WRITABLE_FOR_HEADER = "NeedWritableForHeader"
    NEED_WRITABLE_FOR_PAYLOAD = "NeedWritableForPayload"
    FAULTED = "Faulted"
    UNINSTALLED = "Uninstalled"


_EGRESS_PER_OBJECT = {EgressState.WAITING_FOR_OUTPUT, EgressState.NEED_WRITABLE_FOR_HEADER,
                      EgressState.NEED_WRITABLE_FOR_PAYLOAD}


class OutputRejected(ReasonError):
    """An output cannot be produced on this ring: a §37 StepFailure and detail."""


class EgressProducer:
    """§32 egress ring FSM: WaitingForOutput -> NeedWritableForHeader -> NeedWritableForPayload.

    `start()` admits one object; `pump()` writes header then payload prefixes into free spans,
    committing as bytes become valid. Running out of space just returns: the caller waits for a
    writable wake (the intended backpressure path, §32/§35).
    """

    def __init__(self, ring: WriteRing, codec: HeaderCodec, rules: ObjectRules, *, first_sequence: int = 0,
                 log: Callable[..., Any] | None = None, **identities: int) -> None:
        self.ring = ring
        self.codec = codec
        self.rules = rules
        self.state = EgressState.WAITING_FOR_OUTPUT
        self.next_sequence = first_sequence
        self._log = log or get_logger(**identities).info
        self._per_object_log = log or get_logger(**identities).debug  # WaitingForOutput <-> NeedWritable*: every object
        self._facts: HeaderFacts | None = None
        self._source: ObjectSource | None = None
        self._header = b""
        self._written = 0

    def _transition(self, new: EgressState, **facts: Any) -> None:
        old, self.state = self.state, new
        if old is not new:
            per_object = {old, new} <= _EGRESS_PER_OBJECT
            (self._per_object_log if per_object else self._log)("egress_state", old=old.value, new=new.value, **facts)

    @property
    def busy(self) -> bool:
        return self.state in (EgressState.NEED_WRITABLE_FOR_HEADER, EgressState.NEED_WRITABLE_FOR_PAYLOAD)

    def start(self, facts: HeaderFacts, source: ObjectSource) -> None:
        if self.state is not EgressState.WAITING_FOR_OUTPUT:
            raise OutputRejected(pb.STEP_FAILURE_INVALID_OUTPUT_RING, f"egress ring is {self.state.value}, not WaitingForOutput")
        if source.extent != facts.extent:
            raise OutputRejected(pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID,
                                 f"role produced {source.extent} bytes, binding declared {facts.extent}")
        bad = self.rules.extent_failure(facts.extent)
        if bad is not None:
            raise OutputRejected(pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID,
                                 f"output extent {facts.extent}: {name(pb.ObjectFailure, bad)}")
        if self.rules.strictly_consecutive and facts.sequence != self.next_sequence:
            raise OutputRejected(pb.STEP_FAILURE_INVALID_OUTPUT_RING,
                                 f"output sequence {facts.sequence}, ring expects {self.next_sequence}")
        self._facts, self._source = facts, source
        self._header, self._written = self.codec.encode(facts), 0
        self._transition(EgressState.NEED_WRITABLE_FOR_HEADER, object_id=facts.object_id, sequence=facts.sequence)

    def uninstall(self) -> None:
        self._facts, self._source = None, None
        self._transition(EgressState.UNINSTALLED)

    def pump(self) -> list[EgressEvent]:
        events: list[EgressEvent] = []
        try:
            while self.busy:
                span = self.ring.writable()
                if not len(span):
                    break
                if self.state is EgressState.NEED_WRITABLE_FOR_HEADER:
                    n = min(len(span), len(self._header) - self._written)
                    span[:n] = self._header[self._written:self._written + n]
                    self.ring.advance_commit(n)
                    self._written += n
                    if self._written == len(self._header):
                        self._written = 0
                        self._transition(EgressState.NEED_WRITABLE_FOR_PAYLOAD)
                    continue
                assert self._facts is not None and self._source is not None
                n = min(len(span), self._facts.extent - self._written)
                self._source.read_into(self._written, span[:n])
                self.ring.advance_commit(n)  # host bytes are valid: publish them
                self._written += n
                if self._written == self._facts.extent:
                    facts = self._facts
                    self._facts, self._source = None, None
                    self.next_sequence = facts.sequence + 1
                    self._transition(EgressState.WAITING_FOR_OUTPUT, object_id=facts.object_id,
                                     sequence=facts.sequence)
                    events.append(Produced(facts))
        except SinkFailed as e:
            self._transition(EgressState.FAULTED, reason="RING_FAULT_DEVICE_COPY_FAILED")
            events.append(Broken(pb.RING_FAULT_DEVICE_COPY_FAILED, e.detail))
        except RingBroken as e:
            self._transition(EgressState.FAULTED, reason=name(pb.RingFaultReason, e.reason))
            events.append(Broken(e.reason, e.detail))
        return events
