"""The §17 ObjectHeader codec over ring-rs: `objects.HeaderCodec` for every ring-object FSM in
production (tests use an in-memory codec). Extent rules are checked by `objects.ObjectRules`."""

from __future__ import annotations

import swactor_ring as sr
from swactor.common.reasons import from_ring_rs
from swactor.edgeend.objects import HeaderFacts, HeaderInvalid
from swactor.v1 import common_pb2 as pb


class RingHeaderCodec:
    header_len: int = sr.OBJECT_HEADER_LEN

    def parse(self, data: bytes) -> HeaderFacts:
        try:
            h = sr.ObjectHeader.parse(data, 2**64 - 1, 1)
        except sr.ObjectError as e:
            raise HeaderInvalid(from_ring_rs(pb.ObjectFailure, e.failure, pb.OBJECT_FAILURE_HEADER_MALFORMED), str(e)) from None
        return HeaderFacts(h.object_id, h.sequence, h.extent, h.flags)

    def encode(self, facts: HeaderFacts) -> bytes:
        return bytes(sr.ObjectHeader(facts.object_id, facts.sequence, facts.extent, facts.flags).encode())


HEADER_CODEC = RingHeaderCodec()
