"""The asyncio shell of restart reconciliation (reconcile.py): StopRun / WatchStage to the nodes,
StopEdge to this host's edge-driver, arena Stats to confirm, events into the run store.

`ReconcileShell.on_view` is the orchestrator's membership callback while it runs: it feeds the core
and publishes the view with still-busy nodes masked as Booting, so a new run waits for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.common.grpcio import response_stream
from swactor.orchestrator.fleet import reconcile as R
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.runs.store import RunStore
from swactor.v1 import arena_pb2, arena_pb2_grpc, stage_pb2, stage_pb2_grpc

CALL_TIMEOUT_S = 5.0
# The dead process's token rings go back to the arena when the edge-driver detaches its stopped pumps,
# which it does asynchronously after StopEdge returns; the arena has no change stream, so the shell
# re-reads its Stats a few times (0.1 s doubling, `settle_s` in all) before naming a lease as left.
SETTLE_S = 5.0
ORCHESTRATOR_REQUESTER = "orchestrator"
log = get_logger(component="reconcile")


class ControlPort(Protocol):
    """The run's stage is named by its index: a node with several stage devices may hold several stages of it."""

    async def stop_run(self, node: NodeInfo, run_id: int, stage_index: int) -> bool:
        """StopRun of the stage on the node: `known`. Raises when the node does not answer."""

    async def wait_stopped(self, node: NodeInfo, run_id: int, stage_index: int) -> None:
        """Returns once the node reports the stage's StageStopped (or no longer knows it); raises otherwise."""


class LocalPort(Protocol):
    async def orphans(self) -> tuple[int, ...]:
        """Edges of arena leases whose owner, an orchestrator process, is gone."""

    async def release_edges(self, edge_ids: tuple[int, ...]) -> str:
        """Stop these edges on the local edge-driver; "" once no arena lease of them is left, else what is."""


class MtlsControl:
    """ControlPort over stage.proto with the orchestrator's mutual-TLS identity."""

    def __init__(self, channel: Callable[[NodeInfo], grpc.aio.Channel]) -> None:
        self._channel = channel

    async def stop_run(self, node: NodeInfo, run_id: int, stage_index: int) -> bool:
        request = stage_pb2.StopStageRunRequest(run_id=run_id, stage_index=stage_index)
        async with self._channel(node) as ch:
            resp = await stage_pb2_grpc.StageControlStub(ch).StopRun(request, timeout=CALL_TIMEOUT_S)
        return bool(resp.known)

    async def wait_stopped(self, node: NodeInfo, run_id: int, stage_index: int) -> None:
        request = stage_pb2.WatchStageRequest(run_id=run_id, stage_index=stage_index)
        async with self._channel(node) as ch:
            try:
                call = stage_pb2_grpc.StageControlStub(ch).WatchStage(request)
                async with response_stream(call) as updates:
                    async for update in updates:
                        if update.HasField("stopped"):
                            return
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:  # forgotten there: nothing of it is left
                    return
                raise
        raise ConnectionError("WatchStage ended before StageStopped")


class LocalEdges:
    """LocalPort over this host's edge-driver (DriverPort) and arena-manager Stats (its Unix socket)."""

    def __init__(self, driver, arena_socket) -> None:  # type: ignore[no-untyped-def]
        self.driver = driver
        self.arena_socket = arena_socket

    async def _leases(self) -> list[arena_pb2.ArenaLeaseInfo]:
        from swactor.common.grpcio import unix_target

        async with grpc.aio.insecure_channel(unix_target(self.arena_socket)) as ch:
            stats = await arena_pb2_grpc.ArenaManagerStub(ch).Stats(arena_pb2.ArenaStatsRequest(), timeout=CALL_TIMEOUT_S)
        return list(stats.leases)

    async def orphans(self) -> tuple[int, ...]:
        """Edges of arena leases a dead orchestrator process owned (its owner hold is gone, a pump still holds them)."""
        return tuple(sorted({le.edge_id for le in await self._leases()
                             if le.requester == ORCHESTRATOR_REQUESTER and not le.owner_holds and le.edge_id}))

    async def release_edges(self, edge_ids: tuple[int, ...]) -> str:
        # The dead orchestrator's ends only, by their rings: a stage of this host may hold the
        # other end of the same edge (the token edge into a co-located first stage).
        for le in await self._leases():
            if le.edge_id in edge_ids and le.requester == ORCHESTRATOR_REQUESTER:
                await self.driver.stop_edge(le.edge_id, le.ring_id)
        delay, waited = 0.1, 0.0
        while True:
            left = [le for le in await self._leases()
                    if le.edge_id in edge_ids and le.requester == ORCHESTRATOR_REQUESTER]
            if not left or waited >= SETTLE_S:
                break
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, SETTLE_S - waited) or 0.1
        return "; ".join(f"ring {le.ring_id} of edge {le.edge_id} still leased (owner holds: {le.owner_holds}, "
                         f"attached holders: {list(le.attached_holder_ids)})" for le in left)


