"""MembershipConfig: the [membership] table of /etc/swactor/swactor.toml, with CLI overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from swactor.common import sockets
from swactor.common.config import DEFAULT_STATE_DIR

DEFAULT_SOCKET = sockets.MEMBERSHIP
DEFAULT_SECRET_FILE = Path("/etc/swactor/cluster.secret")
DEFAULT_GOSSIP_PORT = 7946


@dataclass
class MembershipConfig:
    """Every setting of the membership service. Timing defaults are a LAN profile (1 s probes)."""

    socket: Path = DEFAULT_SOCKET
    state_dir: Path = DEFAULT_STATE_DIR
    # host:port of the gossip socket (UDP, plus TCP for push-pull state sync).
    bind: str = f"0.0.0.0:{DEFAULT_GOSSIP_PORT}"
    # host:port peers should use to reach us; default: `bind` when its host is not a wildcard.
    advertise: str | None = None
    seeds: list[str] = field(default_factory=list)
    # Gossip is bound to this label: nodes of another cluster ignore ours.
    cluster: str = "swactor"
    # File holding the cluster secret (any bytes; surrounding whitespace is ignored).
    secret_file: Path | None = DEFAULT_SECRET_FILE
    # Failure detection (SWIM + Lifeguard).
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 0.5
    indirect_checks: int = 3
    # Suspicion timeout = suspicion_mult x max(1, log10 n) x probe interval once enough independent
    # confirmations arrived, up to suspicion_max_mult times that with none.
    suspicion_mult: int = 3
    suspicion_max_mult: int = 4
    expected_confirmations: int = 2
    # Lifeguard local health: at most this many probe intervals added to our own timeouts.
    awareness_max: int = 8
    gossip_interval_s: float = 0.2
    gossip_nodes: int = 3
    retransmit_mult: int = 4
    push_pull_interval_s: float = 30.0
    # Round-trip times to every peer (rtt.py) are sampled and broadcast this often; 0 turns them off.
    rtt_interval_s: float = 2.0
    # While this node knows no live peer, it retries the seeds this often.
    join_retry_interval_s: float = 2.0
    # Dead and left members stay listed (include_departed) this long.
    departed_retention_s: float = 600.0
    # On SIGTERM, wait at most this long for the leave to spread.
    leave_timeout_s: float = 3.0
    # Gossiped metadata.
    software_version: str | None = None
    edge_endpoint: str = ""
    edge_cert: Path | None = None
    edge_cert_fingerprint: str = ""
    control_endpoint: str = ""
    # "KIND:NAME:MEMORY_BYTES" entries; when empty and gpu_autodetect, nvidia-smi is asked.
    gpus: list[str] = field(default_factory=list)
    gpu_autodetect: bool = True
