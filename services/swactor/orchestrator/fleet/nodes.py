"""The orchestrator's view of one member node (fed by the membership service's WatchMembers)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field


class NodeState(enum.Enum):
    BOOTING = "booting"
    AVAILABLE = "available"
    SUSPECT = "suspect"
    FAULTED = "faulted"
    LEFT = "left"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    kind: str  # tinygrad device kind: CUDA, NV, AMD, CPU, ...
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class NodeInfo:
    node_id: int
    state: NodeState
    # Where the node's edge-driver accepts QUIC (host:port) and its node control gRPC listens.
    edge_endpoint: str = ""
    control_endpoint: str = ""
    edge_cert_fingerprint: str = ""
    hostname: str = ""
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)
    reason: str = ""
    epoch: int = 0  # which run of the node's membership process (higher after a restart)
    worker_generation: int = 0  # §31: its GPU worker's generation (0 = not reported)
    # Device memory a stage may use there, as its worker advertised it with NodeAvailable; 0 = not advertised. With
    # several stage devices, the memory of each one.
    memory_bytes: int = 0
    # Stage devices its worker runs (one stage controller and compute process each): the node can carry that many
    # stages of one run (NodeMetadata.stage_devices; not advertised = 1).
    devices: int = 1
    # Its measured compute speed: ms per layer of a one-row decode step (NodeMetadata.step_us_per_layer); 0 = not
    # measured yet. Placement gives a slower host fewer layers by it.
    ms_per_layer: float = 0.0
    # Which of them this NodeInfo stands for when it is a placement unit (`units`): a stage's device on its node.
    device: int = 0
    # Why the orchestrator's host does not (yet) reach an endpoint it advertises ("" = it does; fleet/reach.py).
    unreachable: str = ""

    @property
    def unit(self) -> tuple[int, int]:
        """The placement unit's key: (node id, device). Two stages of one run never share one."""
        return (self.node_id, self.device)

    @property
    def where(self) -> str:
        """The unit for people: "node 7", or "node 7 device 1" on a node with several stage devices."""
        return f"node {self.node_id} device {self.device}" if self.devices > 1 else f"node {self.node_id}"

    def units(self) -> tuple[NodeInfo, ...]:
        """The node as placement units: one per stage device, in device order."""
        return tuple(dataclasses.replace(self, device=d) for d in range(max(1, self.devices)))

    @property
    def provisionable(self) -> bool:
        """Available, carrying the endpoint material edges and provisioning need (spec §9), and reachable there."""
        return (self.state is NodeState.AVAILABLE and bool(self.edge_endpoint) and bool(self.control_endpoint)
                and not self.unreachable)
