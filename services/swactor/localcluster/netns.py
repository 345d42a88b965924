"""Hosts in network namespaces for the local cluster (root only): namespace `{name}-br` holds a
bridge, namespace `{name}-h{i}` holds `eth0` (a veth into the bridge) with 10.78.X.(i+1)/24.
Nothing is created in the root namespace; `destroy()` kills what still runs inside and deletes the
namespaces (which deletes the veths and the bridge). `cleanup_stale()` removes namespaces of ours
whose creating process is gone; the pool's reaper (reaper.py) removes them as soon as it is gone."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
from collections.abc import Sequence

PREFIX = "swl"
_NAME_RE = re.compile(rf"^{PREFIX}(?P<pid>\d+)-[0-9a-f]{{4}}-(?:br|h\d+)$")


class NetnsError(RuntimeError):
    pass


def _ip(*argv: str, check: bool = True) -> str:
    try:
        done = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`ip {' '.join(argv)}` did not finish within 10 s") from None
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]



def cleanup_stale() -> None:
    for ns in namespaces():
        m = _NAME_RE.match(ns)
        if m and not os.path.exists(f"/proc/{m['pid']}"):
            remove(ns)


def remove(ns: str) -> None:
    """SIGKILL whatever runs inside `ns`, then delete it (a namespace outlives its name while a process is in it)."""
    for pid in _ip("netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", ns, check=False)


class Netns:
    def __init__(self, hosts: int) -> None:
        self.name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.subnet = f"10.78.{secrets.randbelow(250) + 1}"
        self.addrs = [f"{self.subnet}.{i + 1}" for i in range(hosts)]
        self.created: list[str] = []

    @staticmethod
    def available() -> str | None:
        """Why namespaces cannot be used here, or None."""
        if os.geteuid() != 0:
            return "not root"
        if shutil.which("ip") is None:
            return "`ip` (iproute2) is not installed"
        try:
            _ip("netns", "list")
        except (NetnsError, OSError) as e:
            return str(e)
        return None

    def host(self, i: int) -> str:
        return f"{self.name}-h{i}"

    def exec_prefix(self, i: int) -> Sequence[str]:
        return ["ip", "netns", "exec", self.host(i)]

    def create(self) -> None:
        cleanup_stale()
        br = f"{self.name}-br"
        try:
            self._add(br)
            _ip("-n", br, "link", "add", "br0", "type", "bridge")
            _ip("-n", br, "link", "set", "br0", "up")
            for i, addr in enumerate(self.addrs):
                self._plug(i, addr)
        except BaseException:
            self.destroy()
            raise

    def _plug(self, i: int, addr: str) -> None:
        ns, br = self.host(i), f"{self.name}-br"
        self._add(ns)
        _ip("link", "add", f"v{i}", "netns", br, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", br, "link", "set", f"v{i}", "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def add_host(self) -> int:
        """One more namespace on the bridge that is not a cluster host (no services, not a member):
        an outsider, e.g. the source of hostile traffic in tests. Its index (for exec_prefix)."""
        i = len(self.addrs)
        self.addrs.append(f"{self.subnet}.{i + 1}")
        self._plug(i, self.addrs[i])
        return i

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.created.append(ns)

    def destroy(self) -> None:
        for ns in reversed(self.created):
            remove(ns)
        self.created = []

    def remaining(self) -> list[str]:
        return [ns for ns in namespaces() if ns.startswith(self.name)]
