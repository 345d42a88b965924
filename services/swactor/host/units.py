"""The systemd unit files as the supervisor reads them: the one description of each service.

A host without systemd runs the very files systemd would (`install.sh host --no-systemd` writes them to
`PREFIX/units/`), so a service's command line, order, timeouts, user and limits are said once. The
supervisor gives the keys in `APPLIED`; a key of `SANDBOX` needs systemd's namespaces, cgroups or
seccomp and is listed as not applied (`Unit.not_applied`, shown by `swactor-host status`); any other
key is refused by name, so a unit written for systemd never runs here with a meaning silently lost.
"""

from __future__ import annotations

import re
import resource
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path

# What systemd would do that a supervisor without namespaces, cgroups or seccomp cannot.
SANDBOX = frozenset({
    "AmbientCapabilities", "CapabilityBoundingSet", "DeviceAllow", "DevicePolicy", "InaccessiblePaths",
    "IPAddressDeny", "LockPersonality", "MemoryDenyWriteExecute", "MemoryMax", "PrivateIPC", "PrivateMounts",
    "PrivateDevices", "PrivateNetwork", "PrivateTmp", "PrivateUsers", "ProcSubset", "ProtectClock", "ProtectControlGroups", "ProtectHome", "ProtectHostname",
    "ProtectKernelLogs", "ProtectKernelModules", "ProtectKernelTunables", "ProtectProc", "ProtectSystem",
    "RestrictAddressFamilies", "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID",
    "SystemCallArchitectures", "SystemCallErrorNumber", "SystemCallFilter",
})
# Read for what they order or describe, or harmless without systemd (its own bookkeeping).
INFORMATIONAL = frozenset({
    "Description", "Documentation", "After", "Requires", "Wants", "PartOf", "WantedBy", "NotifyAccess",
    "RuntimeDirectoryPreserve",
})
APPLIED = frozenset({
    "Type", "ExecStart", "KillSignal", "KillMode", "TimeoutStartSec", "TimeoutStopSec", "Restart", "RestartSec",
    "WatchdogSec", "User", "Group", "Environment", "Nice", "UMask", "NoNewPrivileges", "LimitNOFILE",
    "LimitMEMLOCK", "LimitCORE", "RuntimeDirectory", "RuntimeDirectoryMode", "StateDirectory",
    "StateDirectoryMode", "CacheDirectory", "CacheDirectoryMode",
})
_LIMITS = {"LimitNOFILE": resource.RLIMIT_NOFILE, "LimitMEMLOCK": resource.RLIMIT_MEMLOCK,
           "LimitCORE": resource.RLIMIT_CORE}
_DIRECTORY_KINDS = ("Runtime", "State", "Cache")
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0}
_TIMESPAN = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


class UnitError(ValueError):
    """A unit file the supervisor cannot run as systemd would; names the file, line and key."""


@dataclass(frozen=True)
class Directory:
    kind: str  # Runtime | State | Cache: under /run, /var/lib, /var/cache
    name: str
    mode: int


@dataclass(frozen=True)
class Unit:
    name: str  # "swactor-worker.service"
    path: Path
    description: str
    exec_start: tuple[str, ...]
    notify: bool  # Type=notify: active on READY=1, else once spawned
    restart_on_failure: bool  # Restart=on-failure | always (a clean exit of an "always" unit too)
    restart_always: bool
    restart_s: float
    start_timeout_s: float
    stop_timeout_s: float
    watchdog_s: float  # 0: no watchdog
    kill_signal: int
    kill_main_only: bool  # KillMode=mixed: KillSignal to the main process, SIGKILL to the rest at the end
    user: str | None
    group: str | None
    environment: tuple[tuple[str, str], ...]
    nice: int | None
    umask: int
    no_new_privileges: bool
    limits: tuple[tuple[int, int], ...]  # (RLIMIT_*, value; RLIM_INFINITY for infinity), soft = hard
    directories: tuple[Directory, ...]
    after: frozenset[str]
    requires: frozenset[str]
    not_applied: tuple[str, ...] = field(default=())

    @property
    def short_name(self) -> str:
        return self.name.removesuffix(".service")


def timespan_s(value: str, what: str) -> float:
    """systemd's time span ("20s", "1min 30s", "2" = seconds, "infinity") in seconds."""
    text = value.strip().lower()
    if text == "infinity":
        return float("inf")
    parts = _TIMESPAN.findall(text)
    if not parts or _TIMESPAN.sub("", text).strip() or any(u and u not in _TIME_UNITS for _, u in parts):
        raise UnitError(f"{what}: {value!r} is not a time span (such as 20s, 2min, 500ms)")
    return sum(float(n) * _TIME_UNITS[u or "s"] for n, u in parts)


def _limit(value: str, what: str) -> int:
    if value.strip() == "infinity":
        return resource.RLIM_INFINITY
    if not value.strip().isdigit():
        raise UnitError(f"{what}: {value!r} is neither a number nor infinity (soft:hard pairs are not read here)")
    return int(value)


def _environment(value: str, what: str) -> list[tuple[str, str]]:
    pairs = []
    for word in shlex.split(value):
        key, sep, val = word.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UnitError(f"{what}: {word!r} is not NAME=VALUE")
        pairs.append((key, val))
    return pairs


