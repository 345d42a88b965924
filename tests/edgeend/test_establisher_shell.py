"""The establisher shell's order of steps when a teardown arrives while a call is still in flight:
AttachRing before the ring's uninstall and release, EstablishSend/Recv before StopEdge at the
driver. (Seen on a local pool: a run refused at provisioning left the rings of the stages still
being set up leased: attached by their worker, or pumped by an edge the driver established after it
had answered StopEdge "unknown".)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from swactor.common.layout import Layout
from swactor.edgeend import establisher as est
from swactor.edgeend.establisher_shell import EstablisherShell
from swactor.v1 import common_pb2 as pb


class SlowAttachArena:
    """An arena port whose AttachRing answers only when the test says so; detach only drops a hold
    that attach added (like ArenaClientPort)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.attach_may_finish = asyncio.Event()
        self.attached: set[int] = set()

    async def lease(self, request_id: int, edge_id: int, direction: str, ring_spec: Any) -> est.RingLeased:
        self.calls.append("lease")
        return est.RingLeased(request_id, Layout(7, 0, 4096, 0, 256, 3840, 64))

    async def cancel(self, request_id: int) -> None:
        self.calls.append("cancel")

    async def attach_worker(self, ring_id: int) -> None:
        await self.attach_may_finish.wait()
        self.attached.add(ring_id)
        self.calls.append("attach")

    async def release(self, ring_id: int, never_installed: bool) -> None:
        if ring_id in self.attached:  # ArenaClientPort.release detaches its own hold first
            self.attached.discard(ring_id)
            self.calls.append("detach")
        self.calls.append("release")


class Driver:
    async def events(self) -> AsyncIterator[Any]:
        await asyncio.Event().wait()
        yield None  # pragma: no cover

    async def stop_edge(self, edge_id: int, ring_id: int) -> bool:
        return False


class Host:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def install(self, edge: est.EdgeProvision, layout: Any) -> bool:
        self.calls.append("install")
        return True

    def uninstall(self, ring_id: int, reason: int) -> bool:
        self.calls.append("uninstall")
        return True

    def wake_fds(self, edge_id: int, ring_id: int, fds: tuple[int, int] | None) -> None:
        pass


class Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def test_stop_while_attach_is_in_flight_detaches_after_the_attach_and_uninstalls_after_the_install() -> None:
    async def main() -> None:
        arena, host = SlowAttachArena(), Host()
        outcomes: list[Any] = []
        tasks: set[asyncio.Task[Any]] = set()
        shell = EstablisherShell(arena, Driver(), host, outcomes.append,  # type: ignore[arg-type]
                                 lambda c: tasks.add(asyncio.ensure_future(c)), Log())
        edge = est.EdgeProvision(1, "Ingress", 9, 0, None, pb.RingSpec(data_capacity=3840, alignment=64))
        shell.handle(est.Provision(edge, 11))
        for _ in range(20):  # the lease is granted, the attach hangs
            await asyncio.sleep(0)
        assert arena.calls == ["lease"]
        shell.handle(est.StopEdge(1))  # the run ends while AttachRing is still in flight
        for _ in range(20):
            await asyncio.sleep(0)
        assert host.calls == [] and "release" not in arena.calls  # nothing overtakes the attach
        arena.attach_may_finish.set()
        while any(not t.done() for t in tasks):
            await asyncio.wait_for(asyncio.gather(*list(tasks)), 5)
        assert host.calls == ["install", "uninstall"]
        assert arena.calls == ["lease", "attach", "detach", "release"]
        assert arena.attached == set()
        assert est.EdgeStopped(1) in outcomes
        assert shell.core.state(1) is est.EdgeState.STOPPED

    asyncio.run(main())


