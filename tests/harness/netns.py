"""Hosts in Linux network namespaces joined by one bridge, for multi-host tests on one machine.

    with NetnsCluster(5, prefix="memb") as cluster:
        proc = cluster.hosts[0].spawn(["swactor-membership", "--bind", f"{cluster.hosts[0].addr}:7946"])
        cluster.partition(cluster.hosts[2], direction="in")   # nft drop inside h2
        cluster.heal()

Layout: namespace `{name}-br` holds a bridge `br0`; namespace `{name}-h{i}` holds `eth0`, a veth
whose peer `v{i}` is a bridge port, addressed 10.77.X.(i+1)/24 where X is picked per cluster.
Nothing is created in the root namespace, so addresses never collide with the machine's own
networks or with another cluster, and traffic never leaves the namespaces this harness made.

`name` is `{prefix}{pid}-{4 hex}`, unique per process and cluster, so parallel runs never collide;
`cleanup_stale()` removes namespaces whose creating process is gone (a run killed with SIGKILL).
Cleanup on exit (also when the body raises) kills every process spawned or still running in the
namespaces, then deletes the namespaces, which deletes the veths and the bridge with them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

NETNS_DIR = "/run/netns"
_NAME_RE = re.compile(r"^(?P<prefix>[a-z]{1,8})(?P<pid>\d+)-(?P<tag>[0-9a-f]{4})-(?:br|h\d+)$")
_TABLE = "swharness"
Direction = Literal["in", "out", "both"]


class NetnsError(RuntimeError):
    """A namespace, link or firewall command failed; the message names the command."""


def _run(argv: Sequence[str], *, input: str | None = None, timeout: float = 10.0) -> str:
    try:
        done = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(argv)}` did not finish within {timeout} s") from None
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def netns_unavailable_reason() -> str | None:
    """Why this machine cannot run netns tests (not root, no `ip`/`nft`, no netns), or None."""
    if os.geteuid() != 0:
        return "netns tests need root (network namespaces, bridges and nft rules)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (install.sh installs iproute2 and nftables)"
    probe = f"swprobe{os.getpid()}-{secrets.token_hex(2)}-h0"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "exec", probe, "nft", "list", "ruleset"])
    except NetnsError as e:
        return f"network namespaces are unavailable here: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL whatever still runs inside `ns` (only processes a harness started live there)."""
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    for token in done.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(token), signal.SIGKILL)


def cleanup_stale() -> list[str]:
    """Delete harness namespaces whose creating process no longer exists; returns their names."""
    removed: list[str] = []
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return removed
    for ns in names:
        m = _NAME_RE.match(ns)
        if m is None or _pid_alive(int(m["pid"])):
            continue
        _kill_namespace_processes(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        removed.append(ns)
    return removed


@dataclass
class Host:
    """One host: a network namespace with one address on the cluster's bridge."""

    index: int
    ns: str
    addr: str
    processes: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: int | IO[Any] | None = None,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.Popen[Any]:
        """Start `argv` inside this host's namespace (via `ip netns exec`, which execs, so the
        returned pid is the program's own). `env` entries are added to the current environment.
        The process gets its own session; the cluster kills it on exit if it still runs."""
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *argv],
            env=full_env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            start_new_session=True,
        )
        self.processes.append(proc)
        return proc

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> str:
        """Run a short command inside the namespace and return its stdout; raises NetnsError."""
        return _run(["ip", "netns", "exec", self.ns, *argv], timeout=timeout)

    def _nft(self, script: str) -> None:
        _run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=script)


class NetnsCluster:
    """`n_hosts` namespaces on one bridge; a context manager that always cleans up."""

    def __init__(self, n_hosts: int, *, prefix: str = "swt") -> None:
        if not 1 <= n_hosts <= 200:
            raise ValueError(f"n_hosts must be 1..200, got {n_hosts}")
        if not re.fullmatch(r"[a-z]{1,8}", prefix):
            raise ValueError(f"prefix must be 1-8 lowercase letters, got {prefix!r}")
        self.name = f"{prefix}{os.getpid()}-{secrets.token_hex(2)}"
        self.subnet = f"10.77.{secrets.randbelow(254) + 1}"
        self.bridge_ns = f"{self.name}-br"
        self.hosts = [Host(i, f"{self.name}-h{i}", f"{self.subnet}.{i + 1}") for i in range(n_hosts)]
        self._created: list[str] = []
        self._closed = False

    # ---- lifecycle ----

    def __enter__(self) -> NetnsCluster:
        cleanup_stale()
        atexit.register(self.close)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        br = self.bridge_ns
        _run(["ip", "netns", "add", br])
        self._created.append(br)
        _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", br, "link", "set", "br0", "up"])
        for host in self.hosts:
            _run(["ip", "netns", "add", host.ns])
            self._created.append(host.ns)
            port = f"v{host.index}"
            _run(["ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.ns])
            _run(["ip", "-n", br, "link", "set", port, "master", "br0"])
            _run(["ip", "-n", br, "link", "set", port, "up"])
            _run(["ip", "-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", "eth0"])
            _run(["ip", "-n", host.ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", host.ns, "link", "set", "lo", "up"])
            host._nft(
                f"table inet {_TABLE} {{\n"
                "  chain input { type filter hook input priority 0; policy accept; }\n"
                "  chain output { type filter hook output priority 0; policy accept; }\n"
                "}\n"
            )

    def close(self) -> None:
        """Kill every process in the namespaces, then delete them (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        for host in self.hosts:
            for proc in host.processes:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
        for ns in reversed(self._created):
            _kill_namespace_processes(ns)
        for host in self.hosts:
            for proc in host.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        for ns in reversed(self._created):
            for _ in range(3):
                if subprocess.run(["ip", "netns", "del", ns], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
        self._created.clear()

    # ---- faults ----

    def block(self, src: Host, dst: Host) -> None:
        """Drop every packet `src` sends to `dst` (one direction; `dst` can still reach `src`)."""
        src._nft(f"add rule inet {_TABLE} output ip daddr {dst.addr} drop\n")

    def partition(self, host: Host, direction: Direction = "both") -> None:
        """Cut `host` off the bridge: "in" drops what it receives, "out" what it sends."""
        if direction not in ("in", "out", "both"):
            raise ValueError(f"direction must be 'in', 'out' or 'both', got {direction!r}")
        script = ""
        if direction in ("in", "both"):
            script += f"add rule inet {_TABLE} input iifname \"eth0\" drop\n"
        if direction in ("out", "both"):
            script += f"add rule inet {_TABLE} output oifname \"eth0\" drop\n"
        host._nft(script)

    def heal(self, host: Host | None = None) -> None:
        """Remove every block and partition (on `host` only, if given)."""
        for h in [host] if host is not None else self.hosts:
            h._nft(f"flush chain inet {_TABLE} input\nflush chain inet {_TABLE} output\n")

    def rules(self, host: Host) -> str:
        """The harness's nft table inside `host`, for test failure messages."""
        return host.run(["nft", "list", "table", "inet", _TABLE])
