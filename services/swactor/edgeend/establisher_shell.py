"""The asyncio shell of the EdgeEstablisher core (§26, §38), shared by the stage node and the orchestrator.

It executes the core's actions against the local arena-manager (ArenaPort) and edge-driver
(DriverPort) and feeds their outcomes back into the core. What differs between the two users is the
*ring host* (InstallRing / UninstallRing / the driver's wake eventfds): the stage node hands rings to
its compute process, the orchestrator opens ring-rs ends in-process. The core's outcomes (EdgeReady,
EdgeFailed, EdgeStopped) go to the owner through one callback.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from swactor.common.ringerrors import RingBroken
from swactor.edgeend import establisher as est
from swactor.edgeend.ports import ArenaPort, DriverEvent, DriverPort
from swactor.v1 import arena_pb2
from swactor.v1 import common_pb2 as pb

EdgeOutcome = est.EdgeReady | est.EdgeFailed | est.EdgeStopped
# How long an edge waits for its ring lease before it fails RUN_FAULT_ARENA_PRESSURE_TIMEOUT (§36): long
# enough for a queued lease to be served when another run's rings are released, far below the
# run's readiness timeout (600 s) that would otherwise be the only bound.
DEFAULT_LEASE_TIMEOUT_S = 30.0


class RingHost(Protocol):
    def install(self, edge: est.EdgeProvision, layout: Any) -> bool:
        """Install the leased ring (after AttachRing WORKER_RING). True: installed now (the shell
        reports RingInstalled); False: the host reports RingInstalled / RingFault itself later.
        Raising reports a RingFault: RingBroken's reason, else RING_FAULT_RING_LAYOUT_INVALID."""

    def uninstall(self, ring_id: int, reason: int) -> bool:
        """Stop touching the ring. True: quiesced now (the shell reports RingQuiesced); False: later."""

    def wake_fds(self, edge_id: int, ring_id: int, fds: tuple[int, int] | None) -> None:
        """The driver accepted the edge; `fds` are its pump's eventfds for the ring (the shell closes them)."""


