"""The ArenaManager lease table (spec §19, §38): the I/O-free core of swactor-arena.

One instance is driven from one asyncio task (the "mailbox" of the spec), so two live leases can
never overlap. Each call checks its arguments first and raises ArenaError before any mutation, so
a rejected call leaves the table exactly as it was; otherwise it returns the events it caused, in
order, for the shell to log and to answer waiting callers with.

Quiescence rule (spec §38, docs/arena.md): a lease's range goes back to the free list only when
no one can still touch it, i.e. when
  - its owner released it explicitly (allowed only once no holder is attached), or its owner's
    process is gone, and
  - every attached holder has detached (with a proof) or its process is gone.
Holders come and go through `holder_joined` / `holder_disconnected` / `holder_gone`, which the
fd hand-out server calls on connect, on EOF and on process exit (pidfd).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from swactor.arena import fsm
from swactor.arena.errors import ArenaError, Code, invalid, not_found, precondition
from swactor.arena.freelist import FreeList, Range, round_up
from swactor.arena.fsm import ArenaInput, ArenaOp, ArenaState
from swactor.arena.model import (
    AttachRole,
    CancelReason,
    DetachProof,
    Direction,
    Event,
    Holder,
    HolderDisconnected,
    HolderGone,
    HolderJoined,
    Lease,
    LeaseCancelled,
    LeaseInfo,
    LeaseQueued,
    LeaseRejected,
    Pending,
    ReclaimCause,
    RejectReason,
    ReleaseProof,
    RingAttached,
    RingDetached,
    RingLeased,
    RingReclaimed,
    RingReleased,
    RingRequest,
    StateChanged,
    Stats,
)
from swactor.arena.ports import RangeMemory, RingAbi, RingInitError

# A ring bigger than the x86-64 user address space can never be mapped by anyone: that is bad
# input (INVALID_ARGUMENT), not arena pressure. Anything smaller but above the ceiling is a
# RingLeaseRejected{EXCEEDS_CEILING}.
MAX_DATA_CAPACITY = 1 << 47
MAX_ALIGNMENT = 1 << 21  # 2 MiB: one huge page
RETIRED_MEMORY = 4096  # recently retired ring ids remembered to tell "already released" apart
_KNOWN_ENUM = frozenset({0, 1})  # HostPinning and WakeCoalescing both have two values


class LeaseTable:
    def __init__(
        self,
        ceiling: int,
        *,
        page_size: int,
        abi: RingAbi,
        memory: RangeMemory,
        next_ring_id: Callable[[], int],
    ) -> None:
        self.ceiling = ceiling
        self.page_size = page_size
        self.state = ArenaState.BOOTING
        self._free = FreeList(ceiling, page_size)
        self._abi = abi
        self._memory = memory
        self._next_ring_id = next_ring_id
        self._leases: dict[int, Lease] = {}
        self._ring_of_request: dict[int, int] = {}
        self._queue: deque[Pending] = deque()
        self._holders: dict[int, Holder] = {}
        self._retired: deque[int] = deque(maxlen=RETIRED_MEMORY)
        self._retired_requests: deque[int] = deque(maxlen=RETIRED_MEMORY)

    # ---- FSM (spec §19) ----

    def _set_state(self, event: ArenaInput, detail: str) -> list[Event]:
        old = self.state
        self.state = fsm.transition(old, event)
        return [StateChanged(old, self.state, detail)] if self.state is not old else []

    def boot_succeeded(self, detail: str = "") -> list[Event]:
        return self._set_state(ArenaInput.BOOT_SUCCEEDED, detail)

    def boot_failed(self, detail: str) -> list[Event]:
        return self._set_state(ArenaInput.BOOT_FAILED, detail)

    def shutdown(self, detail: str = "") -> list[Event]:
        """Ready -> ShuttingDown: queued leases can no longer be served and are rejected."""
        events = self._set_state(ArenaInput.SHUTDOWN, detail)
        while self._queue:
            p = self._queue.popleft()
            self._retired_requests.append(p.request.request_id)
            events.append(LeaseRejected(p.request, RejectReason.SHUTTING_DOWN, "the arena is shutting down"))
        return events

    def _require(self, op: ArenaOp) -> None:
        if not fsm.accepts(self.state, op):
            raise precondition("state", f"{op.value} is not accepted while the arena is {self.state.value}")

    # ---- holders (the fd hand-out server's view of processes) ----

    def holder_joined(self, holder_id: int, pid: int, uid: int) -> list[Event]:
        if holder_id in self._holders:
            raise ArenaError(Code.ALREADY_EXISTS, "holder_id", f"holder {holder_id} is already registered")
        holder = Holder(holder_id, pid, uid)
        self._holders[holder_id] = holder
        return [HolderJoined(holder)]

    def holder_disconnected(self, holder_id: int) -> list[Event]:
        """Its connection closed but its process may still map the arena: keep every hold it has."""
        holder = self._holder(holder_id, need_connected=False)
        holder.connected = False
        return [HolderDisconnected(holder)]

    def holder_gone(self, holder_id: int, now: float) -> list[Event]:
        """Its process exited: nothing of it can touch the arena any more; drop all it held."""
        holder = self._holders.pop(holder_id, None)
        if holder is None:
            raise not_found("holder_id", f"holder {holder_id} is not registered")
        events: list[Event] = [HolderGone(holder)]
        for p in [p for p in self._queue if p.request.holder_id == holder_id]:
            self._queue.remove(p)
            self._retired_requests.append(p.request.request_id)
            events.append(LeaseCancelled(p.request, CancelReason.HOLDER_GONE))
        for lease in list(self._leases.values()):
            if holder_id in lease.attached:
                del lease.attached[holder_id]
                events.append(RingDetached(lease.request, lease.ring_id, holder_id, None))
            if lease.owner == holder_id:
                lease.owner_holds = False
            if not lease.owner_holds and not lease.attached:
                events.append(self._reclaim(lease, ReclaimCause.HOLDER_EXITED))
        return events + self._drain(now)

    def _holder(self, holder_id: int, *, need_connected: bool, field: str = "holder_id") -> Holder:
        if holder_id == 0:
            raise invalid(field, "must be the non-zero id the fd hand-out socket gave this process")
        holder = self._holders.get(holder_id)
        if holder is None:
            raise not_found(field, f"holder {holder_id} is not connected to the fd hand-out socket")
        if need_connected and not holder.connected:
            raise precondition(field, f"holder {holder_id} closed its fd hand-out connection")
        return holder

    # ---- LeaseRing / CancelLease / ReleaseRing (spec §19) ----

    def lease(self, req: RingRequest, now: float) -> list[Event]:
        """RingLeased now, LeaseQueued (pressure) or LeaseRejected (never fits / shutting down)."""
        needed, align = self._validate(req)
        if self.state is ArenaState.SHUTTING_DOWN:
            return [LeaseRejected(req, RejectReason.SHUTTING_DOWN, "the arena is shutting down")]
        self._require(ArenaOp.LEASE)
        if needed > self.ceiling:
            detail = f"ring needs {needed} bytes, more than the arena ceiling of {self.ceiling} bytes"
            return [LeaseRejected(req, RejectReason.EXCEEDS_CEILING, detail)]
        pending = Pending(req, needed, align, now)
        if not self._queue:  # FIFO: nobody may overtake a queued request
            r = self._free.allocate(needed, align)
            if r is not None:
                return self._grant(pending, r, now)
        self._queue.append(pending)
        return [LeaseQueued(req, len(self._queue) - 1, needed)]

    def cancel(
        self, request_id: int, holder_id: int, now: float, reason: CancelReason = CancelReason.CANCEL_LEASE
    ) -> list[Event]:
        """Drop a queued request. A request already leased is an error that names its ring_id."""
        self._require(ArenaOp.CANCEL)
        if request_id == 0:
            raise invalid("request_id", "must be non-zero")
        for p in self._queue:
            if p.request.request_id == request_id:
                if holder_id and p.request.holder_id != holder_id:
                    raise precondition(
                        "holder_id", f"request {request_id} belongs to holder {p.request.holder_id}"
                    )
                self._queue.remove(p)
                self._retired_requests.append(request_id)
                # the new head may fit where the cancelled one did not
                return [LeaseCancelled(p.request, reason), *self._drain(now)]
        ring_id = self._ring_of_request.get(request_id)
        if ring_id is not None:
            raise precondition(
                "request_id", f"request {request_id} was already leased as ring {ring_id}; release that ring"
            )
        if request_id in self._retired_requests:
            raise precondition("request_id", f"request {request_id} is no longer queued (already answered)")
        raise not_found("request_id", f"no queued lease request {request_id}")

    def release(
        self, ring_id: int, holder_id: int, proof: int, now: float, *, when_detached: bool = False
    ) -> list[Event]:
        """The owner's ReleaseRing{proof}. While holders are still attached it is refused, unless
        `when_detached`: then the owner's hold ends now and the last detach reclaims the range."""
        self._require(ArenaOp.RELEASE)
        lease = self._lease(ring_id)
        self._holder(holder_id, need_connected=False)
        if proof not in ReleaseProof._value2member_map_:
            raise invalid("proof", f"must be QUIESCED or NEVER_INSTALLED, got {proof}")
        if lease.owner != holder_id:
            raise precondition(
                "holder_id", f"ring {ring_id} is owned by holder {lease.owner}, not {holder_id}"
            )
        holders = ", ".join(str(h) for h in sorted(lease.attached))
        if not lease.owner_holds:
            raise precondition(
                "ring_id", f"ring {ring_id} was already released; waiting for holder(s) {holders}"
            )
        if lease.attached and not when_detached:
            raise precondition(
                "ring_id", f"ring {ring_id} is still attached by holder(s) {holders}; detach first"
            )
        lease.owner_holds = False
        deferred = bool(lease.attached)
        events: list[Event] = [RingReleased(lease.request, ring_id, ReleaseProof(proof), deferred)]
        if deferred:
            return events
        events.append(self._reclaim(lease, ReclaimCause.RELEASED))
        return events + self._drain(now)

    # ---- attachments: every process that maps a ring's range holds one ----

    def attach(self, ring_id: int, holder_id: int, role: int) -> tuple[Lease, list[Event]]:
        self._require(ArenaOp.ATTACH)
        lease = self._lease(ring_id)
        self._holder(holder_id, need_connected=True)
        if role not in AttachRole._value2member_map_:
            raise invalid("role", f"must be PUMP, WORKER_RING, COPY or OTHER, got {role}")
        if not lease.owner_holds:
            raise precondition("ring_id", f"ring {ring_id} is draining: its owner is gone")
        if holder_id in lease.attached:
            raise precondition("holder_id", f"holder {holder_id} is already attached to ring {ring_id}")
        lease.attached[holder_id] = AttachRole(role)
        return lease, [RingAttached(lease.request, ring_id, holder_id, AttachRole(role))]

    def detach(self, ring_id: int, holder_id: int, proof: int, now: float) -> list[Event]:
        self._require(ArenaOp.DETACH)
        lease = self._lease(ring_id)
        self._holder(holder_id, need_connected=False)
        if proof not in DetachProof._value2member_map_:
            raise invalid("proof", f"must be PUMP_STOPPED, RING_QUIESCED or COPIES_ENDED, got {proof}")
        if holder_id not in lease.attached:
            raise precondition("holder_id", f"holder {holder_id} is not attached to ring {ring_id}")
        del lease.attached[holder_id]
        events: list[Event] = [RingDetached(lease.request, ring_id, holder_id, DetachProof(proof))]
        if not lease.owner_holds and not lease.attached:
            events.append(self._reclaim(lease, ReclaimCause.LAST_DETACH))
            events += self._drain(now)
        return events

    # ---- internals ----

    def _validate(self, req: RingRequest) -> tuple[int, int]:
        """Check every field before touching anything; returns (page-rounded length, start alignment)."""
        if req.request_id == 0:
            raise invalid("request_id", "must be non-zero")
        if req.request_id in self._ring_of_request or any(
            p.request.request_id == req.request_id for p in self._queue
        ):
            raise ArenaError(
                Code.ALREADY_EXISTS, "request_id", f"request {req.request_id} is already queued or leased"
            )
        if not req.requester:
            raise invalid("requester", "must name the requesting component")
        if req.direction not in (Direction.INGRESS, Direction.EGRESS):
            raise invalid(
                "direction", f"must be RING_DIRECTION_INGRESS or RING_DIRECTION_EGRESS, got {req.direction}"
            )
        if req.spec_direction not in (0, req.direction):
            raise invalid(
                "ring_spec.direction",
                f"{req.spec_direction} disagrees with the request's direction {req.direction}",
            )
        a = req.alignment
        if a <= 0 or a & (a - 1) or a > MAX_ALIGNMENT:
            raise invalid("ring_spec.alignment", f"must be a power of two in 1..{MAX_ALIGNMENT}, got {a}")
        c = req.data_capacity
        if c == 0:
            raise invalid("ring_spec.data_capacity", "must be non-zero")
        if c > MAX_DATA_CAPACITY:
            raise invalid(
                "ring_spec.data_capacity", f"{c} exceeds the largest mappable ring ({MAX_DATA_CAPACITY})"
            )
        if c % a:
            raise invalid("ring_spec.data_capacity", f"{c} is not a multiple of ring_spec.alignment {a}")
        if req.host_pinning not in _KNOWN_ENUM:
            raise invalid("ring_spec.host_pinning", f"unknown value {req.host_pinning}")
        if req.wake_coalescing not in _KNOWN_ENUM:
            raise invalid("ring_spec.wake_coalescing", f"unknown value {req.wake_coalescing}")
        self._holder(req.holder_id, need_connected=True)
        needed = round_up(self._abi.required_len(c, a), self.page_size)
        return needed, max(self._abi.range_alignment(a), self.page_size)

    def _lease(self, ring_id: int) -> Lease:
        if ring_id == 0:
            raise invalid("ring_id", "must be non-zero")
        lease = self._leases.get(ring_id)
        if lease is not None:
            return lease
        if ring_id in self._retired:
            raise precondition("ring_id", f"ring {ring_id} was already released")
        raise not_found("ring_id", f"no live ring {ring_id}")

    def _grant(self, p: Pending, r: Range, now: float) -> list[Event]:
        req = p.request
        ring_id = self._next_ring_id()
        layout = self._abi.mint(ring_id, r.offset, req.data_capacity, req.alignment, r.length)
        try:
            self._memory.prepare(layout, req.prefault)
        except RingInitError as e:
            self._memory.scrub(r)
            self._free.free(r)
            self._retired_requests.append(req.request_id)
            return [LeaseRejected(req, RejectReason.RING_INIT_FAILED, str(e))]
        self._leases[ring_id] = Lease(req, r, layout, now)
        self._ring_of_request[req.request_id] = ring_id
        return [RingLeased(req, layout)]

    def _reclaim(self, lease: Lease, cause: ReclaimCause) -> RingReclaimed:
        del self._leases[lease.ring_id]
        del self._ring_of_request[lease.request.request_id]
        self._retired.append(lease.ring_id)
        self._retired_requests.append(lease.request.request_id)
        self._memory.scrub(lease.range)  # zero pages before anyone else can be granted them
        self._free.free(lease.range)
        return RingReclaimed(lease.request, lease.ring_id, lease.range, cause)

    def _drain(self, now: float) -> list[Event]:
        """Serve the queue strictly in FIFO order while its head fits (spec §19: serially)."""
        events: list[Event] = []
        while self._queue and self.state is ArenaState.READY:
            head = self._queue[0]
            r = self._free.allocate(head.needed, head.range_alignment)
            if r is None:
                break
            self._queue.popleft()
            events += self._grant(head, r, now)
        return events

    # ---- read-only views ----

    def lease_of(self, ring_id: int) -> Lease:
        return self._lease(ring_id)

    def leases(self) -> list[Lease]:
        return sorted(self._leases.values(), key=lambda lease: lease.range.offset)

    def free_ranges(self) -> list[Range]:
        return self._free.ranges()

    def stats(self) -> Stats:
        free = self._free.free_bytes
        leases = tuple(
            LeaseInfo(
                request=lease.request,
                ring_id=lease.ring_id,
                owner_pid=h.pid if (h := self._holders.get(lease.owner)) else 0,
                owner_holds=lease.owner_holds,
                attached_holder_ids=tuple(sorted(lease.attached)),
                layout=lease.layout,
                range_length=lease.range.length,
            )
            for lease in self.leases()
        )
        queued = tuple(self._queue)  # frozen: the queue's entries are their own snapshot
        return Stats(
            state=self.state,
            ceiling=self.ceiling,
            leased_bytes=self.ceiling - free,
            free_bytes=free,
            largest_free_range=self._free.largest,
            free_ranges=len(self._free.ranges()),
            leases=leases,
            queued=queued,
            holders=tuple(sorted(self._holders.values(), key=lambda h: h.holder_id)),
        )
