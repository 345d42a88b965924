"""`[orchestrator]` settings (one table of /etc/swactor/swactor.toml); CLI flags override them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from swactor.common import sockets
from swactor.common.config import DEFAULT_STATE_DIR, ConfigError

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_MODEL_DIR = Path(__file__).resolve().parents[3] / ".cache" / "models"


@dataclass
class OrchestratorConfig:
    socket: Path = sockets.ORCHESTRATOR
    # The TCP API ("host:port"), off by default ("": the Unix socket only). When set it serves TLS
    # with tls_cert/tls_key and refuses calls without the bearer token from token_file (0600), see
    # api_access.py; `swactor-orchestrator --init-api-access` makes all three.
    tcp_address: str = ""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    token_file: Path | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    membership_socket: Path = sockets.MEMBERSHIP
    model_name: str = DEFAULT_MODEL_NAME
    # None: <state_dir>/models/<file>, else the repository's .cache/models/<file>.
    model_path: Path | None = None
    # More models as "name=/path/to/model.gguf".
    models: list[str] = field(default_factory=list)
    # The cluster secret: the node control API's mutual TLS derives from it. None = provisioning
    # is not possible (runs fault with RUN_FAULT_PROVISIONING_REJECTED, saying so).
    secret_file: Path | None = None
    # Where the nodes find the default model's GGUF (absolute, node-local); None = model_path.
    node_model_path: Path | None = None
    # The local arena-manager and edge-driver the token endpoints use (this host is a node too).
    arena_socket: Path = sockets.ARENA
    arena_fd_socket: Path = sockets.ARENA_FD
    edge_socket: Path = sockets.EDGE
    edge_wake_socket: Path = sockets.EDGE_WAKE
    default_stages: int = 1
    max_seq_len: int = 4096
    ring_ceiling_bytes: int = 4 << 20
    pool_window_s: float = 2.0
    pool_timeout_s: float = 60.0
    readiness_timeout_s: float = 600.0
    first_token_timeout_s: float = 300.0
    step_timeout_s: float = 60.0
    teardown_timeout_s: float = 30.0

    def model_paths(self) -> dict[str, Path]:
        default = self.model_path
        if default is None:
            candidates = [self.state_dir / "models" / DEFAULT_MODEL_FILE, REPO_MODEL_DIR / DEFAULT_MODEL_FILE]
            default = next((c for c in candidates if c.exists()), candidates[0])
        paths = {self.model_name: default}
        for entry in self.models:
            name, sep, path = entry.partition("=")
            if not sep or not name or not path:
                raise ConfigError(f"[orchestrator].models: {entry!r} is not 'name=/path/to/model.gguf'")
            paths[name] = Path(path)
        return paths
