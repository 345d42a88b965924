"""Starting one unit's process as systemd would: its directories, user, limits, environment and
NOTIFY_SOCKET, in a process group of its own (what is left of the group is killed with the unit).

Privileges are dropped in the child itself (`_Child.__call__`, run between fork and exec): the limits
and the priority first, while it is still root, then the groups and the user. A limit the supervisor
could not raise for itself is given as high as it could (`raise_own_limits`) and reported as not applied.
"""

from __future__ import annotations

import contextlib
import ctypes
import grp
import os
import pwd
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path

from swactor.host.units import Unit

_PR_SET_NO_NEW_PRIVS = 38
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child


@dataclass(frozen=True)
class HostPaths:
    """Where the unit directories go (systemd's /run, /var/lib, /var/cache) and the supervisor's own files."""

    run: Path = Path("/run")
    state: Path = Path("/var/lib")
    cache: Path = Path("/var/cache")
    own: Path = Path("/run/swactor-host")  # notify sockets, the control socket, the pid file

    def base(self, kind: str) -> Path:
        return {"Runtime": self.run, "State": self.state, "Cache": self.cache}[kind]

    @property
    def control(self) -> Path:
        return self.own / "control.sock"

    def notify(self, unit: Unit) -> Path:
        return self.own / "notify" / unit.short_name


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]


class SpawnError(RuntimeError):
    """A unit that cannot be started as written (an unknown user, a command that does not run)."""


def identity(unit: Unit) -> Identity | None:
    """The user and groups to drop to; None when the supervisor is not root (it runs units as itself)."""
    if os.geteuid() != 0 or unit.user is None:
        return None
    try:
        user = pwd.getpwnam(unit.user)
    except KeyError:
        raise SpawnError(f"User={unit.user}: no such user on this host (install.sh host makes it)") from None
    gid = user.pw_gid
    if unit.group is not None:
        try:
            gid = grp.getgrnam(unit.group).gr_gid
        except KeyError:
            raise SpawnError(f"Group={unit.group}: no such group on this host") from None
    return Identity(user.pw_uid, gid, tuple(os.getgrouplist(unit.user, gid)))


def raise_own_limits(units: list[Unit]) -> list[str]:
    """Raise this process's hard limits to the most any unit asks (children can only lower theirs);
    the limits that could not be raised, by name."""
    short = []
    for res in {res for u in units for res, _ in u.limits}:
        want = max(v for u in units for r, v in u.limits if r == res)
        soft, hard = resource.getrlimit(res)
        if _above(want, hard):
            try:
                resource.setrlimit(res, (soft, want))
            except (ValueError, OSError):
                short.append(_LIMIT_NAMES.get(res, str(res)))
    return sorted(short)


_LIMIT_NAMES = {resource.RLIMIT_NOFILE: "LimitNOFILE", resource.RLIMIT_MEMLOCK: "LimitMEMLOCK",
                resource.RLIMIT_CORE: "LimitCORE"}


def _above(a: int, b: int) -> bool:
    inf = resource.RLIM_INFINITY
    return a != b and (a == inf or (b != inf and a > b))


def make_directories(unit: Unit, paths: HostPaths, who: Identity | None) -> dict[str, str]:
    """RuntimeDirectory= and the like, owned by the unit's user; the environment variables naming them."""
    env: dict[str, list[str]] = {}
    for d in unit.directories:
        path = paths.base(d.kind) / d.name
        path.mkdir(parents=True, exist_ok=True)
        if who is not None:
            os.chown(path, who.uid, who.gid)
        os.chmod(path, d.mode)
        env.setdefault(f"{d.kind.upper()}_DIRECTORY", []).append(str(path))
    return {k: ":".join(v) for k, v in env.items()}


@dataclass(frozen=True)
class _Child:
    """Runs in the child between fork and exec: only async-signal-safe-enough calls, no allocation-heavy work."""

    unit: Unit
    who: Identity | None

    def __call__(self) -> None:
        if self.unit.nice is not None:
            # Not privileged for a negative Nice=: reported by `status` as not applied.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, self.unit.nice)
        for res, want in self.unit.limits:
            _, hard = resource.getrlimit(res)
            value = hard if _above(want, hard) else want
            resource.setrlimit(res, (value, value))
        os.umask(self.unit.umask)
        if self.who is not None:
            os.setgroups(list(self.who.groups))
            os.setgid(self.who.gid)
            os.setuid(self.who.uid)
        if self.unit.no_new_privileges:
            _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


# systemd sets WATCHDOG_PID to the main process; its pid is known only in the child, so a shell sets
# it and execs the service in its place (same pid).
_TRAMPOLINE = ("/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$@"', "sh")


def spawn(unit: Unit, paths: HostPaths, who: Identity | None, output_fd: int) -> subprocess.Popen[bytes]:
    """Start the unit's ExecStart= with stdout and stderr on `output_fd`; SpawnError if it cannot run."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "NOTIFY_SOCKET": str(paths.notify(unit)), **make_directories(unit, paths, who)}
    if who is not None:
        user = pwd.getpwuid(who.uid)
        env |= {"USER": user.pw_name, "LOGNAME": user.pw_name, "HOME": user.pw_dir}
    if unit.watchdog_s:
        env["WATCHDOG_USEC"] = str(int(unit.watchdog_s * 1e6))
    env |= dict(unit.environment)
    if not os.access(unit.exec_start[0], os.X_OK):
        raise SpawnError(f"ExecStart={unit.exec_start[0]}: not an executable file")
    try:
        return subprocess.Popen(
            [*_TRAMPOLINE, *unit.exec_start], stdin=subprocess.DEVNULL, stdout=output_fd, stderr=output_fd,
            cwd="/", env=env, start_new_session=True, preexec_fn=_Child(unit, who))
    except (OSError, subprocess.SubprocessError) as e:
        raise SpawnError(f"ExecStart={unit.exec_start[0]}: {e}") from e
