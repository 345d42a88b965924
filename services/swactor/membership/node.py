"""MembershipNode: the SWIM engine, the member table and the watchers, glued on asyncio.

The engine runs the protocol off this loop; this class only pumps its events into MemberView,
fans the resulting watch events out to subscribers, retries the seeds while the node knows no
live peer, publishes local metadata changes and leaves gracefully on stop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from swactor.common.aio import cancel_and_wait
from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.membership.metadata import check_endpoint, check_fingerprint, check_stage_devices, encode_tags
from swactor.membership.probe_timing import DEFAULT_PROBE, Advice, ProbeAdvisor, ProbeTiming
from swactor.membership.rtt import PING, PONG, ROW, Rtt, RttTable
from swactor.membership.swim import (
    JoinFailed,
    Liveness,
    MessageFailed,
    SwimBackend,
    SwimCounters,
    SwimEvent,
    SwimEventKind,
)
from swactor.membership.view import Counts, MemberRecord, MemberView, ViewEvent
from swactor.v1 import membership_pb2 as pb

WATCH_QUEUE_MAX = 4096
# Safety net: how often the view is diffed against the engine's table.
RECONCILE_INTERVAL_S = 5.0
# An RTT row not refreshed for this many sampling intervals is dropped (its node stopped measuring or left).
RTT_STALE_INTERVALS = 5
_STATE_EVENTS = {
    pb.NODE_STATE_AVAILABLE: "node_available",
    pb.NODE_STATE_FAULTED: "node_faulted",
    pb.NODE_STATE_BOOTING: "node_booting",
}
# The optional fields of SetLocalStateRequest a node gossips, each with its check (it returns the value to keep).
_LOCAL_FIELDS: dict[str, Callable[[Any], Any]] = {
    "edge_endpoint": partial(check_endpoint, "edge_endpoint"),
    "edge_cert_fingerprint": check_fingerprint,
    "control_endpoint": partial(check_endpoint, "control_endpoint"),
    "worker_generation": int,
    "stage_memory_bytes": int,
    "stage_devices": check_stage_devices,
    "step_us_per_layer": int,
}


@dataclass(frozen=True)
class NodeTimings:
    join_retry_interval_s: float
    departed_retention_s: float
    leave_timeout_s: float
    rtt_interval_s: float = 2.0  # 0: no RTT sampling
    # What the SWIM engine was started with: the RTTs measured are checked against them (probe_timing.py).
    probe: ProbeTiming = DEFAULT_PROBE
    # The config's timings, where the engine started with a saved advice's longer ones instead (None: `probe`).
    probe_configured: ProbeTiming | None = None


class Subscriber:
    """One watcher's queue. None marks the end (node stopping); overflow ends it too."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[ViewEvent | None] = asyncio.Queue()
        self.overflowed = False

    def push(self, ev: ViewEvent | None) -> None:
        if self.overflowed:
            return
        if ev is not None and self.queue.qsize() >= WATCH_QUEUE_MAX:
            self.overflowed = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(ev)


