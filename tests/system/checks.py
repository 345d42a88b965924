"""What the system test checks inside a booted host, beyond "the units are active": the sandbox
(`systemd-analyze security` exposure, the identity and capabilities of every process of every
unit), the ports the host listens on, what an HTTP service answers, the watchdog, and what an
uninstall leaves behind.

Each check returns data (and the test asserts on it) or raises AssertionError naming the host.
"""

from __future__ import annotations

import json
import re
import time

from .nspawn import Container

# Every process of every unit: its uids, effective and bounding capabilities, no_new_privs and
# seccomp mode, from /proc (run inside the host, as root).
_PROCS = r"""
import json, pathlib, sys
units = sys.argv[1:]
out = {unit: [] for unit in units}
for d in pathlib.Path("/proc").iterdir():
    if not d.name.isdigit():
        continue
    try:  # the unit from the process's own cgroup path (v2, or v1's name=systemd hierarchy)
        cgroups = (d / "cgroup").read_text().splitlines()
        status = (d / "status").read_text()
        comm = (d / "comm").read_text().strip()
    except OSError:
        continue  # exited meanwhile
    unit = next((u for u in units for line in cgroups if ("/system.slice/" + u) in line.split(":", 2)[2]), None)
    if unit is None:
        continue
    f = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    out[unit].append({"pid": int(d.name), "comm": comm, "uids": f["Uid"].split(), "gids": f["Gid"].split(),
                      "cap_eff": f["CapEff"].strip(), "cap_bnd": f["CapBnd"].strip(),
                      "no_new_privs": f["NoNewPrivs"].strip(), "seccomp": f["Seccomp"].strip(),
                      "rss_kib": int(f.get("VmRSS", "0 kB").split()[0])})
print(json.dumps(out))
"""


# Every process of a host (its PID namespace, as root) but this probe: pid, parent, name, state (Z: a
# zombie), command line, uids, gids and effective capabilities. For a host without systemd, where no
# cgroup names a process's unit.
_ALL_PROCS = r"""
import json, os, pathlib
out = []
for d in pathlib.Path("/proc").iterdir():
    if not d.name.isdigit() or int(d.name) == os.getpid():
        continue
    try:
        status = (d / "status").read_text()
        args = (d / "cmdline").read_bytes().split(b"\0")
    except OSError:
        continue  # exited meanwhile
    f = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    out.append({"pid": int(d.name), "ppid": int(f["PPid"]), "comm": f["Name"].strip(), "state": f["State"].split()[0],
                "args": [a.decode(errors="replace") for a in args if a], "uids": f["Uid"].split(),
                "gids": f["Gid"].split(), "cap_eff": f["CapEff"].strip()})
print(json.dumps(out))
"""


def host_processes(c: Container) -> list[dict]:
    """Every process in host `c` but the probe itself (see _ALL_PROCS)."""
    return json.loads(c.run(["python3", "-c", _ALL_PROCS]).stdout)


def exposure(c: Container, unit: str) -> float:
    """`systemd-analyze security UNIT`'s overall exposure level (0 safest .. 10)."""
    out = c.run(["systemd-analyze", "security", "--no-pager", unit]).stdout
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)
    assert m, f"{c.name}: no exposure level for {unit} in:\n{out[-1500:]}"
    return float(m[1])


def unit_processes(c: Container, units: list[str]) -> dict[str, list[dict]]:
    return json.loads(c.run(["python3", "-c", _PROCS, *units]).stdout)


def assert_sandboxed(c: Container, units: list[str], user: str = "swactor") -> None:
    """Every process of every unit (the worker's compute process too) runs as `user`, with no
    capability, no_new_privs set and a seccomp filter."""
    uid = c.run(["id", "-u", user]).stdout.strip()
    procs = unit_processes(c, units)
    for unit in units:
        assert procs[unit], f"{c.name}: {unit} has no processes"
        for p in procs[unit]:
            where = f"{c.name}: {unit} pid {p['pid']} ({p['comm']})"
            assert set(p["uids"]) == {uid}, f"{where} runs as uids {p['uids']}, not {user} ({uid})"
            assert int(p["cap_eff"], 16) == 0 and int(p["cap_bnd"], 16) == 0, f"{where} has capabilities: {p}"
            assert p["no_new_privs"] == "1" and p["seccomp"] == "2", f"{where}: no NoNewPrivileges/seccomp: {p}"


def rss_kib(c: Container, units: list[str]) -> dict[str, int]:
    """Resident memory of each unit's processes together, in KiB (the unit name without .service);
    shared pages (the arena's rings, the model's page cache) count once per process."""
    return {unit.removesuffix(".service"): sum(p["rss_kib"] for p in procs)
            for unit, procs in unit_processes(c, units).items()}


