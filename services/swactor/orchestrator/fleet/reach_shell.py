"""The asyncio shell of reach.py: runs the probes it asks for (reach_probe.py), logs what changed,
and publishes the membership view with the nodes it cannot reach masked as not provisionable.

`on_view` is the orchestrator's membership callback (in front of the reconcile shell's); `run` starts
the re-probes when they are due.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping

import grpc

from swactor.common.events import get_logger
from swactor.orchestrator.fleet import reach_probe
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.fleet.reach import Changed, Probe, ReachTracker

log = get_logger(component="reach")


class ReachShell:
    def __init__(self, tracker: ReachTracker, publish: Callable[[tuple[NodeInfo, ...]], None], *,
                 channel: Callable[[Probe], grpc.aio.Channel] | None, node_id: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tracker = tracker
        self._publish = publish
        self._channel = channel  # the mutual-TLS channel to a node's control endpoint (None: no cluster secret)
        self._node_id = node_id  # this (the orchestrator's) host
        self._clock = clock
        self._view: tuple[NodeInfo, ...] = ()
        self._wake = asyncio.Event()
        self._probes: set[asyncio.Task[None]] = set()

    def on_view(self, view: tuple[NodeInfo, ...]) -> None:
        self._view = view
        self._start(self.tracker.observe(view, self._clock()))
        self._publish(self.tracker.apply(view))

    def set_rtts(self, rtts: Mapping[tuple[int, int], float]) -> None:
        """The members' measured round trips ((from, to) -> ms): a probe waits for several of them."""
        self.tracker.rtt_ms = {to: ms for (frm, to), ms in rtts.items() if frm == self._node_id}

    async def run(self) -> None:
        """Until cancelled: start the re-probes as they fall due."""
        try:
            while True:
                self._start(self.tracker.due(self._clock()))
                at = self.tracker.deadline()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), None if at is None else max(0.0, at - self._clock()))
        finally:
            for t in self._probes:
                t.cancel()

    def _start(self, probes: list[Probe]) -> None:
        for p in probes:
            task = asyncio.create_task(self._probe(p), name=f"reach-{p.node_id}")
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)

    async def _probe(self, p: Probe) -> None:
        try:
            problems = await reach_probe.probe(p, self._channel, self.tracker.config.tries)
        except Exception as e:  # a bug here must not keep a node out of the pool in silence
            log.error("reach_probe_failed", node_id=p.node_id, detail=repr(e))
            problems = ()
        before = self.tracker.verdict(p.node_id)
        changed = self.tracker.report(p, problems, self._clock())
        if changed is not None:
            _log(changed)
        if self.tracker.verdict(p.node_id) != before:
            self._publish(self.tracker.apply(self._view))
        self._wake.set()  # a re-probe is scheduled now


def _log(c: Changed) -> None:
    for u in c.problems:
        log.warning("node_endpoint_unreachable", node_id=c.node_id, endpoint=u.endpoint.value, address=u.address,
                    reason=u.failure.name, timeout_s=u.timeout_s, detail=u.text())
    if not c.problems:
        log.info("node_endpoints_reachable", node_id=c.node_id, detail="every advertised endpoint answers again")
