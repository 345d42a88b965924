"""A CPU quota for some of the machine's processes: a cgroup whose tasks together get at most `share` of one CPU
(cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us`), so a test can make one local host really slower than the others.
Root only; `unavailable()` says why not here."""

from __future__ import annotations

import contextlib
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _v2() -> bool:
    return (ROOT / "cgroup.controllers").exists()


def _base() -> Path:
    """Where the cpu controller's cgroups are made: the v2 root, or the v1 cpu hierarchy."""
    return ROOT if _v2() else ROOT / "cpu"


def unavailable() -> str | None:
    """Why no CPU quota can be set here (None: it can)."""
    base = _base()
    if _v2():
        if "cpu" not in (ROOT / "cgroup.controllers").read_text().split():
            return "cgroup v2 without the cpu controller"
    elif not (base / "cpu.cfs_quota_us").exists():
        return "no cgroup cpu controller mounted at /sys/fs/cgroup/cpu"
    probe = base / f"swactor-quota-probe-{id(base)}"
    try:
        probe.mkdir()
    except OSError as e:
        return f"cannot make a cgroup under {base}: {e.strerror}"
    probe.rmdir()
    return None


class CpuQuota:
    """A cgroup whose processes share at most `share` of one CPU (0 < share <= 64). Processes are moved in with
    `add`; `close` moves any left back to the root cgroup and removes it."""

    def __init__(self, name: str, share: float) -> None:
        if not 0 < share <= 64:
            raise ValueError(f"share must be in (0, 64] CPUs, got {share}")
        self.path = _base() / name
        self.path.mkdir()
        quota = max(1000, round(share * PERIOD_US))
        if _v2():
            with contextlib.suppress(OSError):  # already enabled (or enabled by the system): the write is refused
                (ROOT / "cgroup.subtree_control").write_text("+cpu")
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        """Move the process (all its threads) in; the children it starts later are born in it."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def close(self) -> None:
        """Idempotent: a closed quota is gone."""
        if not self.path.exists():
            return
        for pid in self.pids():
            with contextlib.suppress(OSError):  # gone meanwhile
                (_base() / "cgroup.procs").write_text(str(pid))
        self.path.rmdir()

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
