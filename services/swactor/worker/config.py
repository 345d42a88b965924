"""[worker] table of /etc/swactor/swactor.toml."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swactor.common.config import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR


@dataclass
class WorkerConfig:
    # TCP listener of the node control API (stage.proto), mutual TLS.
    control_address: str = "0.0.0.0:7441"
    # host:port the orchestrator should dial (gossiped as control_endpoint); "" = control_address.
    advertise_control: str = ""
    # The only orchestrator node id allowed to provision this node; 0 = any holder of the secret.
    orchestrator_node_id: int = 0
    secret_file: Path = Path("/etc/swactor/cluster.secret")
    state_dir: Path = DEFAULT_STATE_DIR
    arena_socket: Path = DEFAULT_RUN_DIR / "arena.sock"
    arena_fd_socket: Path = DEFAULT_RUN_DIR / "arena-fd.sock"
    edge_socket: Path = DEFAULT_RUN_DIR / "edge.sock"
    edge_wake_socket: Path = DEFAULT_RUN_DIR / "edge-wake.sock"
    membership_socket: Path = DEFAULT_RUN_DIR / "membership.sock"
    # tinygrad device for the compute process ("" = tinygrad's default: CUDA/NV on GPU hosts).
    device: str = ""
    init_timeout_s: float = 120.0
    stop_timeout_s: float = 10.0
