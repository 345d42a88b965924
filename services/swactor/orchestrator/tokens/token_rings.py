"""The ring halves of the orchestrator's token endpoints (spec §10, §16, §32, §34).

`TokenWriter` is the token-in producer: one §17 object of int32 token ids per `write(sequence, ids)`.
`TokenReader` is the token-out consumer: it parses token objects and reports `TokenReceived(sequence, id)`,
`DraftsVerified(sequence, ids)` for a VERIFY object (objflags), or an `EndpointFault`. Both reuse the edge end's
I/O-free ring-object FSMs (`swactor.edgeend.objects`) over ring ends (`swactor.common.ringport`) and wait on the
ring's eventfd through the event loop (`ringport.wait_ready`: looked at again every WAKE_CHECK_S, a lost
wake-up logged as `ring_wake_missed`).

Not here (the integration step): leasing the two rings from the local arena-manager, the
edge-driver's EstablishSend / EstablishRecv and wake-fd sharing, and §38 edge teardown.
"""

from __future__ import annotations

import numpy as np

from swactor.common.events import get_logger
from swactor.common.ids import new_id
from swactor.common.objflags import PROMPT_CONTINUES, VERIFY
from swactor.common.reasons import name
from swactor.common.ringport import WAKE_CHECK_S, ConsumerEnd, ProducerEnd, wait_ready
from swactor.edgeend import objects
from swactor.edgeend.header import HEADER_CODEC
from swactor.edgeend.hostobjects import HostSink, HostSource
from swactor.orchestrator.fleet.fleet import FleetError, Report
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb

TOKEN_DTYPE = np.dtype("<i4")
log = get_logger(component="token_endpoints")


async def _ring_ready(end: ProducerEnd | ConsumerEnd, edge_id: int) -> None:
    if await wait_ready(end):
        log.warning("ring_wake_missed", ring_id=end.ring_id, edge_id=edge_id, waited_s=WAKE_CHECK_S)


def rules_for(spec: pb.ObjectSpec) -> objects.ObjectRules:
    return objects.ObjectRules.from_spec(spec.max_extent, spec.dtype_width_bytes, spec.row_elements, spec.alignment)


class TokenWriter:
    def __init__(self, end: ProducerEnd, spec: pb.ObjectSpec, *, edge_id: int = 0) -> None:
        self.end = end
        self.edge_id = edge_id
        self._egress = objects.EgressProducer(end, HEADER_CODEC, rules_for(spec), edge_id=edge_id)

    async def write(self, sequence: int, token_ids: list[int] | tuple[int, ...], flags: int = 0) -> None:
        """Write one token object; returns once every byte is committed (waits on backpressure)."""
        payload = np.asarray(token_ids, dtype=TOKEN_DTYPE).tobytes()
        try:
            self._egress.start(objects.HeaderFacts(new_id(), sequence, len(payload), flags), HostSource(payload))
        except objects.OutputRejected as e:
            raise FleetError(pb.RUN_FAULT_OBJECT_FAILED, f"token-in object {sequence}: {name(pb.StepFailure, e.reason)}: {e.detail}") from None
        while True:
            for ev in self._egress.pump():
                if isinstance(ev, objects.Broken):
                    raise FleetError(pb.RUN_FAULT_RING_FAULT, f"token-in ring: {name(pb.RingFaultReason, ev.reason)}: {ev.detail}")
            if not self._egress.busy:
                return
            await _ring_ready(self.end, self.edge_id)


class TokenReader:
    def __init__(self, end: ConsumerEnd, spec: pb.ObjectSpec, *, edge_id: int = 0) -> None:
        self.end = end
        self.edge_id = edge_id
        self._ingress = objects.IngressParser(end, HEADER_CODEC, rules_for(spec), HostSink(), edge_id=edge_id)

    async def run(self, report: Report) -> None:
        """Report every token object until the producer closes the ring or it faults."""
        while True:
            events = self._ingress.pump()
            for ev in events:
                match ev:
                    case objects.Loaded(facts=facts, buffer=buffer):
                        ids = np.frombuffer(bytes(buffer.data), dtype=TOKEN_DTYPE)
                        if facts.flags & VERIFY:  # one token per row of drafts: the FSM checks how many
                            report(F.DraftsVerified(facts.sequence, tuple(int(i) for i in ids)))
                            continue
                        if len(ids) != 1:
                            report(F.EndpointFault(pb.RUN_FAULT_OBJECT_FAILED,
                                                   f"token-out object {facts.sequence} holds {len(ids)} ids, not 1"))
                            return
                        if facts.flags & PROMPT_CONTINUES:  # a prompt chunk before the last: no token (objflags)
                            report(F.PromptChunkDone(facts.sequence))
                        else:
                            report(F.TokenReceived(facts.sequence, int(ids[0])))
                    case objects.Failed(reason=reason, detail=detail, sequence=seq):
                        fault = (pb.RUN_FAULT_SEQUENCE_VIOLATION if reason == pb.OBJECT_FAILURE_SEQUENCE_VIOLATION
                                 else pb.RUN_FAULT_OBJECT_FAILED)
                        report(F.EndpointFault(fault, f"token-out object {seq}: {name(pb.ObjectFailure, reason)}: {detail}"))
                        return
                    case objects.Broken(reason=reason, detail=detail):
                        report(F.EndpointFault(pb.RUN_FAULT_RING_FAULT, f"token-out ring: {name(pb.RingFaultReason, reason)}: {detail}"))
                        return
                    case objects.Closed():
                        return
            if events:
                continue
            await _ring_ready(self.end, self.edge_id)