class SlowEstablishDriver(Driver):
    """An edge-driver whose EstablishRecv answers only when the test says so; StopEdge of an edge it
    does not have answers "unknown" (the driver's own rule), else the pump stops."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.establish_may_finish = asyncio.Event()
        self.edges: set[int] = set()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def establish_recv(self, edge_id: int, tx_node_id: int, layout: Any) -> None:
        await self.establish_may_finish.wait()
        self.edges.add(edge_id)
        self.calls.append("establish")
        self.queue.put_nowait(est.DriverEdgeReady(edge_id, layout.ring_id))

    async def wake_fds(self, ring_id: int) -> None:
        return None

    async def stop_edge(self, edge_id: int, ring_id: int) -> bool:
        self.calls.append("stop" if edge_id in self.edges else "stop-unknown")
        if edge_id in self.edges:
            self.edges.discard(edge_id)
            self.queue.put_nowait(est.PumpStopped(edge_id, ring_id))
            return True
        return False

    async def events(self) -> AsyncIterator[Any]:
        while True:
            yield await self.queue.get()


def test_stop_while_establish_is_in_flight_stops_the_edge_the_driver_then_has() -> None:
    async def main() -> None:
        arena, driver, host = SlowAttachArena(), SlowEstablishDriver(), Host()
        arena.attach_may_finish.set()
        tasks: set[asyncio.Task[Any]] = set()
        shell = EstablisherShell(arena, driver, host, lambda a: None,  # type: ignore[arg-type]
                                 lambda c: tasks.add(asyncio.ensure_future(c)), Log())
        follow = asyncio.ensure_future(shell.follow_driver())
        edge = est.EdgeProvision(1, "Ingress", 9, 0, None, pb.RingSpec(data_capacity=3840, alignment=64))
        shell.handle(est.Provision(edge, 11))
        for _ in range(20):  # leased, attached, installed; EstablishRecv hangs at the driver
            await asyncio.sleep(0)
        assert shell.core.state(1) is est.EdgeState.WAITING_FOR_DRIVER
        shell.handle(est.StopEdge(1))
        for _ in range(20):
            await asyncio.sleep(0)
        assert driver.calls == []  # StopEdge waits for the EstablishRecv it would overtake
        driver.establish_may_finish.set()
        while shell.core.state(1) is not est.EdgeState.STOPPED:
            await asyncio.wait_for(asyncio.gather(*[t for t in tasks if not t.done()]), 5)
            await asyncio.sleep(0)
        assert driver.calls == ["establish", "stop"] and driver.edges == set()
        assert arena.calls == ["lease", "attach", "detach", "release"]
        follow.cancel()

    asyncio.run(main())


class SlowWakeFdsDriver(SlowEstablishDriver):
    """EstablishRecv answers at once (DriverEdgeReady follows); the pump's eventfds come when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.establish_may_finish.set()
        self.wake_fds_may_come = asyncio.Event()

    async def wake_fds(self, ring_id: int) -> None:
        await self.wake_fds_may_come.wait()
        return None


class RefusingHost(Host):
    def wake_fds(self, edge_id: int, ring_id: int, fds: tuple[int, int] | None) -> None:
        self.calls.append("wake_fds")
        raise ValueError("ring 7 is released")


def _shell_until_driver_ready(host: Host) -> tuple[EstablisherShell, SlowWakeFdsDriver, list[Any], set[Any]]:
    arena, driver = SlowAttachArena(), SlowWakeFdsDriver()
    arena.attach_may_finish.set()
    outcomes: list[Any] = []
    tasks: set[asyncio.Task[Any]] = set()
    shell = EstablisherShell(arena, driver, host, outcomes.append,  # type: ignore[arg-type]
                             lambda c: tasks.add(asyncio.ensure_future(c)), Log())
    tasks.add(asyncio.ensure_future(shell.follow_driver()))
    edge = est.EdgeProvision(1, "Ingress", 9, 0, None, pb.RingSpec(data_capacity=3840, alignment=64))
    shell.handle(est.Provision(edge, 11))
    return shell, driver, outcomes, tasks


def test_an_edge_is_ready_only_once_its_ring_host_holds_the_pumps_eventfds() -> None:
    """The driver says the edge is established before the ring host has the eventfds: not Ready yet, or the
    stage's first step would commit on eventfds the pump does not sleep on (a hung first token in CI)."""
    async def main() -> None:
        shell, driver, outcomes, tasks = _shell_until_driver_ready(Host())
        for _ in range(50):
            await asyncio.sleep(0)
        assert driver.calls == ["establish"] and shell.core.state(1) is est.EdgeState.WAITING_FOR_DRIVER
        assert not any(isinstance(o, est.EdgeReady) for o in outcomes)
        driver.wake_fds_may_come.set()
        for _ in range(50):
            await asyncio.sleep(0)
        assert shell.core.state(1) is est.EdgeState.READY and est.EdgeReady(1, 7) in outcomes
        for t in tasks:
            t.cancel()

    asyncio.run(main())


def test_a_ring_host_that_cannot_take_the_eventfds_fails_the_edge() -> None:
    async def main() -> None:
        host = RefusingHost()
        _shell, driver, outcomes, tasks = _shell_until_driver_ready(host)
        driver.wake_fds_may_come.set()
        for _ in range(50):
            await asyncio.sleep(0)
        failed = [o for o in outcomes if isinstance(o, est.EdgeFailed)]
        assert host.calls[:2] == ["install", "wake_fds"] and len(failed) == 1
        assert failed[0].reason == pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED
        assert "did not take them: ValueError: ring 7 is released" in failed[0].detail
        assert not any(isinstance(o, est.EdgeReady) for o in outcomes)
        for t in tasks:
            t.cancel()

    asyncio.run(main())
