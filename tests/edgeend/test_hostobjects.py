"""Host-memory objects over real ring-rs rings in a memfd arena: the token endpoints' use of `objects`."""

from __future__ import annotations

import numpy as np

from swactor.common import ringport
from swactor.edgeend.header import HEADER_CODEC
from swactor.edgeend.hostobjects import HostSink, HostSource
from swactor.edgeend.objects import (
    Closed,
    EgressProducer,
    Failed,
    HeaderFacts,
    IngressParser,
    Loaded,
    ObjectRules,
    Produced,
)
from swactor.v1 import common_pb2 as pb
from tests.worker_service.harness import Arena


def test_token_roundtrip_and_eof_mid_object() -> None:
    arena = Arena(1 << 20)
    try:
        lay = arena.ring(128, alignment=16)
        rules = ObjectRules.from_spec(64 * 4, 4, 1, 4)  # int32 token ids, one per row
        prod = EgressProducer(ringport.open_producer(arena.arena, lay), HEADER_CODEC, rules,
                              ring_id=lay.ring_id)
        cons = IngressParser(ringport.open_consumer(arena.arena, lay), HEADER_CODEC, rules, HostSink(),
                             ring_id=lay.ring_id)
        got: list[list[int]] = []
        for seq, ids in enumerate([list(range(40)), [7], [9]]):  # 160 B + header through a 128 B ring
            payload = np.array(ids, np.int32).tobytes()
            prod.start(HeaderFacts(10 + seq, seq, len(payload)), HostSource(payload))
            produced = []
            for _ in range(10):
                produced += [e for e in prod.pump() if isinstance(e, Produced)]
                got += [np.frombuffer(bytes(e.buffer.data), np.int32).tolist()
                        for e in cons.pump() if isinstance(e, Loaded)]
                if produced and len(got) == seq + 1:
                    break
            assert produced and produced[0].facts.sequence == seq
        assert got == [list(range(40)), [7], [9]]
        torn = arena.producer(lay)  # the stream's producer side: ends mid-header
        assert torn.write(b"SWOB\x01\x00(\x00\x0d\x00") == 10
        torn.close()
        (ev,) = cons.pump()
        assert isinstance(ev, Failed) and ev.reason == pb.OBJECT_FAILURE_EOF_MID_OBJECT
        assert not isinstance(ev, Closed)
    finally:
        arena.close()