class MembershipNode:
    def __init__(
        self,
        backend: SwimBackend,
        metadata: pb.NodeMetadata,
        seeds: list[str],
        timings: NodeTimings,
        on_change: Callable[[Counts], None] = lambda counts: None,
        on_advice: Callable[[Advice], None] = lambda advice: None,
    ) -> None:
        self._backend = backend
        self._on_advice = on_advice  # keeps probe timing advice for the next start (probe_timing.save_advice)
        self._metadata = pb.NodeMetadata()
        self._metadata.CopyFrom(metadata)
        self._seeds = list(seeds)
        self._timings = timings
        self._on_change = on_change
        self._subscribers: set[Subscriber] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._alone = asyncio.Event()
        self._meta_lock = asyncio.Lock()
        self._view: MemberView | None = None
        self._rtt = RttTable(metadata.node_id, RTT_STALE_INTERVALS * timings.rtt_interval_s)
        self._probe_advisor = ProbeAdvisor(timings.probe_configured or timings.probe, timings.probe)
        self._stopped = False
        # Set when a background task dies or the engine's event stream ends without stop():
        # the process should exit non-zero (systemd restarts it) rather than serve a frozen view.
        self.failed = asyncio.Event()
        self.failure: str = ""
        # Bound here, not at import: a bound structlog logger keeps the config of its creation.
        self._log = get_logger(component="membership")

    # ---- lifecycle ----

    async def start(self) -> None:
        await self._backend.start()
        events = self._backend.events()  # subscribe before reading members: no join falls between
        t = wall_us()
        self._view = MemberView(self._backend.local(), t, int(self._timings.departed_retention_s * 1e6))
        self._view.resync(self._backend.members(), [], t)
        self._tasks = [
            asyncio.create_task(self._pump(events), name="membership-pump"),
            asyncio.create_task(self._reconcile_loop(), name="membership-reconcile"),
        ]
        if self._seeds:
            self._tasks.append(asyncio.create_task(self._join_loop(), name="membership-join"))
        if self._timings.rtt_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._rtt_loop(), name="membership-rtt"))
        for task in self._tasks:
            task.add_done_callback(self._task_done)
        self._update_alone()
        local = self.view.local().member
        self._log.info("membership_started", node_id=self._metadata.node_id, gossip_address=local.addr,
                       seeds=self._seeds, incarnation=local.incarnation)

    async def stop(self, graceful: bool) -> None:
        """Leave (peers see "left") when graceful, then close the engine and end every watch."""
        if self._stopped:
            return
        self._stopped = True
        if graceful:
            self._log.info("membership_leaving", node_id=self._metadata.node_id)
            try:
                await self._backend.leave(self._timings.leave_timeout_s)
            except Exception as e:  # a broken engine cannot leave; peers will see a death instead
                self._log.error("membership_leave_failed", reason="engine_error", detail=repr(e))
        await cancel_and_wait(self._tasks)
        await self._backend.close()
        for sub in list(self._subscribers):
            sub.push(None)
        self._log.info("membership_stopped", node_id=self._metadata.node_id, graceful=graceful)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if self._stopped or task.cancelled() or self.failed.is_set():
            return
        error = task.exception()
        self.failure = f"{task.get_name()} ended: {error!r}" if error else f"{task.get_name()} ended"
        self._log.error("membership_task_failed", task=task.get_name(), reason="internal_error",
                        detail=repr(error) if error else "event stream ended")
        self.failed.set()

    # ---- reads ----

    @property
    def view(self) -> MemberView:
        if self._view is None:
            raise RuntimeError("membership node not started")
        return self._view

    @property
    def metadata(self) -> pb.NodeMetadata:
        return self._metadata

    def swim_counters(self) -> SwimCounters:
        return self._backend.counters()

    def rtts(self) -> list[Rtt]:
        """Every measured pair this node knows (its own and its peers' broadcast rows)."""
        return self._rtt.matrix(time.monotonic())

    def has_live_peer(self) -> bool:
        c = self.view.counts()
        return c.alive + c.suspect > 1

    def subscribe(self) -> Subscriber:
        sub = Subscriber()
        self._subscribers.add(sub)
        if self._stopped:
            sub.push(None)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    # ---- local state ----

    async def set_local_state(self, request: pb.SetLocalStateRequest) -> MemberRecord:
        """Change this node's gossiped state and the endpoint material / stage memory the request sets
        (a field it leaves unset keeps its value); raises ValueError on bad input."""
        state, reason = request.state, request.reason
        if state not in _STATE_EVENTS:
            raise ValueError(f"state must be BOOTING, AVAILABLE or FAULTED, got {pb.NodeState.Name(state)}")
        if state != pb.NODE_STATE_FAULTED and reason:
            raise ValueError("reason is only for state FAULTED")
        md = pb.NodeMetadata()
        md.CopyFrom(self._metadata)
        md.state, md.state_reason = state, reason
        for name, check in _LOCAL_FIELDS.items():
            if request.HasField(name):
                setattr(md, name, check(getattr(request, name)))
        tags = encode_tags(md)
        async with self._meta_lock:
            if md != self._metadata:
                await self._backend.set_meta(tags)
                old_state = self._metadata.state
                self._metadata = md
                if old_state != state:
                    self._log.info(_STATE_EVENTS[state], node_id=md.node_id, reason=reason or None,
                             previous=pb.NodeState.Name(old_state))
            self._publish(self.view.update_local(self._backend.local(), wall_us()))
        return self.view.local()

    # ---- background tasks ----

    async def _pump(self, events: AsyncIterator[SwimEvent]) -> None:
        async for ev in events:
            if ev.kind is SwimEventKind.MESSAGE:
                await self._message(ev)
            elif ev.kind is SwimEventKind.RESYNC:
                self._log.warning("membership_events_lost")
                self._reconcile()
            else:
                self._publish(self.view.apply(ev, wall_us()))

    async def _message(self, ev: SwimEvent) -> None:
        """An RTT probe, echo or row (rtt.py); anything else is not ours and is dropped."""
        assert ev.member is not None
        data, now = ev.data, time.monotonic()
        if data.startswith(PING) and (pong := RttTable.pong_for(data)) is not None:
            try:
                await self._backend.send(ev.member.name, pong)
            except MessageFailed as e:
                self._log.debug("rtt_pong_failed", member=ev.member.name, detail=str(e))
        elif data.startswith(PONG):
            self._rtt.on_pong(_node_id(ev.member.meta, ev.member.name), data, time.monotonic_ns(), now)
        elif not (data.startswith(ROW) and self._rtt.on_row(data, now)):
            self._log.debug("membership_message_dropped", member=ev.member.name, size=len(data))

    async def _rtt_loop(self) -> None:
        """Ping every live peer, then broadcast this node's row, once per rtt_interval_s."""
        while True:
            peers = [r.member for r in self.view.records(include_departed=True) if not r.is_self]
            self._rtt.forget(_node_id(m.meta, m.name) for m in peers if m.liveness not in (Liveness.ALIVE, Liveness.SUSPECT))
            for m in peers:
                if m.liveness is Liveness.ALIVE:
                    try:
                        await self._backend.send(m.name, RttTable.ping(time.monotonic_ns()))
                    except MessageFailed as e:  # it died or left since the view was read
                        self._log.debug("rtt_ping_failed", member=m.name, detail=str(e))
            for row in self._rtt.rows(time.monotonic()):
                try:
                    await self._backend.broadcast(row)
                except MessageFailed as e:
                    self._log.debug("rtt_row_failed", detail=str(e))
            self._advise_probe_timing()
            await asyncio.sleep(self._timings.rtt_interval_s)

    def _advise_probe_timing(self) -> None:
        """Tell the operator when the measured RTTs call for other probe timings, and keep them for the next start
        (the engine cannot change its own while it runs: probe_timing.py)."""
        advice = self._probe_advisor.observe(self._rtt.own(time.monotonic()))
        if advice is None:
            return
        try:
            self._on_advice(advice)
        except OSError as e:  # a read-only state directory: the advice is still logged
            self._log.warning("membership_probe_advice_not_kept", detail=str(e))
        log = self._log.info if advice.sufficient else self._log.warning
        log("membership_probe_timeout_advised", node_id=self._metadata.node_id, sufficient=advice.sufficient,
            probe_timeout_s=round(advice.timing.probe_timeout_s, 3),
            probe_interval_s=round(advice.timing.probe_interval_s, 3),
            configured_probe_timeout_s=advice.configured.probe_timeout_s,
            configured_probe_interval_s=advice.configured.probe_interval_s,
            farthest_peer=advice.peer, farthest_rtt_ms=round(advice.rtt_ms, 1))

    def _reconcile(self) -> None:
        """Diff the view against the engine's own table (after lost events, and periodically)."""
        current = self._backend.members()
        live = {m.name for m in current}
        gone = [r.member.name for r in self.view.records() if not r.is_self and r.member.name not in live]
        tombstones = [m for m in map(self._backend.member, gone) if m is not None]
        events = self.view.resync(current, tombstones, wall_us())
        if events:
            self._log.warning("membership_view_reconciled", changes=len(events))
        self._publish(events)

    async def _join_loop(self) -> None:
        """While no live peer is known, push-pull with the seeds every join_retry_interval_s.
        Logs the first failure, every 30th, and the success, not every attempt."""
        failures = 0
        while True:
            await self._alone.wait()
            try:
                answered = await self._backend.join(self._seeds)
            except JoinFailed as e:
                answered, detail = 0, str(e)
            else:
                detail = "only this node answered" if answered == 0 else ""
            if answered:
                self._log.info("membership_join", seeds=self._seeds, answered=answered, attempts=failures + 1)
                failures = 0
            else:
                if failures % 30 == 0:
                    self._log.info("membership_join_retry", seeds=self._seeds, attempt=failures + 1,
                                   reason="no_seed_answered", detail=detail,
                                   retry_s=self._timings.join_retry_interval_s)
                failures += 1
            self._update_alone()
            await asyncio.sleep(self._timings.join_retry_interval_s)
            self._update_alone()

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE_INTERVAL_S)
            self._reconcile()
            for name in self.view.expire(wall_us()):
                self._log.info("member_forgotten", member=name)

    def _update_alone(self) -> None:
        if self.has_live_peer():
            self._alone.clear()
        else:
            self._alone.set()

    def _publish(self, events: list[ViewEvent]) -> None:
        if not events:
            return
        for ev in events:
            m = ev.record.member
            self._log.info(
                f"member_{ev.kind.value}",
                member_node_id=self._metadata.node_id if ev.record.is_self else _node_id(m.meta, m.name),
                gossip_address=m.addr,
                incarnation=m.incarnation,
                liveness=m.liveness.value,
            )
            for sub in list(self._subscribers):
                sub.push(ev)
        self._update_alone()
        self._on_change(self.view.counts())


def _node_id(meta: object, name: str) -> int:
    try:
        return int(dict(meta).get("id", name))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0

