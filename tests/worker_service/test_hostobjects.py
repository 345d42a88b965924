"""Token endpoints over real ring-rs rings in a memfd arena: the orchestrator's reuse of `objects`."""

from __future__ import annotations

import numpy as np

from swactor.worker import ringport
from swactor.worker.hostobjects import TokenConsumer, TokenProducer
from swactor.worker.objects import Closed, Failed, Loaded, Produced

from .harness import Arena, spec


def test_token_roundtrip_and_eof_mid_object() -> None:
    arena = Arena(1 << 20)
    try:
        lay = arena.ring(128, alignment=16)
        tok = spec(64 * 4, kind="Tokens", family="Int", width=4, row=1, alignment=4)
        prod = TokenProducer(ringport.open_producer(arena.arena, lay), tok, ring_id=lay.ring_id)
        cons = TokenConsumer(ringport.open_consumer(arena.arena, lay), tok, ring_id=lay.ring_id)
        got: list[list[int]] = []
        for seq, ids in enumerate([list(range(40)), [7], [9]]):  # 160 B + header through a 128 B ring
            prod.start(sequence=seq, object_id=10 + seq, payload=np.array(ids, np.int32).tobytes())
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
        assert isinstance(ev, Failed) and ev.reason == "EofMidObject"
        assert not isinstance(ev, Closed)
    finally:
        arena.close()
