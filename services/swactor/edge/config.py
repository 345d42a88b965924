"""EdgeConfig: the `[edge]` table of the host config, with CLI overrides (see main)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swactor.common import sockets
from swactor.common.config import DEFAULT_STATE_DIR

ALPN = "swactor/edge/1"


@dataclass(frozen=True)
class EdgeConfig:
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
    congestion_control: str = "reno"
    # ---- admission of new connections (admission.py, docs/edge.md "Hostile traffic") ----
    # QUIC Retry (address validation) for "non-members" (sources that are not a member's edge
    # endpoint address), "all", or "off".
    address_validation: str = "non-members"
    retry_token_lifetime: float = 10.0
    # Retry packets sent per second (burst): what a flood of junk Initials can make us answer.
    retry_rate: float = 1000.0
    retry_burst: float = 1000.0
    # New handshakes per second (burst) from validated strangers, and from members' addresses.
    handshake_rate: float = 50.0
    handshake_burst: float = 50.0
    member_handshake_rate: float = 100.0
    member_handshake_burst: float = 100.0
    # Admitted handshakes not yet completed, in total and per source address.
    max_half_open: int = 256
    max_half_open_per_source: int = 8
    # Under a flood of strangers' Initials (more per second than retry_rate), drop them in the
    # kernel (a socket filter; 1 in 16 still gets here) until flood_hold seconds below half of it.
    kernel_filter: bool = True
    flood_hold: float = 10.0
    # An accepted connection whose handshake is not done by then is dropped.
    handshake_timeout: float = 5.0
    # Refusals are logged as one `edge.admission_refused` summary per interval (with counts).
    refusal_log_interval: float = 10.0
    # Per-object pump timings (objtap.py) for WatchEdges(object_timings); flushed at most this often.
    object_timing: bool = True
    object_timing_flush_s: float = 0.02
    use_uvloop: bool = False
