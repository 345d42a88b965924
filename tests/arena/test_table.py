"""The lease-table core (spec §19, §38) driven directly: no memfd, no sockets, no sleeps."""

from __future__ import annotations

import dataclasses

import pytest

from swactor.arena.errors import ArenaError, Code
from swactor.arena.fsm import ArenaState
from swactor.arena.model import (
    CancelReason,
    DetachProof,
    HolderGone,
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
from swactor.arena.table import LeaseTable

from .fakes import PAGE, FakeAbi, FakeMemory, make_table, pages_for, req

CAP = 3 * PAGE  # a ring of 4 pages (header page-rounded together with data)
QUIESCED = ReleaseProof.QUIESCED


def leased(events: list) -> RingLeased:
    (ev,) = [e for e in events if isinstance(e, RingLeased)]
    return ev


def test_boot_and_shutdown_emit_state_changes() -> None:
    table, _ = make_table()
    assert table.state is ArenaState.READY
    events = table.shutdown("operator")
    assert events == [StateChanged(ArenaState.READY, ArenaState.SHUTTING_DOWN, "operator")]


def test_lease_fits_and_gets_a_valid_layout() -> None:
    table, memory = make_table()
    r = req(CAP, prefault=True)
    ev = leased(table.lease(r, now=0.0))
    lay = ev.layout
    assert lay.ring_id == 1 and lay.arena_offset == 0 and lay.total_len == 4 * PAGE
    assert lay.header_offset == 0 and lay.data_offset == 256 and lay.data_capacity == CAP
    assert memory.prefaulted == [1]
    st = table.stats()
    assert st.leased_bytes == 4 * PAGE and st.free_bytes == table.ceiling - 4 * PAGE
    (info,) = st.leases
    assert (info.ring_id, info.request.edge_id, info.request.requester, info.owner_pid) == (1, 7, "test", 1001)


def test_ring_ids_are_never_reused() -> None:
    table, _ = make_table()
    seen = set()
    for _ in range(5):
        lay = leased(table.lease(req(CAP), 0.0)).layout
        assert lay.ring_id not in seen
        seen.add(lay.ring_id)
        table.release(lay.ring_id, 1, QUIESCED, 0.0)
    assert seen == {1, 2, 3, 4, 5}


def test_never_fitting_request_is_rejected_not_queued() -> None:
    table, _ = make_table(ceiling=16 * PAGE)
    (ev,) = table.lease(req(16 * PAGE), 0.0)  # header pushes it one page over the ceiling
    assert isinstance(ev, LeaseRejected) and ev.reason is RejectReason.EXCEEDS_CEILING
    assert "ceiling" in ev.detail
    assert table.stats().queued == ()


def test_pressure_queues_in_fifo_order_and_release_serves_serially() -> None:
    table, _ = make_table(ceiling=16 * PAGE)
    big = leased(table.lease(req(11 * PAGE), 0.0)).layout  # 12 pages, 4 left
    a, b, c = req(7 * PAGE, edge_id=1), req(CAP, edge_id=2), req(CAP, edge_id=3)
    assert table.lease(a, 1.0) == [LeaseQueued(a, 0, 8 * PAGE)]
    # b would fit the 4 free pages right now, but must not overtake a
    assert table.lease(b, 2.0) == [LeaseQueued(b, 1, 4 * PAGE)]
    assert table.lease(c, 3.0) == [LeaseQueued(c, 2, 4 * PAGE)]
    assert [q.request.request_id for q in table.stats().queued] == [a.request_id, b.request_id, c.request_id]
    events = table.release(big.ring_id, 1, QUIESCED, 4.0)
    kinds = [type(e) for e in events]
    assert kinds == [RingReleased, RingReclaimed, RingLeased, RingLeased, RingLeased]
    assert [e.request for e in events[2:]] == [a, b, c]
    assert table.stats().free_bytes == 0


def test_head_of_line_blocks_until_it_fits() -> None:
    table, _ = make_table(ceiling=16 * PAGE)
    x = leased(table.lease(req(7 * PAGE), 0.0)).layout  # 8 pages
    y = leased(table.lease(req(3 * PAGE), 0.0)).layout  # 4 pages, 4 free
    big = req(11 * PAGE)  # 12 pages: needs x and y both gone
    small = req(CAP)
    assert isinstance(table.lease(big, 0.0)[0], LeaseQueued)
    assert isinstance(table.lease(small, 0.0)[0], LeaseQueued)
    events = table.release(y.ring_id, 1, QUIESCED, 0.0)
    assert not [e for e in events if isinstance(e, RingLeased)]  # 8 free, head needs 12
    events = table.release(x.ring_id, 1, QUIESCED, 0.0)
    assert [e.request for e in events if isinstance(e, RingLeased)] == [big, small]


def test_cancel_queued_and_cancel_errors() -> None:
    table, _ = make_table(ceiling=8 * PAGE)
    first_req = req(7 * PAGE)
    first = leased(table.lease(first_req, 0.0)).layout
    q = req(CAP)
    table.lease(q, 0.0)
    assert table.cancel(q.request_id, 1, 0.0) == [LeaseCancelled(q, CancelReason.CANCEL_LEASE)]
    assert table.stats().queued == ()
    with pytest.raises(ArenaError) as e:
        table.cancel(q.request_id, 1, 0.0)
    assert e.value.code is Code.FAILED_PRECONDITION and e.value.field == "request_id"
    with pytest.raises(ArenaError) as e:
        table.cancel(999_999, 1, 0.0)
    assert e.value.code is Code.NOT_FOUND and e.value.field == "request_id"
    # a request already leased names its ring so the caller can release it (spec §26)
    with pytest.raises(ArenaError, match=f"ring {first.ring_id}") as e:
        table.cancel(first_req.request_id, 1, 0.0)
    assert e.value.code is Code.FAILED_PRECONDITION
    # cancelled requests are never served later
    events = table.release(first.ring_id, 1, QUIESCED, 0.0)
    assert not [e for e in events if isinstance(e, RingLeased)]


def _snapshot(table: LeaseTable) -> tuple:
    st = table.stats()
    return (st, table.free_ranges(), [dataclasses.astuple(x) for x in st.leases])


BAD_LEASES = [
    (dict(data_capacity=0), Code.INVALID_ARGUMENT, "ring_spec.data_capacity"),
    (dict(data_capacity=1 << 50), Code.INVALID_ARGUMENT, "ring_spec.data_capacity"),
    (dict(data_capacity=100), Code.INVALID_ARGUMENT, "ring_spec.data_capacity"),
    (dict(alignment=0), Code.INVALID_ARGUMENT, "ring_spec.alignment"),
    (dict(alignment=48), Code.INVALID_ARGUMENT, "ring_spec.alignment"),
    (dict(alignment=1 << 22), Code.INVALID_ARGUMENT, "ring_spec.alignment"),
    (dict(direction=0), Code.INVALID_ARGUMENT, "direction"),
    (dict(spec_direction=2), Code.INVALID_ARGUMENT, "ring_spec.direction"),
    (dict(requester=""), Code.INVALID_ARGUMENT, "requester"),
    (dict(request_id=0), Code.INVALID_ARGUMENT, "request_id"),
    (dict(host_pinning=7), Code.INVALID_ARGUMENT, "ring_spec.host_pinning"),
    (dict(holder_id=0), Code.INVALID_ARGUMENT, "holder_id"),
    (dict(holder_id=42), Code.NOT_FOUND, "holder_id"),
]


@pytest.mark.parametrize(("overrides", "code", "field"), BAD_LEASES)
def test_bad_lease_is_refused_by_field_and_table_unchanged(overrides: dict, code: Code, field: str) -> None:
    table, _ = make_table(ceiling=8 * PAGE)
    leased(table.lease(req(CAP), 0.0))
    table.lease(req(7 * PAGE), 0.0)  # queued
    before = _snapshot(table)
    with pytest.raises(ArenaError) as e:
        table.lease(req(PAGE, **overrides), 0.0)
    assert (e.value.code, e.value.field) == (code, field)
    assert _snapshot(table) == before


def test_duplicate_request_id_refused() -> None:
    table, _ = make_table()
    r = req(CAP)
    table.lease(r, 0.0)
    with pytest.raises(ArenaError) as e:
        table.lease(r, 0.0)
    assert e.value.code is Code.ALREADY_EXISTS and e.value.field == "request_id"


def test_release_errors_leave_table_unchanged() -> None:
    table, _ = make_table()
    lay = leased(table.lease(req(CAP), 0.0)).layout
    table.attach(lay.ring_id, 2, 2)
    before = _snapshot(table)
    cases = [
        (lambda: table.release(999, 1, QUIESCED, 0.0), Code.NOT_FOUND, "ring_id"),
        (lambda: table.release(0, 1, QUIESCED, 0.0), Code.INVALID_ARGUMENT, "ring_id"),
        (lambda: table.release(lay.ring_id, 1, 0, 0.0), Code.INVALID_ARGUMENT, "proof"),
        (lambda: table.release(lay.ring_id, 2, QUIESCED, 0.0), Code.FAILED_PRECONDITION, "holder_id"),
        # still attached by holder 2: release must wait for its detach proof
        (lambda: table.release(lay.ring_id, 1, QUIESCED, 0.0), Code.FAILED_PRECONDITION, "ring_id"),
        (lambda: table.attach(lay.ring_id, 2, 1), Code.FAILED_PRECONDITION, "holder_id"),
        (lambda: table.attach(lay.ring_id, 3, 99), Code.INVALID_ARGUMENT, "role"),
        (lambda: table.detach(lay.ring_id, 3, 1, 0.0), Code.FAILED_PRECONDITION, "holder_id"),
        (lambda: table.detach(lay.ring_id, 2, 0, 0.0), Code.INVALID_ARGUMENT, "proof"),
    ]
    for call, code, field in cases:
        with pytest.raises(ArenaError) as e:
            call()
        assert (e.value.code, e.value.field) == (code, field), e.value
        assert _snapshot(table) == before
    table.detach(lay.ring_id, 2, DetachProof.RING_QUIESCED, 0.0)
    table.release(lay.ring_id, 1, QUIESCED, 0.0)
    with pytest.raises(ArenaError) as e:
        table.release(lay.ring_id, 1, QUIESCED, 0.0)
    assert (e.value.code, e.value.field) == (Code.FAILED_PRECONDITION, "ring_id")
    assert "already released" in e.value.message


def test_released_range_is_scrubbed_before_reuse() -> None:
    table, memory = make_table(ceiling=4 * PAGE)
    lay = leased(table.lease(req(CAP), 0.0)).layout
    nxt = req(CAP)
    table.lease(nxt, 0.0)
    events = table.release(lay.ring_id, 1, QUIESCED, 0.0)
    reclaimed = next(e for e in events if isinstance(e, RingReclaimed))
    assert memory.scrubbed == [reclaimed.range]
    assert leased(events).layout.arena_offset == lay.arena_offset


def test_holder_death_frees_owned_ranges_only_after_every_holder_is_gone() -> None:
    table, _ = make_table(ceiling=8 * PAGE)
    lay = leased(table.lease(req(7 * PAGE, holder=1), 0.0)).layout
    table.attach(lay.ring_id, 1, 1)  # the owner's pump
    table.attach(lay.ring_id, 2, 2)  # the worker's ring
    waiting = req(CAP, holder=3)
    assert isinstance(table.lease(waiting, 0.0)[0], LeaseQueued)
    # the owner closes its connection but is still alive: nothing moves
    table.holder_disconnected(1)
    assert table.stats().leases[0].owner_holds
    with pytest.raises(ArenaError) as e:
        table.attach(lay.ring_id, 1, 1)
    assert e.value.code is Code.FAILED_PRECONDITION
    # the owner's process exits: the worker still maps the ring, so the range stays leased
    events = table.holder_gone(1, 0.0)
    assert [type(e) for e in events] == [HolderGone, RingDetached]
    (info,) = table.stats().leases
    assert not info.owner_holds and info.attached_holder_ids == (2,)
    with pytest.raises(ArenaError, match="draining"):
        table.attach(lay.ring_id, 3, 1)
    # the worker quiesces its ring: range reclaimed, queued lease served
    events = table.detach(lay.ring_id, 2, DetachProof.RING_QUIESCED, 0.0)
    assert [type(e) for e in events] == [RingDetached, RingReclaimed, RingLeased]
    assert events[1].cause is ReclaimCause.LAST_DETACH
    assert events[2].request == waiting


def test_holder_death_cancels_its_queued_requests_and_reclaims_with_cause() -> None:
    table, _ = make_table(ceiling=8 * PAGE)
    lay = leased(table.lease(req(7 * PAGE, holder=2), 0.0)).layout
    table.attach(lay.ring_id, 2, 3)
    q = req(CAP, holder=2)
    table.lease(q, 0.0)
    events = table.holder_gone(2, 0.0)
    assert LeaseCancelled(q, CancelReason.HOLDER_GONE) in events
    reclaimed = [e for e in events if isinstance(e, RingReclaimed)]
    assert [e.cause for e in reclaimed] == [ReclaimCause.HOLDER_EXITED]
    assert table.stats().free_bytes == table.ceiling


def test_shutting_down_rejects_new_and_queued_leases_but_allows_release() -> None:
    table, _ = make_table(ceiling=8 * PAGE)
    lay = leased(table.lease(req(7 * PAGE), 0.0)).layout
    q = req(CAP)
    table.lease(q, 0.0)
    events = table.shutdown()
    assert events[1] == LeaseRejected(q, RejectReason.SHUTTING_DOWN, "the arena is shutting down")
    (ev,) = table.lease(req(CAP), 0.0)
    assert isinstance(ev, LeaseRejected) and ev.reason is RejectReason.SHUTTING_DOWN
    events = table.release(lay.ring_id, 1, QUIESCED, 0.0)
    assert [type(e) for e in events] == [RingReleased, RingReclaimed]


def test_booting_accepts_no_lease() -> None:
    fresh = LeaseTable(16 * PAGE, page_size=PAGE, abi=FakeAbi(), memory=FakeMemory(), next_ring_id=lambda: 1)
    with pytest.raises(ArenaError) as e:
        fresh.release(1, 1, QUIESCED, 0.0)
    assert e.value.code is Code.FAILED_PRECONDITION and e.value.field == "state"


def test_ring_init_failure_rejects_and_returns_the_range() -> None:
    table, memory = make_table()
    memory.fail_next = True
    (ev,) = table.lease(req(CAP), 0.0)
    assert isinstance(ev, LeaseRejected) and ev.reason is RejectReason.RING_INIT_FAILED
    assert table.stats().free_bytes == table.ceiling
    assert leased(table.lease(req(CAP), 0.0)).layout.arena_offset == 0


def test_alignment_above_page_size_is_honoured() -> None:
    table, _ = make_table(ceiling=256 * PAGE)
    leased(table.lease(req(PAGE), 0.0))
    lay = leased(table.lease(req(16 * PAGE * 4, alignment=16 * PAGE), 0.0)).layout
    assert lay.arena_offset % (16 * PAGE) == 0 and lay.data_offset % (16 * PAGE) == 0
    assert lay.data_offset + lay.data_capacity <= lay.arena_offset + lay.total_len


def test_attach_events_carry_identities() -> None:
    table, _ = make_table()
    r = req(CAP, edge_id=55)
    lay = leased(table.lease(r, 0.0)).layout
    _, events = table.attach(lay.ring_id, 2, 2)
    assert events == [RingAttached(r, lay.ring_id, 2, 2)]
    assert pages_for(CAP) == 4


def test_release_when_detached_defers_reclaim_to_the_last_detach() -> None:
    table, _ = make_table(ceiling=8 * PAGE)
    lay = leased(table.lease(req(7 * PAGE), 0.0)).layout
    table.attach(lay.ring_id, 2, 1)  # the edge-driver's pump still holds it
    waiting = req(CAP)
    table.lease(waiting, 0.0)
    events = table.release(lay.ring_id, 1, QUIESCED, 0.0, when_detached=True)
    assert events == [RingReleased(events[0].request, lay.ring_id, QUIESCED, deferred=True)]
    (info,) = table.stats().leases
    assert not info.owner_holds and info.attached_holder_ids == (2,)
    for call, field in [
        (lambda: table.release(lay.ring_id, 1, QUIESCED, 0.0, when_detached=True), "ring_id"),
        (lambda: table.attach(lay.ring_id, 3, 1), "ring_id"),
    ]:
        with pytest.raises(ArenaError) as e:
            call()
        assert (e.value.code, e.value.field) == (Code.FAILED_PRECONDITION, field)
    events = table.detach(lay.ring_id, 2, DetachProof.PUMP_STOPPED, 0.0)
    assert [type(e) for e in events] == [RingDetached, RingReclaimed, RingLeased]
    assert events[1].cause is ReclaimCause.LAST_DETACH and events[2].request == waiting


def test_release_when_detached_without_attachments_reclaims_at_once() -> None:
    table, _ = make_table()
    lay = leased(table.lease(req(CAP), 0.0)).layout
    events = table.release(lay.ring_id, 1, QUIESCED, 0.0, when_detached=True)
    assert [type(e) for e in events] == [RingReleased, RingReclaimed]
    assert not events[0].deferred
