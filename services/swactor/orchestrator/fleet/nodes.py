"""The orchestrator's view of one member node (fed by the membership service's WatchMembers)."""

from __future__ import annotations

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
    # Device memory a stage may use there, as its worker advertised it with NodeAvailable; 0 = not advertised.
    memory_bytes: int = 0
    # Why the orchestrator's host does not (yet) reach an endpoint it advertises ("" = it does; fleet/reach.py).
    unreachable: str = ""

    @property
    def provisionable(self) -> bool:
        """Available, carrying the endpoint material edges and provisioning need (spec §9), and reachable there."""
        return (self.state is NodeState.AVAILABLE and bool(self.edge_endpoint) and bool(self.control_endpoint)
                and not self.unreachable)
