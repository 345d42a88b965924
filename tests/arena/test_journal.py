"""Every core event becomes a structured event with the spec identities (ring_id, edge_id, ...)."""

from __future__ import annotations

from structlog.testing import capture_logs

from swactor.arena import journal
from swactor.arena.freelist import Range
from swactor.arena.fsm import ArenaState
from swactor.arena.model import (
    AttachRole,
    CancelReason,
    DetachProof,
    LeaseCancelled,
    LeaseQueued,
    LeaseRejected,
    ReclaimCause,
    RejectReason,
    ReleaseProof,
    RingAttached,
    RingDetached,
    RingLeased,
    RingReclaimed,
    RingReleased,
    StateChanged,
)

from .fakes import FakeAbi, make_table, req


def test_lease_events_carry_ring_edge_requester_and_stable_reasons() -> None:
    r = req(4096, edge_id=31, requester="edge-driver")
    lay = FakeAbi().mint(9, 0, 4096, 64, 8192)
    cases = [
        (LeaseQueued(r, 0, 8192), "ring_lease_queued", 0, {}),
        (RingLeased(r, lay), "ring_leased", 9, {"arena_offset": 0}),
        (
            LeaseRejected(r, RejectReason.EXCEEDS_CEILING, "too big"),
            "ring_lease_rejected",
            0,
            {"reason": "LEASE_REJECT_EXCEEDS_CEILING"},
        ),
        (
            LeaseCancelled(r, CancelReason.HOLDER_GONE),
            "ring_lease_cancelled",
            0,
            {"reason": "LEASE_CANCEL_HOLDER_GONE"},
        ),
        (RingReleased(r, 9, ReleaseProof.QUIESCED), "ring_released", 9, {"proof": "RELEASE_PROOF_QUIESCED"}),
        (
            RingReclaimed(r, 9, Range(0, 8192), ReclaimCause.HOLDER_EXITED),
            "ring_reclaimed",
            9,
            {"cause": "HOLDER_EXITED"},
        ),
        (RingAttached(r, 9, 5, AttachRole.PUMP), "ring_attached", 9, {"role": "ATTACH_ROLE_PUMP"}),
        (RingDetached(r, 9, 5, None), "ring_detached", 9, {"proof": "HOLDER_EXITED"}),
        (
            RingDetached(r, 9, 5, DetachProof.PUMP_STOPPED),
            "ring_detached",
            9,
            {"proof": "DETACH_PROOF_PUMP_STOPPED"},
        ),
    ]
    for ev, name, ring_id, extra in cases:
        with capture_logs() as logs:
            journal.emit(ev)
        (entry,) = logs
        assert entry["event"] == name
        assert (entry["ring_id"], entry["edge_id"], entry["requester"]) == (ring_id, 31, "edge-driver")
        assert entry["request_id"] == r.request_id and entry["holder_id"] == r.holder_id
        assert entry["component"] == "COMPONENT_ARENA"
        for k, v in extra.items():
            assert entry[k] == v


def test_table_run_logs_in_order() -> None:
    table, _ = make_table(ceiling=8 * 4096)
    with capture_logs() as logs:
        for ev in table.lease(req(7 * 4096, edge_id=3), 0.0) + table.lease(req(4096, edge_id=4), 0.0):
            journal.emit(ev)
        journal.emit(StateChanged(ArenaState.READY, ArenaState.SHUTTING_DOWN, "t"))
    assert [e["event"] for e in logs] == ["ring_leased", "ring_lease_queued", "arena_state_changed"]
    assert [e["edge_id"] for e in logs[:2]] == [3, 4]


def test_status_line_reads_like_words() -> None:
    table, _ = make_table(ceiling=1 << 30)
    table.lease(req(1 << 20), 0.0)
    line = journal.status_line(table.stats(), allocated=4096)
    assert (
        line
        == "ready: 1 lease, 1.0 MiB leased, 1023.0 MiB free (largest 1023.0 MiB), 0 queued, 3 holders, 4.0 KiB resident"
    )