def read_unit(path: Path) -> Unit:
    """Parse one `.service` file; UnitError names what the supervisor cannot run as written."""
    keys: dict[str, list[str]] = {}
    section = ""
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        where = f"{path}:{number}: {key}"
        if not sep or section not in ("Unit", "Service", "Install"):
            raise UnitError(f"{path}:{number}: {line!r} is not Key=Value inside [Unit], [Service] or [Install]")
        if key not in APPLIED | SANDBOX | INFORMATIONAL:
            raise UnitError(f"{where}: the supervisor does not know this key, so it cannot give what systemd would")
        if value.strip() == "" and key != "ExecStart":
            keys.pop(key, None)  # an empty assignment resets a list, as in systemd
            continue
        keys.setdefault(key, []).append(value.strip())
        keys.setdefault(f"@{key}", []).append(where)

    def one(key: str, default: str = "") -> str:
        values = keys.get(key)
        return values[-1] if values else default

    def where(key: str) -> str:
        return keys.get(f"@{key}", [f"{path}: {key}"])[-1]

    def words(key: str) -> frozenset[str]:
        return frozenset(w for v in keys.get(key, []) for w in v.split())

    exec_start = tuple(shlex.split(one("ExecStart")))
    if not exec_start or not exec_start[0].startswith("/"):
        raise UnitError(f"{where('ExecStart')}: needs an absolute command (prefixes such as - or @ are not read here)")
    kind = one("Type", "simple")
    if kind not in ("simple", "exec", "notify"):
        raise UnitError(f"{where('Type')}: {kind!r} is not simple, exec or notify")
    restart = one("Restart", "no")
    if restart not in ("no", "on-failure", "always"):
        raise UnitError(f"{where('Restart')}: {restart!r} is not no, on-failure or always")
    kill_mode = one("KillMode", "control-group")
    if kill_mode not in ("control-group", "mixed"):
        raise UnitError(f"{where('KillMode')}: {kill_mode!r} is not control-group or mixed")
    sig_name = one("KillSignal", "SIGTERM")
    try:
        kill_signal = signal.Signals[sig_name if sig_name.startswith("SIG") else f"SIG{sig_name}"]
    except KeyError:
        raise UnitError(f"{where('KillSignal')}: {sig_name!r} is not a signal name") from None
    environment: list[tuple[str, str]] = []
    for value, at in zip(keys.get("Environment", []), keys.get("@Environment", []), strict=True):
        environment += _environment(value, at)
    nice = int(one("Nice")) if one("Nice") else None
    if nice is not None and not -20 <= nice <= 19:
        raise UnitError(f"{where('Nice')}: {nice} is not in -20..19")
    directories = []
    for kind_name in _DIRECTORY_KINDS:
        for name in words(f"{kind_name}Directory"):
            if "/" in name.strip("/") or name in (".", ".."):
                raise UnitError(f"{where(f'{kind_name}Directory')}: {name!r}: only a plain directory name is read here")
            mode = one(f"{kind_name}DirectoryMode", "0755")
            directories.append(Directory(kind_name, name, int(mode, 8)))
    return Unit(
        name=path.name, path=path, description=one("Description", path.name),
        exec_start=exec_start, notify=kind == "notify",
        restart_on_failure=restart != "no", restart_always=restart == "always",
        restart_s=timespan_s(one("RestartSec", "100ms"), where("RestartSec")),
        start_timeout_s=timespan_s(one("TimeoutStartSec", "90s"), where("TimeoutStartSec")),
        stop_timeout_s=timespan_s(one("TimeoutStopSec", "90s"), where("TimeoutStopSec")),
        watchdog_s=timespan_s(one("WatchdogSec", "0"), where("WatchdogSec")),
        kill_signal=int(kill_signal), kill_main_only=kill_mode == "mixed",
        user=one("User") or None, group=one("Group") or None, environment=tuple(environment), nice=nice,
        umask=int(one("UMask", "0022"), 8), no_new_privileges=one("NoNewPrivileges") in ("yes", "true", "1"),
        limits=tuple((res, _limit(one(key), where(key))) for key, res in _LIMITS.items() if one(key)),
        directories=tuple(directories), after=words("After"), requires=words("Requires"),
        not_applied=tuple(sorted(k for k in keys if k in SANDBOX)),
    )


def read_units(directory: Path) -> list[Unit]:
    """Every `*.service` in `directory`, in start order (After=, then name); UnitError names a problem."""
    if not directory.is_dir():
        raise UnitError(f"{directory}: no such directory of unit files (install.sh host --no-systemd writes it)")
    units = [read_unit(p) for p in sorted(directory.glob("*.service"))]
    if not units:
        raise UnitError(f"{directory}: holds no *.service unit file")
    return start_order(units)


def start_order(units: list[Unit]) -> list[Unit]:
    """Units ordered so each comes after the present units its After= names; a cycle is an error."""
    by_name = {u.name: u for u in units}
    ordered: list[Unit] = []
    placed: set[str] = set()
    while len(ordered) < len(units):
        ready = [u for u in units if u.name not in placed and all(a in placed or a not in by_name for a in u.after)]
        if not ready:
            stuck = sorted(u.name for u in units if u.name not in placed)
            raise UnitError(f"After= orders these units in a cycle: {', '.join(stuck)}")
        for u in sorted(ready, key=lambda u: u.name):
            ordered.append(u)
            placed.add(u.name)
    return ordered
