"""`[gateway]`: where the OpenAI-compatible HTTP API listens and what it lets in."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from swactor.common import sockets
from swactor.common.config import ConfigError

DEFAULT_TOKEN_FILE = Path("/etc/swactor/gateway/token")


@dataclass
class GatewayConfig:
    # "host:port". Loopback by default: the network reaches it only when the operator says so, and then only with
    # TLS (tls_cert, tls_key).
    address: str = "127.0.0.1:8000"
    orchestrator_socket: Path = sockets.ORCHESTRATOR
    # The bearer token every request but /health must carry (one line, 0600), as the orchestrator's TCP API.
    token_file: Path = DEFAULT_TOKEN_FILE
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # The largest request body accepted, in bytes (413 beyond it, before it is parsed).
    max_request_bytes: int = 1 << 20
    # Requests answered at once (streaming or not, queued in the pool or decoding); one more is refused 429.
    max_concurrent: int = 256
    # Seconds a stream waits for a slow reader to take one chunk before it drops the client (and stops its run).
    send_timeout_s: float = 60.0

    def host_port(self) -> tuple[str, int]:
        host, sep, port = self.address.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536 or not host:
            raise ConfigError(f"[gateway].address must be HOST:PORT, got {self.address!r}")
        return host.strip("[]"), int(port)

    def check(self) -> None:
        host, _ = self.host_port()
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("[gateway].tls_cert and tls_key go together: set both or neither")
        if self.tls_cert is None and not is_loopback(host):
            raise ConfigError(f"[gateway].address {self.address} is reachable from the network: it serves only TLS, "
                              "set tls_cert and tls_key (or listen on 127.0.0.1)")
        for key in ("max_request_bytes", "max_concurrent"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[gateway].{key} must be positive, got {getattr(self, key)}")
        if not self.send_timeout_s > 0:
            raise ConfigError(f"[gateway].send_timeout_s must be > 0, got {self.send_timeout_s}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
