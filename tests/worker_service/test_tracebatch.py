"""SequenceBatches: a traced run's per-object events of one sequence go out as one message."""

from __future__ import annotations

from swactor.v1 import common_pb2 as pb
from swactor.worker.tracebatch import PER_OBJECT_KINDS, SequenceBatches

ORDER = [pb.EDGE_OBJECT_RECEIVED, pb.OBJECT_LOADED, pb.EXECUTE_STEP_STARTED, pb.OBJECT_PRODUCED, pb.STEP_COMPLETED,
         pb.EDGE_OBJECT_SENT]


def ev(kind: int, seq: int) -> pb.LifecycleEvent:
    return pb.LifecycleEvent(kind=kind, sequence=seq)


def test_a_sequence_goes_out_once_it_holds_every_kind() -> None:
    b = SequenceBatches()
    assert set(ORDER) == PER_OBJECT_KINDS
    for kind in ORDER[:-1]:
        assert b.add(ev(kind, 0)) == []
    (batch,) = b.add(ev(ORDER[-1], 0))
    assert [e.kind for e in batch] == ORDER and b.flush() == []


def test_an_incomplete_older_sequence_goes_out_with_a_newer_complete_one_and_flush_sends_the_rest() -> None:
    b = SequenceBatches()
    for kind in ORDER[:-1]:  # sequence 0's edge_object_sent never comes
        b.add(ev(kind, 0))
    b.add(ev(pb.OBJECT_LOADED, 2))
    out = []
    for kind in ORDER:
        out += b.add(ev(kind, 1))
    assert [batch[0].sequence for batch in out] == [0, 1] and len(out[0]) == 5
    (rest,) = b.flush()
    assert [e.sequence for e in rest] == [2] and b.flush() == []
