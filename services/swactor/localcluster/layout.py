"""Where each simulated host keeps its state, sockets and ports, and the TOML config it gets.

Pure: builds paths and config tables from the cluster spec; nothing is created here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Every simulated host has its own address, so all of them use the services' usual ports.
MEMBERSHIP_PORT, EDGE_PORT, CONTROL_PORT = 7946, 7400, 7441
# The orchestrator's model server (host 0): the other hosts fetch their weight ranges from it.
MODEL_PORT = 7442
# The address plan: host i is X.Y.Z.(i+1) in one /24 (a loopback block 127.X.Y.0, or the namespaces' bridge subnet),
# and .254 stays free for one outsider (a test's hostile peer, Netns.add_host).
MAX_HOSTS = 253


@dataclass(frozen=True)
class HostLayout:
    index: int
    addr: str  # IP the host's services bind (a loopback address, or the namespace's veth address)
    root: Path
    netns: str | None = None

    @property
    def name(self) -> str:
        return f"h{self.index}"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def config_path(self) -> Path:
        return self.root / "swactor.toml"

    def sock(self, name: str) -> Path:
        return self.run_dir / f"{name}.sock"

    @property
    def edge_cert(self) -> Path:
        return self.state_dir / "edge" / "cert.pem"

    def endpoint(self, port: int) -> str:
        return f"{self.addr}:{port}"

    def public(self, port: int, offset: int) -> str:
        """Where other hosts reach `port`: `offset` above it when the host is behind NAT (nat.py), else itself."""
        return f"{self.addr}:{port + offset}"


def host_config(h: HostLayout, *, seeds: list[str], secret_file: Path, device: str, ceiling_bytes: int, gpu: str,
                orchestrator: dict[str, Any] | None, compute_threads: int = 0,
                memory_bytes: int = 0, public_offset: int = 0) -> dict[str, dict[str, Any]]:
    """One host's swactor.toml as tables (every service reads its own table). `memory_bytes`: the stage memory
    its worker advertises (0 = measured); `public_offset`: every service advertises its port this much higher (a
    host behind NAT, nat.py)."""
    off = public_offset
    common = {"arena_socket": str(h.sock("arena")), "arena_fd_socket": str(h.sock("arena-fd"))}
    cfg: dict[str, dict[str, Any]] = {
        "arena": {"socket": str(h.sock("arena")), "fd_socket": str(h.sock("arena-fd")),
                  "state_dir": str(h.state_dir), "ceiling_bytes": ceiling_bytes},
        "membership": {
            "socket": str(h.sock("membership")), "state_dir": str(h.state_dir),
            "bind": h.endpoint(MEMBERSHIP_PORT), "advertise": h.public(MEMBERSHIP_PORT, off),
            "seeds": seeds, "secret_file": str(secret_file), "cluster": "swactor-local",
            "edge_endpoint": h.public(EDGE_PORT, off), "edge_cert": str(h.edge_cert),
            "control_endpoint": h.public(CONTROL_PORT, off),
            "gpus": [gpu], "gpu_autodetect": False,
            "probe_interval_s": 0.5, "probe_timeout_s": 0.25, "join_retry_interval_s": 0.5,
            "leave_timeout_s": 1.0,
        },
        "edge": {**common, "bind": h.endpoint(EDGE_PORT), "advertise": h.public(EDGE_PORT, off),
                 "socket": str(h.sock("edge")),
                 "state_dir": str(h.state_dir), "membership_socket": str(h.sock("membership")),
                 "wake_socket": str(h.sock("edge-wake"))},
        "worker": {**common, "control_address": h.endpoint(CONTROL_PORT),
                   "advertise_control": h.public(CONTROL_PORT, off), "secret_file": str(secret_file),
                   "state_dir": str(h.state_dir), "edge_socket": str(h.sock("edge")),
                   "edge_wake_socket": str(h.sock("edge-wake")), "membership_socket": str(h.sock("membership")),
                   "device": device, "compute_threads": compute_threads, "memory_bytes": memory_bytes},
    }
    if orchestrator is not None:
        cfg["orchestrator"] = {
            **common, "socket": str(h.sock("orchestrator")), "tcp_address": "", "state_dir": str(h.state_dir),
            "membership_socket": str(h.sock("membership")), "secret_file": str(secret_file),
            "edge_socket": str(h.sock("edge")), "edge_wake_socket": str(h.sock("edge-wake")),
            "model_server_address": h.endpoint(MODEL_PORT), "model_server_advertise": h.public(MODEL_PORT, off),
            **orchestrator,
        }
    return cfg


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        # A TOML basic string takes JSON's escapes; DEL must be escaped too (paths may hold any character).
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(tables: dict[str, dict[str, Any]]) -> str:
    out: list[str] = []
    for name, table in tables.items():
        out.append(f"[{name}]")
        out.extend(f"{k} = {_toml_value(v)}" for k, v in table.items())
        out.append("")
    return "\n".join(out)
