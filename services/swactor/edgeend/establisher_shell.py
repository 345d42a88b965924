"""The asyncio shell of the EdgeEstablisher core (§26, §38), shared by the stage node and the orchestrator.

It executes the core's actions against the local arena-manager (ArenaPort) and edge-driver
(DriverPort) and feeds their outcomes back into the core. What differs between the two users is the
*ring host* (InstallRing / UninstallRing / the driver's wake eventfds): the stage node hands rings to
its compute process, the orchestrator opens ring-rs ends in-process. The core's outcomes (EdgeReady,
EdgeFailed, EdgeStopped) go to the owner through one callback.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from swactor.common.ringerrors import RingBroken
from swactor.edgeend import establisher as est
from swactor.edgeend.ports import ArenaPort, Cancelled, DriverEvent, DriverPort, Leased, Rejected
from swactor.v1 import arena_pb2
from swactor.v1 import common_pb2 as pb

EdgeOutcome = est.EdgeReady | est.EdgeFailed | est.EdgeStopped


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
                self.spawn(self._install(edge, layout))
            case est.UninstallRing(ring_id, reason):
                if self.host.uninstall(ring_id, reason):
                    self.handle(est.RingQuiesced(ring_id))
            case est.EstablishSend() | est.EstablishRecv():
                self.spawn(self._establish(a))
            case est.StopPump(edge_id):
                self.spawn(self._stop_pump(edge_id))
            case est.ReleaseRing(ring_id, never_installed):
                self.spawn(self._release(ring_id, never_installed))
            case est.EdgeReady() | est.EdgeFailed() | est.EdgeStopped():
                self.outcome(a)

    async def follow_driver(self, seen: Callable[[DriverEvent], bool] = lambda ev: True) -> None:
        """Feed the driver's events into the core until the stream ends; `seen` sees each one first
        and says whether it is this owner's. Stream errors propagate."""
        async for ev in self.driver.events():
            if seen(ev):
                self.handle(ev)

    async def _lease(self, a: est.LeaseRing) -> None:
        try:
            out = await self.arena.lease(a.request_id, a.edge_id, a.direction, a.ring_spec)
        except Exception as e:
            self.handle(est.RingLeaseRejected(a.request_id, arena_pb2.LEASE_REJECT_REASON_UNSPECIFIED,
                                              f"arena-manager unreachable: {type(e).__name__}: {e}"))
            return
        match out:
            case Leased(layout):
                self.handle(est.RingLeased(a.request_id, layout))
            case Rejected(reason, detail):
                self.handle(est.RingLeaseRejected(a.request_id, reason, detail))
            case Cancelled():
                pass

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
        fds = await self.driver.wake_fds(a.layout.ring_id)
        try:
            self.host.wake_fds(a.edge_id, a.layout.ring_id, fds)
        finally:
            for fd in fds or ():
                os.close(fd)

    async def _stop_pump(self, edge_id: int) -> None:
        try:
            known = await self.driver.stop_edge(edge_id)
        except Exception as e:
            self.log.warning("edge_driver_stop_failed", edge_id=edge_id, detail=str(e))
            known = False  # an unreachable driver runs no pump for this edge any more
        if not known:
            self.handle(est.PumpStopped(edge_id))

    async def _release(self, ring_id: int, never_installed: bool) -> None:
        try:
            await self.arena.release(ring_id, never_installed)
        except Exception as e:  # the arena reclaims the holder's leases when this process exits
            self.log.error("arena_release_failed", ring_id=ring_id, detail=str(e))
        self.handle(est.Released(ring_id))