def listening_ports(c: Container) -> set[tuple[str, int]]:
    """Every TCP socket in LISTEN and every bound UDP socket of the host, as (proto, port)."""
    out = c.run(["ss", "-Hlntu"]).stdout
    ports = set()
    for line in out.splitlines():
        fields = line.split()
        ports.add((fields[0], int(fields[4].rsplit(":", 1)[1])))
    return ports


# One GET from inside the host with the stdlib only (the hosts have no curl): the status and the
# JSON body, or no status and the error when there was no HTTP answer (a refused connection, a TLS
# handshake that failed). argv: URL, CA file ("" for plain HTTP), bearer token ("" for none).
_HTTP_GET = r"""
import json, ssl, sys, urllib.error, urllib.request
url, cafile, token = sys.argv[1:4]
headers = {"Authorization": f"Bearer {token}"} if token else {}
context = ssl.create_default_context(cafile=cafile) if cafile else None
try:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20, context=context) as r:
        status, body = r.status, r.read()
except urllib.error.HTTPError as e:
    status, body = e.code, e.read()
except OSError as e:
    print(json.dumps({"status": None, "error": repr(e)}))
    sys.exit(0)
try:
    parsed = json.loads(body)
except ValueError:
    parsed = body.decode(errors="replace")
print(json.dumps({"status": status, "body": parsed}))
"""


def http_get(c: Container, url: str, *, cafile: str = "", token: str = "") -> tuple[int | None, object]:
    """GET `url` from inside host `c`, trusting only `cafile` for https: (status, JSON body), or
    (None, the error) when no HTTP answer came."""
    out = json.loads(c.run(["python3", "-c", _HTTP_GET, url, cafile, token], timeout=40).stdout)
    return out["status"], out.get("body", out.get("error"))


def main_pid_and_restarts(c: Container, unit: str) -> tuple[int, int, str]:
    shown = dict(line.split("=", 1) for line in c.run(
        ["systemctl", "show", "-p", "MainPID,NRestarts,ActiveState", unit]).stdout.split())
    return int(shown["MainPID"]), int(shown["NRestarts"]), shown["ActiveState"]


def hang_and_wait_for_watchdog(c: Container, unit: str, timeout_s: float = 120.0) -> float:
    """SIGSTOP the unit's main process (its event loop stops, so do its WATCHDOG=1 pings) and wait
    for systemd to kill it and start a new one; returns the seconds that took."""
    pid, restarts, state = main_pid_and_restarts(c, unit)
    assert state == "active" and pid > 0, (unit, pid, state)
    since = c.run(["date", "+%Y-%m-%d %H:%M:%S"]).stdout.strip()
    t0 = time.monotonic()
    c.run(["systemctl", "kill", "--signal=SIGSTOP", "--kill-who=main", unit])
    while True:
        new_pid, new_restarts, state = main_pid_and_restarts(c, unit)
        if new_restarts > restarts and state == "active" and new_pid not in (0, pid):
            break
        assert time.monotonic() - t0 < timeout_s, f"{c.name}: {unit} not restarted within {timeout_s} s ({state})"
        time.sleep(0.5)
    took = time.monotonic() - t0
    log = c.run(["journalctl", "--no-pager", "-o", "cat", "-u", unit, "--since", since]).stdout
    assert "Watchdog timeout" in log, f"{c.name}: {unit} restarted, but not by the watchdog:\n{log[-3000:]}"
    return took


# Processes whose command line names swactor's code (procps is not on the minimal hosts).
_SWACTOR_PROCS = r"""
import json, os, pathlib
out = []
for d in pathlib.Path("/proc").iterdir():
    try:
        args = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if d.name.isdigit() and "/swactor" in args and d.name != str(os.getpid()):
        out.append(f"{d.name} {args}")
print(json.dumps(out))
"""
SWACTOR_PATHS = ("/opt/swactor", "/usr/local/bin/swactor", "/etc/swactor", "/var/lib/swactor", "/var/cache/swactor",
                 "/run/swactor")


def leftovers(c: Container) -> dict[str, object]:
    """What of swactor is still on the host: units, unit files and links, processes, files (with
    their owners), the user and the group."""
    listed = c.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "swactor*"]).stdout
    files = {}
    for path in SWACTOR_PATHS:
        found = c.sh(f"[ ! -e {path} ] && [ ! -L {path} ] || find {path} -printf '%p %u:%g\\n'").stdout
        if found.strip():
            files[path] = found.splitlines()
    return {
        "units": [line.strip() for line in listed.splitlines() if line.strip()],
        "unit_files": c.sh("find /etc/systemd/system -name 'swactor*'").stdout.split(),
        "processes": json.loads(c.run(["python3", "-c", _SWACTOR_PROCS]).stdout),
        "files": files,
        "user": c.run(["getent", "passwd", "swactor"], check=False).returncode == 0,
        "group": c.run(["getent", "group", "swactor"], check=False).returncode == 0,
    }
