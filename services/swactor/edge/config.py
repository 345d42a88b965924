"""EdgeConfig: the `[edge]` table of the host config, with CLI overrides (see main)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swactor.common import sockets
from swactor.common.config import DEFAULT_STATE_DIR
from swactor.edge.admission import AdmissionLimits
from swactor.edge.congestion import ALGORITHMS, CONGESTION_CONTROL

ALPN = "swactor/edge/1"


@dataclass(frozen=True)
class EdgeConfig(AdmissionLimits):
    """The `[edge]` table; the admission keys (admission.AdmissionLimits, docs/edge.md "Hostile traffic") come first."""

    # UDP address of the host's one QUIC endpoint.
    bind: str = "0.0.0.0:7400"
    socket: Path = sockets.EDGE
    state_dir: Path = DEFAULT_STATE_DIR
    # PEM files; default `<state_dir>/edge/cert.pem` and `key.pem` (created by --init-identity).
    cert: Path | None = None
    key: Path | None = None
    # Where peers come from: "membership" (gRPC socket below) or a static TOML file (tests, demo).
    membership_socket: Path = sockets.MEMBERSHIP
    peers_file: Path | None = None
    # Arena-manager sockets: gRPC (AttachRing/DetachRing) and the memfd hand-out.
    arena_socket: Path = sockets.ARENA
    arena_fd_socket: Path = sockets.ARENA_FD
    # Where the ring's other process fetches the wake eventfds of a pumped ring (wakefd.py).
    wake_socket: Path = sockets.EDGE_WAKE
    # host:port peers should dial (gossiped); empty = the bound address.
    advertise: str = ""
    # QUIC payload bytes per datagram; 0 = what the path allows (route MTU minus IP/UDP headers).
    max_datagram_size: int = 0
    # Upper bound for the automatic size (aioquic's cost is per packet; see docs/edge.md).
    max_datagram_size_auto_cap: int = 65507
    # Receive credit one edge stream may hold beyond what its ring has absorbed (bytes).
    stream_window: int = 4 << 20
    # Credit of a stream whose edge is not established here yet (before rendezvous).
    initial_stream_window: int = 256 << 10
    # Bytes a send-pump may have queued in QUIC (unsent + unacknowledged) per edge.
    send_queue_limit: int = 4 << 20
    # Connection-wide receive credit beyond bytes consumed.
    connection_window: int = 32 << 20
    # Concurrent uni-streams a peer may open (bounds memory of unmatched streams).
    max_streams: int = 64
    # A peer silent this long is dead (keepalives keep live quiet connections under it).
    idle_timeout: float = 3.0
    keepalive_interval: float = 0.5
    connect_timeout: float = 5.0
    # A stream that carries no locally established edge for this long is stopped with a fault.
    rendezvous_timeout: float = 30.0
    # "loss_tolerant" (congestion.py: a loss that comes without queueing does not cut the window; Reno's halving when
    # it does), or aioquic's "reno" or "cubic" (docs/edge.md "Congestion control").
    congestion_control: str = CONGESTION_CONTROL
    # An accepted connection whose handshake is not done by then is dropped.
    handshake_timeout: float = 5.0
    # Refusals are logged as one `edge.admission_refused` summary per interval (with counts).
    refusal_log_interval: float = 10.0
    # Per-object pump timings (objtap.py) for WatchEdges(object_timings); flushed at most this often.
    object_timing: bool = True
    object_timing_flush_s: float = 0.02
    use_uvloop: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.congestion_control not in ALGORITHMS:
            raise ValueError(f"congestion_control must be one of {', '.join(ALGORITHMS)}, "
                             f"got {self.congestion_control!r}")
