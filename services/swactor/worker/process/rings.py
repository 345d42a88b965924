"""The compute process's installed rings (spec §32): one §32 ring-object FSM per ring end.

Ingress rings carry an `IngressParser` (ring -> device objects), egress rings an `EgressProducer`
(step outputs -> ring). The table holds no fd and does no I/O of its own: the FSMs reach the ring
ends and device objects through their narrow interfaces (`edgeend.objects`); which ends are worth
sleeping on is `waits()`, arming and sleeping is the loop's job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from swactor.edgeend.objects import (
    EgressEvent,
    EgressProducer,
    HeaderCodec,
    HeaderFacts,
    IngressEvent,
    IngressParser,
    IngressState,
    ObjectRules,
    ObjectSink,
    ObjectSource,
    OutputRejected,
)
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import wire

_ACTIVE_INGRESS = (IngressState.NEED_HEADER, IngressState.NEED_PAYLOAD)


@dataclass
class IngressSlot:
    cmd: wire.InstallRing
    end: Any  # ReadRing
    parser: IngressParser


@dataclass
class EgressSlot:
    cmd: wire.InstallRing
    end: Any  # WriteRing
    producer: EgressProducer


def object_rules(cmd: wire.InstallRing) -> ObjectRules:
    """The §17 checks of the ring's ObjectSpec; ValueError names what is wrong."""
    s = cmd.object_spec
    return ObjectRules.from_spec(s.max_extent, s.dtype_width_bytes, s.row_elements, s.alignment, s.sequence_policy)


def install_problem(cmd: wire.InstallRing, installed: bool) -> tuple[int, str] | None:
    """(RingFaultReason, detail) when InstallRing cannot be served, before anything is opened."""
    if installed:
        return pb.RING_FAULT_RING_STATE_INVALID, f"ring {cmd.ring_id} is already installed"
    if cmd.layout.ring_id != cmd.ring_id:
        return pb.RING_FAULT_RING_LAYOUT_INVALID, f"layout.ring_id {cmd.layout.ring_id} != ring_id {cmd.ring_id}"
    if cmd.direction not in ("Ingress", "Egress"):
        return pb.RING_FAULT_RING_LAYOUT_INVALID, f"direction {cmd.direction!r} is not Ingress or Egress"
    try:
        object_rules(cmd)
    except ValueError as e:
        return pb.RING_FAULT_RING_LAYOUT_INVALID, f"object_spec: {e}"
    return None


class RingTable:
    def __init__(self) -> None:
        self.ingress: dict[int, IngressSlot] = {}
        self.egress: dict[int, EgressSlot] = {}

    def __contains__(self, ring_id: int) -> bool:
        return ring_id in self.ingress or ring_id in self.egress

    def ring_ids(self) -> list[int]:
        return sorted(self.ingress) + sorted(self.egress)

    def end(self, ring_id: int) -> Any | None:
        slot = self.ingress.get(ring_id) or self.egress.get(ring_id)
        return None if slot is None else slot.end

    def add(self, cmd: wire.InstallRing, end: Any, codec: HeaderCodec, sink: ObjectSink) -> None:
        """A ring whose end is open; `install_problem` said yes to `cmd` before."""
        ids = {"ring_id": cmd.ring_id, "edge_id": cmd.edge_id, "port_id": cmd.port_id}
        rules = object_rules(cmd)
        if cmd.direction == "Ingress":
            self.ingress[cmd.ring_id] = IngressSlot(cmd, end, IngressParser(end, codec, rules, sink, **ids))
        else:
            self.egress[cmd.ring_id] = EgressSlot(cmd, end, EgressProducer(end, codec, rules, **ids))

    def remove(self, ring_id: int) -> Any | None:
        """Uninstalling (§32): the FSM stops; a partial ingress object's destination is discarded
        (copies are synchronous, none is in flight). The end to release, None if not installed."""
        islot = self.ingress.pop(ring_id, None)
        if islot is not None:
            islot.parser.uninstall()
            return islot.end
        eslot = self.egress.pop(ring_id, None)
        if eslot is not None:
            eslot.producer.uninstall()
            return eslot.end
        return None

    def idle_egress(self, ring_id: int) -> bool:
        slot = self.egress.get(ring_id)
        return slot is not None and not slot.producer.busy

    def start_output(self, binding: wire.OutputBinding, source: ObjectSource) -> None:
        """Admit one step output to its egress ring; OutputRejected (a StepFailure) if it cannot be."""
        slot = self.egress.get(binding.ring_id)
        if slot is None:
            raise OutputRejected(pb.STEP_FAILURE_INVALID_OUTPUT_RING, f"ring {binding.ring_id} is not an installed egress ring")
        facts = HeaderFacts(binding.object_id, binding.sequence, binding.extent, binding.flags)
        slot.producer.start(facts, source)

    def abandon_output(self, ring_id: int) -> wire.InstallRing | None:
        """Stop writing a half-written object: the ring is unusable for its edge from here on. The
        ring's InstallRing when an object was in fact half-written, else None."""
        slot = self.egress.get(ring_id)
        if slot is None or not slot.producer.busy:
            return None
        slot.producer.uninstall()
        return slot.cmd

    def pump_ingress(self) -> list[tuple[wire.InstallRing, IngressEvent]]:
        return [(slot.cmd, ev) for slot in list(self.ingress.values()) for ev in slot.parser.pump()]

    def pump_egress(self, ring_id: int) -> list[tuple[wire.InstallRing, EgressEvent]]:
        slot = self.egress.get(ring_id)
        return [] if slot is None else [(slot.cmd, ev) for ev in slot.producer.pump()]

    def waits(self, step_outputs: Iterable[int]) -> list[Any]:
        """The ring ends worth sleeping on: ingress rings still parsing, egress rings still writing
        an output of the step in flight."""
        ends = [s.end for s in self.ingress.values() if s.parser.state in _ACTIVE_INGRESS]
        for rid in step_outputs:
            slot = self.egress.get(rid)
            if slot is not None and slot.producer.busy:
                ends.append(slot.end)
        return ends