@dataclass(eq=False)
class EstablisherShell:
    """One owner's edges: the core, the local services, the ring host, and where outcomes go."""

    arena: ArenaPort
    driver: DriverPort
    host: RingHost
    outcome: Callable[[EdgeOutcome], None]
    spawn: Callable[[Awaitable[Any]], None]  # runs a coroutine as a task the owner tracks
    log: Any
    core: est.EdgeEstablisher = field(default_factory=est.EdgeEstablisher)
    # A lease not granted within this long fails the edge RUN_FAULT_ARENA_PRESSURE_TIMEOUT (§36); None = never.
    lease_timeout_s: float | None = None
    # Steps of one ring (install, uninstall, release) and of one edge at the driver (establish, stop)
    # run in the core's order: a teardown never overtakes a call still in flight. (Seen on a local
    # pool: a release whose detach missed the hold an AttachRing still in flight then added, and a
    # StopEdge the driver answered "unknown" before the EstablishSend it overtook started a pump;
    # either way the range stayed leased.) key -> set when the key's latest step is done.
    _steps: dict[tuple[str, int], asyncio.Event] = field(default_factory=dict)

    def handle(self, inp: est.Input) -> None:
        for action in self.core.handle(inp):
            self._do(action)

    def _do(self, a: est.Action) -> None:
        match a:
            case est.LeaseRing():
                self.spawn(self._lease(a))
            case est.CancelLease(request_id):
                self.spawn(self.arena.cancel(request_id))
            case est.InstallRing(edge, layout):
                self._in_order(("ring", layout.ring_id), self._install(edge, layout))
            case est.UninstallRing(ring_id, reason):
                if ("ring", ring_id) in self._steps:
                    self._in_order(("ring", ring_id), self._uninstall(ring_id, reason))
                else:
                    self._uninstall_now(ring_id, reason)
            case est.EstablishSend() | est.EstablishRecv():
                self._in_order(("edge", a.edge_id), self._establish(a))
            case est.StopPump(edge_id, ring_id):
                self._in_order(("edge", edge_id), self._stop_pump(edge_id, ring_id))
            case est.ReleaseRing(ring_id, never_installed):
                self._in_order(("ring", ring_id), self._release(ring_id, never_installed))
            case est.EdgeReady() | est.EdgeFailed() | est.EdgeStopped():
                self.outcome(a)

    def _in_order(self, key: tuple[str, int], step: Coroutine[Any, Any, None]) -> None:
        """Run `step` once the previous step of the same ring or edge is done."""
        before = self._steps.get(key)
        done = self._steps[key] = asyncio.Event()

        async def in_order() -> None:
            started = False
            try:
                if before is not None:
                    await before.wait()
                started = True
                await step
            finally:
                if not started:
                    step.close()  # cancelled while waiting: the step never runs
                done.set()
                if self._steps.get(key) is done:
                    del self._steps[key]

        self.spawn(in_order())

    def _uninstall_now(self, ring_id: int, reason: int) -> None:
        if self.host.uninstall(ring_id, reason):
            self.handle(est.RingQuiesced(ring_id))

    async def _uninstall(self, ring_id: int, reason: int) -> None:
        self._uninstall_now(ring_id, reason)

    async def follow_driver(self, seen: Callable[[DriverEvent], bool] = lambda ev: True) -> None:
        """Feed the driver's events into the core until the stream ends; `seen` sees each one first
        and says whether it is this owner's. Stream errors propagate."""
        async for ev in self.driver.events():
            if seen(ev):
                self.handle(ev)

    async def _lease(self, a: est.LeaseRing) -> None:
        timer = None
        if self.lease_timeout_s is not None:
            timer = asyncio.get_running_loop().call_later(
                self.lease_timeout_s, self.handle, est.LeaseTimedOut(a.request_id, self.lease_timeout_s))
        try:
            out = await self.arena.lease(a.request_id, a.edge_id, a.direction, a.ring_spec)
        except Exception as e:
            out = est.RingLeaseRejected(a.request_id, arena_pb2.LEASE_REJECT_REASON_UNSPECIFIED,
                                        f"arena-manager unreachable: {type(e).__name__}: {e}")
        finally:
            if timer is not None:
                timer.cancel()
        if out is not None:
            self.handle(out)

    async def _install(self, edge: est.EdgeProvision, layout: Any) -> None:
        try:
            await self.arena.attach_worker(layout.ring_id)
        except Exception as e:
            self.handle(est.RingFault(layout.ring_id, pb.RING_FAULT_RING_LAYOUT_INVALID,
                                      f"AttachRing: {type(e).__name__}: {e}"))
            return
        try:
            now = self.host.install(edge, layout)
        except Exception as e:  # RingBroken carries the RingFaultReason
            reason = e.reason if isinstance(e, RingBroken) else pb.RING_FAULT_RING_LAYOUT_INVALID
            self.handle(est.RingFault(layout.ring_id, reason, f"{type(e).__name__}: {e}"))
            return
        if now:
            self.handle(est.RingInstalled(layout.ring_id))

    async def _establish(self, a: est.EstablishSend | est.EstablishRecv) -> None:
        try:
            if isinstance(a, est.EstablishSend):
                await self.driver.establish_send(a.edge_id, a.rx_node_id, a.layout)
            else:
                await self.driver.establish_recv(a.edge_id, a.tx_node_id, a.layout)
        except Exception as e:
            self.handle(est.DriverFailed(a.edge_id, f"{type(a).__name__}: {e}"))
            return
        try:
            fds = await self.driver.wake_fds(a.layout.ring_id)
        except Exception as e:  # without them the ring host is never woken: the edge cannot work
            self.handle(est.WakeFdsUnavailable(a.edge_id, f"{type(e).__name__}: {e}"))
            return
        try:
            self.host.wake_fds(a.edge_id, a.layout.ring_id, fds)
        except Exception as e:  # e.g. the ring end is gone: the edge would never be Ready
            self.handle(est.WakeFdsUnavailable(a.edge_id, f"the ring host did not take them: {type(e).__name__}: {e}"))
            return
        finally:
            for fd in fds or ():
                os.close(fd)
        self.handle(est.WakeFdsHanded(a.edge_id))

    async def _stop_pump(self, edge_id: int, ring_id: int) -> None:
        try:
            known = await self.driver.stop_edge(edge_id, ring_id)
        except Exception as e:
            self.log.warning("edge_driver_stop_failed", edge_id=edge_id, detail=str(e))
            known = False  # an unreachable driver runs no pump for this edge any more
        if not known:
            self.handle(est.PumpStopped(edge_id, ring_id))

    async def _release(self, ring_id: int, never_installed: bool) -> None:
        try:
            await self.arena.release(ring_id, never_installed)
        except Exception as e:  # the arena reclaims the holder's leases when this process exits
            self.log.error("arena_release_failed", ring_id=ring_id, detail=str(e))
        self.handle(est.Released(ring_id))
