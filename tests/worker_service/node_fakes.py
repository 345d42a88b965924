"""Node-level fakes for unit tests: ports and a worker ctl that answers like a healthy worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from swactor.common.layout import Layout
from swactor.edgeend import establisher as est
from swactor.v1 import common_pb2
from swactor.worker.ctl_fsm import CtlState
from swactor.worker.process import wire

# The orchestrator's lease window (worker/stage_lease.py) of a StageNode that a test drives without
# a WatchStage stream: long enough never to expire during the test.
UNLEASED = 3600.0


class FakeArenaPort:
    """Hands out layouts from a real memfd arena (tests.worker_service.harness.Arena) or fake ones."""

    def __init__(self, arena: Any = None) -> None:
        self.arena = arena
        self.calls: list[tuple[str, int]] = []
        self._next_ring = 1000

    async def lease(self, request_id: int, edge_id: int, direction: str, ring_spec: Any) -> est.RingLeased:
        self.calls.append(("lease", edge_id))
        if self.arena is not None:
            return est.RingLeased(request_id, self.arena.ring(int(ring_spec.data_capacity), int(ring_spec.alignment) or 64))
        self._next_ring += 1
        return est.RingLeased(request_id, Layout(self._next_ring, 0, 4096, 0, 256, 3840, 64))

    async def cancel(self, request_id: int) -> None:
        self.calls.append(("cancel", request_id))

    async def attach_worker(self, ring_id: int) -> None:
        self.calls.append(("attach", ring_id))

    async def detach_worker(self, ring_id: int) -> None:
        self.calls.append(("detach", ring_id))

    async def release(self, ring_id: int, never_installed: bool) -> None:
        self.calls.append(("release", ring_id))


class FakeDriverPort:
    """An edge-driver whose edges are ready at once and whose pumps stop on request."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.calls: list[tuple[str, int]] = []

    async def establish_send(self, edge_id: int, rx_node_id: int, layout: Layout) -> None:
        self.calls.append(("send", edge_id))
        self.queue.put_nowait(est.DriverEdgeReady(edge_id, layout.ring_id))

    async def establish_recv(self, edge_id: int, tx_node_id: int, layout: Layout) -> None:
        self.calls.append(("recv", edge_id))
        self.queue.put_nowait(est.DriverEdgeReady(edge_id, layout.ring_id))

    async def stop_edge(self, edge_id: int, ring_id: int) -> bool:
        self.calls.append(("stop", edge_id))
        self.queue.put_nowait(est.PumpStopped(edge_id, ring_id))
        return True

    async def events(self) -> AsyncIterator[Any]:
        while True:
            yield await self.queue.get()

    async def wake_fds(self, ring_id: int) -> tuple[int, int] | None:
        return None

    async def healthy(self) -> bool:
        return True

    def for_new_owner(self) -> Any:
        return self  # in-process: nothing outlives the test's own teardown


class FakeMembership:
    def __init__(self) -> None:
        self.states: list[str] = []
        self.generations: list[int] = []

    async def set_available(self, control_endpoint: str, worker_generation: int = 0) -> None:
        self.states.append(f"available:{control_endpoint}")
        self.generations.append(worker_generation)

    async def set_faulted(self, reason: int, worker_generation: int = 0) -> None:
        self.states.append(f"faulted:{common_pb2.RunFaultReason.Name(reason)}")
        self.generations.append(worker_generation)


class FakeCtl:
    """A GpuWorkerCtl stand-in that answers commands the way a healthy worker does (unit tests only)."""

    def __init__(self, role_failure: int | None = None) -> None:
        self.state = CtlState.NOT_STARTED
        self.worker_generation = 0
        self.sent: list[Any] = []
        self.subs: list[Any] = []
        self.role_failure = role_failure
        self.configured: dict[str, Any] | None = None

    def subscribe(self, fn: Any) -> None:
        self.subs.append(fn)

    def _emit(self, ev: Any) -> None:
        loop = asyncio.get_running_loop()
        for fn in self.subs:
            loop.call_soon(fn, ev)

    def start(self) -> None:
        self.state = CtlState.RUNNING
        self.worker_generation += 1
        self._emit(wire.WorkerReady(1, self.worker_generation, 1, {}))

    def share_wake_fds(self, ring_id: int, readable_fd: int, writable_fd: int) -> bool:
        return False

    def send(self, cmd: Any) -> None:
        self.sent.append(cmd)
        match cmd:
            case wire.ConfigureRole(role_id, config):
                if self.role_failure:
                    self._emit(wire.RoleFailed(role_id, self.role_failure, "fake"))
                    return
                warm = self.configured is not None and self.configured["layer_start"] == config["layer_start"]
                self.configured = config
                self._emit(wire.RoleProgress(role_id, 1, 1))
                self._emit(wire.RoleConfigured(role_id, warm))
            case wire.InstallRing(ring_id=r, edge_id=e, port_id=p):
                self._emit(wire.RingInstalled(r, e, p))
            case wire.UninstallRing(ring_id=r):
                self._emit(wire.RingQuiesced(r))
            case wire.ReleaseDeviceObject(device_handle=h):
                self._emit(wire.DeviceObjectReleased(h))
