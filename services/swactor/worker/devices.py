"""Several stage devices on one node (docs/operations.md "Several GPUs per host").

A host with several GPUs runs one StageNode per device: its own compute process pinned to that device, its own stage
controllers, step scheduler and edges, over the host's one arena and edge-driver. So one node can carry several
consecutive stages of a run; the edge between two of them stays in the host (the edge-driver's local link, no QUIC).

- `stage_device_names`: which tinygrad device each stage device computes on;
- `StageDevices`: the node's devices behind its one control API (the servicer asks it which StageNode a call is for);
- `DeviceMembership`: the node's one state in membership from its devices' states: Available once every device is,
  Faulted while any is (a host is offered whole: the planner numbers its devices 0..n-1 and may pick any of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from swactor.common.config import ConfigError
from swactor.v1 import common_pb2
from swactor.worker.host_metrics import StepTotals
from swactor.worker.membership import MembershipPort
from swactor.worker.node import StageNode
from swactor.worker.provisioning import ProvisionError
from swactor.worker.stage_memory import HOST_KINDS, NVIDIA_KINDS
from swactor.worker.step_speed import StepSpeed


def stage_device_names(device: str, count: int, gpus: int) -> list[str]:
    """The tinygrad device of each stage device. `device`: the compute device ([worker].device or detected: "CUDA",
    "CUDA:1", "CPU", ...); `count`: [worker].stage_devices (0 = one per GPU `gpus` counts when `device` is an NVIDIA
    kind without an index, else 1). Several devices of a GPU kind are its indices 0..count-1; on the CPU they share
    the host (several compute processes over its cores: a layout for tests and trials, not for speed)."""
    kind, _, index = device.upper().partition(":")
    if count < 0:
        raise ConfigError(f"[worker].stage_devices: must be >= 0 (0 = one per GPU), got {count}")
    if count == 0:
        count = gpus if kind in NVIDIA_KINDS and not index and gpus > 0 else 1
    if count == 1:
        return [device]
    if index:
        raise ConfigError(f"[worker].stage_devices = {count} with [worker].device = {device!r}: name the device kind "
                          f"alone (\"{kind}\"); its devices are then {kind}:0..{kind}:{count - 1}")
    if kind in HOST_KINDS:
        return [device] * count
    return [f"{device}:{i}" for i in range(count)]


@dataclass
class StageDevices:
    """The node's StageNodes, device index = list position, and the calls' routing between them."""

    nodes: Sequence[StageNode]
    steps: StepTotals = field(init=False)  # every device's completed steps (GetHostMetrics): the first device's counts
    # The host's one speed figure (gossiped per node, not per device): every device's decode steps feed the first's.
    speed: StepSpeed = field(init=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a node has at least one stage device")
        self.steps = self.nodes[0].steps
        self.speed = self.nodes[0].speed
        for node in self.nodes[1:]:
            node.steps = self.steps
            node.speed = self.speed

    @property
    def node_id(self) -> int:
        return self.nodes[0].node_id

    @property
    def available(self) -> bool:
        return all(node.available for node in self.nodes)

    def for_provision(self, device_index: int) -> StageNode:
        if device_index >= len(self.nodes):
            raise ProvisionError("INVALID_ARGUMENT", f"device_index {device_index}: this node has "
                                                     f"{len(self.nodes)} stage device(s) (0..{len(self.nodes) - 1})")
        return self.nodes[device_index]

    def holding(self, run_id: int, stage_index: int | None = None) -> list[StageNode]:
        """The devices holding the run's stage `stage_index` (None: any stage of the run), in device order."""
        return [node for node in self.nodes if (log := node.runs.get(run_id)) is not None
                and (stage_index is None or log.stage_index == stage_index)]

    def stop_run(self, run_id: int, stage_index: int | None = None) -> bool:
        held = self.holding(run_id, stage_index)
        for node in held:
            node.stop_run(run_id)
        return bool(held)

    def authorize(self, run_id: int, caller: int | None, stage_index: int | None = None) -> None:
        for node in self.holding(run_id, stage_index) or self.nodes[:1]:
            node.authorize(run_id, caller)

    def arena_lost(self, detail: str) -> None:
        for node in self.nodes:
            node.arena_lost(detail)

    @property
    def retired(self) -> bool:
        return all(node.retired.is_set() for node in self.nodes)


class DeviceMembership:
    """One MembershipPort per device over the node's real one: the node is said Available when every device is, and
    Faulted (with the first faulted device's reason) when any is. The worker generation said is the sum of the
    devices': it moves whenever any compute process restarts, which is what the orchestrator watches it for (§31)."""

    def __init__(self, port: MembershipPort, devices: int) -> None:
        self._port = port
        self._available: list[bool] = [False] * devices
        self._faulted: list[int | None] = [None] * devices
        self._generations: list[int] = [0] * devices
        self._endpoint = ""
        self._said: tuple[str, int, int] | None = None

    def device(self, index: int) -> MembershipPort:
        return _DevicePort(self, index)

    async def _set(self, index: int, endpoint: str, generation: int, fault: int | None) -> None:
        self._endpoint = endpoint or self._endpoint
        self._generations[index] = generation
        self._available[index] = fault is None
        self._faulted[index] = fault
        generation_sum = sum(self._generations)
        faults = [f for f in self._faulted if f is not None]
        if faults:
            state = ("faulted", faults[0], generation_sum)
        elif all(self._available):
            state = ("available", 0, generation_sum)
        else:
            return  # a device not yet ready: the node stays as it was said (Booting, or Faulted until all recover)
        if state == self._said:
            return
        self._said = state
        if faults:
            await self._port.set_faulted(faults[0], generation_sum)
        else:
            await self._port.set_available(self._endpoint, generation_sum)


@dataclass(frozen=True)
class _DevicePort:
    node: DeviceMembership
    index: int

    async def set_available(self, control_endpoint: str, worker_generation: int) -> None:
        await self.node._set(self.index, control_endpoint, worker_generation, None)

    async def set_faulted(self, reason: int, worker_generation: int) -> None:
        await self.node._set(self.index, "", worker_generation,
                             reason or common_pb2.RUN_FAULT_NODE_UNAVAILABLE)
