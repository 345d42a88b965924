"""The stage node's view of its GpuWorkerCtl (ctl.py) and the ring host it makes of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from swactor.common.events import get_logger
from swactor.common.layout import Layout
from swactor.edgeend import establisher as est
from swactor.worker.ctl_fsm import CtlState
from swactor.worker.process import wire


class WorkerCtlLike(Protocol):
    @property
    def state(self) -> CtlState: ...

    @property
    def worker_generation(self) -> int: ...

    def start(self) -> None: ...

    def send(self, command: wire.Command) -> None: ...

    def share_wake_fds(self, ring_id: int, readable_fd: int, writable_fd: int) -> bool: ...

    def subscribe(self, fn: Callable[[Any], None]) -> None: ...


class WorkerRingHost:
    """The ring host of a stage node: its GPU worker process, which reports RingInstalled /
    RingFault / RingQuiesced itself (StageNode._on_worker)."""

    def __init__(self, ctl: WorkerCtlLike) -> None:
        self.ctl = ctl

    def install(self, edge: est.EdgeProvision, layout: Layout) -> bool:
        self.ctl.send(wire.InstallRing(layout.ring_id, edge.edge_id, edge.port_id, edge.direction, layout,
                                       edge.object_spec))
        return False

    def uninstall(self, ring_id: int, reason: int) -> bool:
        self.ctl.send(wire.UninstallRing(ring_id, reason))
        return False

    def wake_fds(self, edge_id: int, ring_id: int, fds: tuple[int, int] | None) -> None:
        if fds is not None and not self.ctl.share_wake_fds(ring_id, *fds):
            # the process then learns of the ring's progress only from its own periodic look (loop.WAKE_CHECK_S)
            get_logger(component="stage_node").warning("worker_wake_fds_not_shared", edge_id=edge_id, ring_id=ring_id,
                                                       ctl_state=self.ctl.state.value)