@dataclass(eq=False)
class ReconcileShell:
    core: R.Reconciler
    control: ControlPort
    local: LocalPort
    store: RunStore
    publish: Callable[[tuple[NodeInfo, ...]], None]
    clock: Callable[[], float] = time.monotonic
    inputs: asyncio.Queue[R.Input] = field(default_factory=asyncio.Queue, init=False)
    view: tuple[NodeInfo, ...] = field(default=(), init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def on_view(self, members: tuple[NodeInfo, ...]) -> None:
        self.view = tuple(members)
        self.inputs.put_nowait(R.View(self.view))
        self.publish(self.core.mask_view(self.view))

    async def run(self) -> None:
        """Until every leftover run is torn down (or given up on, by name)."""
        started = self.clock()
        log.info("reconcile_started", runs=[r.run_id for r in self.core.leftovers])
        try:
            self._step(R.Tick())
            while not self.core.done:
                deadline = self.core.deadline()
                timeout = None if deadline is None else max(0.0, deadline - self.clock())
                try:
                    inp = await asyncio.wait_for(self.inputs.get(), timeout)
                except TimeoutError:
                    inp = R.Tick()
                self._step(inp)
        finally:
            for task in list(self._tasks):
                task.cancel()
            self.publish(self.core.mask_view(self.view))
        log.info("reconcile_done", seconds=round(self.clock() - started, 3))

    def _step(self, inp: R.Input) -> None:
        for action in self.core.handle(inp, self.clock()):
            match action:
                case R.SendStopRun(run_id, index, node):
                    self._spawn(self._stop(run_id, index, node))
                case R.WatchUntilStopped(run_id, index, node):
                    self._spawn(self._confirm(run_id, index, node))
                case R.ReleaseLocal(run_id, edge_ids):
                    self._spawn(self._release(run_id, edge_ids))
                case R.Emit(event):
                    event.time_us = event.time_us or wall_us()
                    self.store.append(event.run_id, [event])
                    if event.kind == R.K.RUN_TORN_DOWN:
                        self._mark_torn_down(event.run_id, event.time_us)
                case R.ViewChanged():
                    self.publish(self.core.mask_view(self.view))

    def _mark_torn_down(self, run_id: int, time_us: int) -> None:
        run = self.store.get(run_id)
        if run is not None and not run.torn_down_us:
            run.torn_down_us = time_us
            self.store.put(run)

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop(self, run_id: int, index: int, node: NodeInfo) -> None:
        try:
            known = await self.control.stop_run(node, run_id, index)
        except Exception as e:
            self.inputs.put_nowait(R.StopFailed(run_id, index, f"StopRun on node {node.node_id}: {_name(e)}"))
            return
        self.inputs.put_nowait(R.StopAnswered(run_id, index, known))

    async def _confirm(self, run_id: int, index: int, node: NodeInfo) -> None:
        try:
            await self.control.wait_stopped(node, run_id, index)
        except Exception as e:
            self.inputs.put_nowait(R.ConfirmLost(run_id, index, f"WatchStage on node {node.node_id}: {_name(e)}"))
            return
        self.inputs.put_nowait(R.StageStoppedSeen(run_id, index))

    async def _release(self, run_id: int, edge_ids: tuple[int, ...]) -> None:
        try:
            orphans = await self.local.orphans()
            left = await self.local.release_edges(tuple(sorted(set(edge_ids) | set(orphans))))
        except Exception as e:
            left = f"edge-driver / arena-manager unreachable: {_name(e)}"
        self.inputs.put_nowait(R.LocalReleased(run_id, left))


def _name(e: BaseException) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"



def start(leftovers: list[R.Leftover], *, secret: bytes, node_id: int, edge_socket, edge_wake_socket,  # type: ignore[no-untyped-def]
          arena_socket, store: RunStore, publish: Callable[[tuple[NodeInfo, ...]], None],
          confirm_timeout_s: float, keepalive_s: float) -> tuple[Callable[[tuple[NodeInfo, ...]], None],
                                                                asyncio.Task[None] | None]:
    """The membership callback to use (masking while reconciling) and the reconciliation task (None
    when the previous process left nothing in flight)."""
    if not leftovers:
        return publish, None
    from swactor.common import control_tls
    from swactor.edgeend.adapters import EdgeDriverPort

    def channel(node: NodeInfo) -> grpc.aio.Channel:
        return control_tls.channel(secret, node_id, node.control_endpoint, node.node_id, keepalive_s=keepalive_s)

    driver = EdgeDriverPort(edge_socket, edge_wake_socket)
    shell = ReconcileShell(R.Reconciler(tuple(leftovers), confirm_timeout_s=confirm_timeout_s), MtlsControl(channel),
                           LocalEdges(driver, arena_socket), store, publish)

    async def run() -> None:
        async with driver:
            await shell.run()

    def on_view(members: tuple[NodeInfo, ...]) -> None:
        if shell.core.done:
            publish(members)
        else:
            shell.on_view(members)

    def finished(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug here must not pass in silence
            log.error("reconcile_failed", detail=repr(task.exception()))
            publish(shell.view)

    task = asyncio.create_task(run(), name="reconcile")
    task.add_done_callback(finished)
    return on_view, task
