"""System test of a host without systemd (issue 24): a container whose main process (PID 1) is the
supervisor `swactor-host run`, as the Dockerfile's image runs, joins a pool of systemd hosts.

Two hosts on one bridge, each in its own network namespace: h0 booted with real systemd
(`systemd-nspawn -b`) and installed with `install.sh host --orchestrator`, as test_install_host.py
does; h1 never runs systemd. h1's root file system gets `install.sh host --no-start ...` run as the
one process of a container that is not booted (what an image build's RUN step is), without
--no-systemd: the installer must find out by itself that systemd is not running, and write the units
for the supervisor into /opt/swactor/units. Then h1 starts with `swactor-host run` as its main
process, and:

- every service becomes active in order, each process of each runs as the swactor user without
  capabilities, `swactor-host status` shows what `systemctl status` would (text and --json), and a
  re-install or an uninstall inside the running container is refused (it would end the container);
- h1 joins the pool: h0 lists two provisionable nodes and a 2-stage greedy run over both completes
  with llama.cpp's tokens;
- a service SIGKILLed inside h1 is restarted by the supervisor (a new main pid, one restart), and the
  pool serves a run again;
- SIGTERM to h1's main process (`docker stop`), with a run decoding on both hosts: the container
  exits 0 within 30 s, nothing is left running in its network namespace, h0's orchestrator ends the
  run, sees h1's node as left (a graceful leave, not a failure) with no run slot held on it, and h0's
  arena holds no ring lease any more;
- the log stream (the container's output) is one JSON object per line, every service's among them;
- without --no-start, in a container whose main process is not the supervisor, the install starts
  the supervisor detached and waits for every unit to be active; a re-install stops it, replaces the
  code and starts it again; `install.sh uninstall` stops it and removes what the install made.

Needs root, systemd-nspawn, debootstrap and git, as test_install_host.py; shares its rootfs and
wheelhouse caches and its helpers. When test_install_host.py ran first in this process, both hosts'
graph caches start with the graphs its stages compiled (seed_graphs): the cold compile is its test.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import NetnsCluster

from . import checks
from .nspawn import Container, ContainerError
from .test_install_host import (
    RUNS_DIR,
    UNITS,
    _skip,
    cleanup_stale_runs,
    copy_source,
    greedy_run_on_both,
    install,
    journal,
    prepare,
    seed_graphs,
    swactor_json,
    units_active,
    wait_pool,
)

# The timeout covers a first run's rootfs and wheelhouse builds (the fixture), as test_install_host's.
pytestmark = [pytest.mark.system, pytest.mark.netns, pytest.mark.timeout(900),
              pytest.mark.skipif(_skip is not None, reason=_skip or "")]

PREFIX = "/opt/swactor"
REPO = Path(__file__).resolve().parents[2]
SUPERVISOR = [f"{PREFIX}/venv/bin/swactor-host", "run"]
SERVICES = [f"{u}.service" for u in UNITS]
ACTIVE_S = 120.0  # the supervisor starts the four units one after another, each waiting for READY=1
STOP_S = 30.0  # from SIGTERM to an exited container (the bound)


def check_dockerfile() -> list[str]:
    """The Dockerfile makes what h1 is here: the rootfs's packages but systemd's, the checkout in
    /root/swactor, `install.sh host --no-systemd --no-start`; returns its ENTRYPOINT, h1's command."""
    text = (REPO / "Dockerfile").read_text()
    rootfs = re.search(r'^INCLUDE="([^"]+)"', (REPO / "tests/system/build_rootfs.sh").read_text(), re.M)
    assert rootfs, "no INCLUDE= in build_rootfs.sh"
    apt = re.search(r"apt-get install -y --no-install-recommends \\\s*([^\n&]+)", text)
    assert apt, text
    assert set(rootfs[1].split(",")) - {"systemd", "systemd-sysv", "dbus"} <= set(apt[1].split()), (rootfs[1], apt[1])
    assert re.search(r"^COPY \. /root/swactor$", text, re.M), text
    assert re.search(r"bash /root/swactor/install\.sh host --no-systemd --no-start \$INSTALL_ARGS$", text, re.M), text
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.M), text
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    assert entrypoint, text
    return json.loads(entrypoint[1])


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Container, Container]]:
    """h0 booting (systemd), h1's file system mounted but nothing running in it; the operator's
    checkout in /root/swactor of both comes from the test's copy of the working tree."""
    rootfs = prepare("tests/system/build_rootfs.sh", timeout=900)
    wheelhouse = prepare("packaging/wheelhouse.sh", timeout=600)
    cleanup_stale_runs()
    run_dir = RUNS_DIR / f"{os.getpid()}-{os.urandom(2).hex()}"
    src = run_dir / "src"
    copy_source(src)
    binds = [(wheelhouse, "/mnt/wheelhouse"), (src, "/mnt/swactor-src"), (REPO / ".cache" / "models", "/mnt/models")]
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, run_dir, True)
        net = stack.enter_context(NetnsCluster(2, prefix="sys"))
        h0, h1 = (stack.enter_context(Container(f"swsys{os.getpid()}-h{h.index}", rootfs, run_dir / f"h{h.index}",
                                                netns=f"/run/netns/{h.ns}", addr=h.addr, bind_ro=binds))
                  for h in net.hosts)
        h0.start()
        h1.mount()
        shutil.copytree(src, h1.path("/root/swactor"), symlinks=True)
        yield h0, h1
        # ExitStack: the containers stop (h1 by SIGTERM, h0 through systemd), then the namespaces, then the copies.


def supervised(c: Container) -> dict[str, dict]:
    """`swactor-host status --json` inside the host (on PATH, as an operator types it): unit name ->
    its entry; {} while no supervisor answers."""
    done = c.run(["swactor-host", "status", "--json"], check=False)
    if done.returncode == 1:
        return {}
    assert done.returncode in (0, 3), (done.returncode, done.stdout, done.stderr)
    return {u["name"]: u for u in json.loads(done.stdout)["units"]}


def wait_supervised(c: Container, want: Callable[[dict[str, dict]], bool], what: str,
                    timeout_s: float = ACTIVE_S) -> dict[str, dict]:
    """Poll `swactor-host status --json` until `want` holds of it; returns it."""
    deadline = time.monotonic() + timeout_s
    units: dict[str, dict] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(ContainerError, ValueError):
            units = supervised(c)
            if want(units):
                return units
        time.sleep(0.5)
    raise AssertionError(f"{c.name}: {what} not within {timeout_s} s: {units}\nconsole: {c.console_tail(4000)}")


def all_active(units: dict[str, dict]) -> bool:
    return sorted(units) == sorted(SERVICES) and all(u["active_state"] == "active" for u in units.values())


def check_install_without_systemd(c: Container, stderr: str) -> None:
    """(a) The installer found no systemd by itself, did not start anything (--no-start), wrote the
    units for the supervisor into the install root and none for systemd, linked swactor-host, and
    recorded all of it for the uninstall."""
    assert "systemd is not running on this host" in stderr and "(--no-systemd)" in stderr, stderr
    assert "not started (--no-start): run `swactor-host run`" in stderr, stderr
    assert "systemctl" not in stderr.replace("`systemctl status`", ""), stderr
    written = sorted(p.name for p in c.path(f"{PREFIX}/units").iterdir())
    assert written == sorted(SERVICES), written
    for unit in SERVICES:  # systemd's own unit files, the install root put in as under systemd
        text = c.path(f"{PREFIX}/units/{unit}").read_text()
        assert f"ExecStart={PREFIX}/venv/bin/{unit.removesuffix('.service')} " in text, (unit, text)
    assert not list(c.path("/etc/systemd/system").glob("swactor*")), "units written for systemd"
    assert os.readlink(c.path("/usr/local/bin/swactor-host")) == f"{PREFIX}/venv/bin/swactor-host"
    assert c.path(f"{PREFIX}/venv/bin/swactor-host").is_file(), "no swactor-host console script in the venv"
    record = c.path("/etc/swactor/installed").read_text()
    lines = {line for line in record.splitlines() if not line.startswith("#")}
    assert {f"tree {PREFIX}/units", "link /usr/local/bin/swactor-host", "file /var/log/swactor-host.log",
            "dir /run/swactor-host", f"tree {PREFIX}/venv", "user swactor"} <= lines, record
    assert not [line for line in lines if line.startswith("unit ")], record
    assert c.path(f"{PREFIX}/.swactor-install").read_text() == record


def check_processes(c: Container, units: dict[str, dict]) -> None:
    """(b) The supervisor is the container's PID 1 and no systemd runs; every other process (each
    service's main process, the worker's compute process) runs as swactor, without capabilities; each
    unit's main pid is its service's process."""
    uid = c.run(["id", "-u", "swactor"]).stdout.strip()
    procs = {p["pid"]: p for p in checks.host_processes(c)}
    init = procs[1]
    assert init["args"][1:] == SUPERVISOR and init["uids"] == ["0"] * 4, init  # [python, swactor-host, run]
    assert c.run(["test", "-e", "/run/systemd/system"], check=False).returncode == 1, "systemd runs in the container"
    for p in procs.values():
        if p["pid"] == 1:
            continue
        assert set(p["uids"]) == {uid} and int(p["cap_eff"], 16) == 0, f"{c.name}: not dropped to swactor: {p}"
    for name, unit in units.items():
        main = procs.get(unit["main_pid"])
        assert main is not None and f"{PREFIX}/venv/bin/{name.removesuffix('.service')}" in main["args"], (name, unit, main)
    print(f"{c.name}: PID 1 {' '.join(init['args'])}; as swactor: "
          f"{sorted((p['pid'], p['comm']) for p in procs.values() if p['pid'] != 1)}", flush=True)


def check_status_text(c: Container) -> None:
    """(f) `swactor-host status` prints what `systemctl status` would, per unit; exit 0: all active."""
    done = c.run(["swactor-host", "status"], check=False)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    out = done.stdout
    for unit in SERVICES:
        assert re.search(rf"^● {re.escape(unit)} - ", out, re.M), (unit, out)
    assert len(re.findall(r"^\s*Active: active \(running\) since ", out, re.M)) == len(SERVICES), out
    assert len(re.findall(r"^\s*Main PID: \d+", out, re.M)) == len(SERVICES), out


def check_refused_while_running(c: Container, args: list[str]) -> None:
    """A re-install and an uninstall inside the running container would stop its PID 1, and with it
    the container and themselves: each is refused by name, and the services keep running."""
    for argv, words in ((["host", *args], "swactor-host is this container's main process (PID 1)"),
                        (["uninstall"], "swactor-host is this container's main process (PID 1)")):
        done = c.run(["bash", "/root/swactor/install.sh", *argv], check=False, timeout=60)
        assert done.returncode == 1 and words in done.stderr, (argv, done.returncode, done.stderr)
    assert all_active(supervised(c)), supervised(c)
    assert c.path(f"{PREFIX}/venv/bin/swactor-host").exists()


def kill_and_wait_restarted(c: Container, unit: str) -> float:
    """(d) SIGKILL of the unit's main process inside the host: the supervisor starts it again (a new
    main pid, one restart more) and the others run on untouched; returns the seconds that took."""
    before = supervised(c)
    old = before[unit]
    t0 = time.monotonic()
    c.run(["bash", "-c", 'kill -9 "$1"', "kill", str(old["main_pid"])])  # bash's: no procps on the host
    after = wait_supervised(c, lambda u: u.get(unit, {}).get("active_state") == "active"
                            and u[unit]["main_pid"] not in (0, old["main_pid"]),
                            f"{unit} restarted after SIGKILL", timeout_s=60)
    took = time.monotonic() - t0
    assert after[unit]["restarts"] == old["restarts"] + 1 == 1, after[unit]
    for other in SERVICES:
        if other != unit:
            assert (after[other]["main_pid"], after[other]["restarts"]) == (before[other]["main_pid"], 0), \
                (other, before[other], after[other])
    return took


def start_decoding_run(h0: Container) -> str:
    """A long 2-stage run, waited for until it decodes (rings leased and pumping on both hosts)."""
    (sub,) = swactor_json(h0, "submit", "--prompt", "Hello", "--stages", "2", "--max-tokens", "1000", "--ignore-eos")
    run_id, deadline = sub["run_id"], time.monotonic() + 120
    while True:
        (run,) = swactor_json(h0, "show", run_id)
        if run["state"] == "RUN_STATE_RUNNING" and len(run.get("token_ids", [])) > int(sub["prompt_tokens"]):
            return run_id
        assert run["state"] != "RUN_STATE_DONE", run
        assert time.monotonic() < deadline, f"run {run_id} produced no token within 120 s: {run}"
        time.sleep(0.5)


def netns_pids(c: Container) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", Path(c.netns).name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_clean_on_h0(h0: Container, h1_node: int, run_id: str, timeout_s: float = 60.0) -> dict:
    """(e) After h1's stop: the run decoding on it ended, no run is active, h1's node left the pool
    gracefully (not suspect or faulted) holding no run slot, and h0's arena holds no ring lease."""
    deadline = time.monotonic() + timeout_s
    last: dict = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(ContainerError, ValueError):
            (run,) = swactor_json(h0, "show", run_id)
            runs = swactor_json(h0, "runs")
            (nodes,) = swactor_json(h0, "nodes")
            [node] = [n for n in nodes["nodes"] if int(n["node_id"]) == h1_node] or [{}]
            arena = h0.run(["systemctl", "show", "-p", "StatusText", "--value", "swactor-arena.service"]).stdout.strip()
            last = {"run": run, "node": node, "arena": arena,
                    "active": [r for r in runs if r.get("state") not in ("RUN_STATE_DONE", None)]}
            if (run["state"] == "RUN_STATE_DONE" and not last["active"]
                    and node.get("readiness") in ("NODE_READINESS_LEFT", None) and not node.get("slots_in_use")
                    and re.match(r"ready: 0 leases\b", arena)):
                return last
        time.sleep(1.0)
    raise AssertionError(f"h0 not clean of h1 within {timeout_s} s: {last}\n{journal(h0)}")


# What systemd-nspawn itself writes to the output it shares with the container (--console=pipe).
NSPAWN_OWN = re.compile(r'Attempted to remove disk file system under "/run/systemd/nspawn/|Container \S+ (exited|failed|terminated)')


def check_log_stream(c: Container) -> set[str]:
    """The container's output, the supervisor's stderr: one JSON object per line, the supervisor's
    own events and every service's among them; returns the services seen."""
    events: list[dict] = []
    bad: list[str] = []
    for line in c.console.read_text(errors="replace").splitlines():
        if not line.strip() or NSPAWN_OWN.match(line):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            events.append(event)
        else:
            bad.append(line)
    assert not bad, f"{c.name}: {len(bad)} of {len(events) + len(bad)} lines of the log stream are no JSON object: {bad[:3]}"
    services = {e.get("service", "") for e in events}
    unnamed = [e for e in events if "service" not in e]
    if unnamed:
        print(f"{c.name}: {len(unnamed)} of {len(events)} log lines name no service, e.g. {unnamed[:3]}", flush=True)
    assert {"swactor-host", "swactor-arena", "swactor-edge", "swactor-worker"} <= services, services
    assert services & {"membership", "swactor-membership"}, services
    return services


def install_detached(c: Container, args: list[str]) -> tuple[str, int]:
    """`install.sh host` without --no-start inside a running host whose main process is not the
    supervisor (a container's shell): it starts the supervisor detached and returns once every unit is
    active, printing `swactor-host status`. Returns its stderr and the supervisor's pid."""
    done = c.run(["bash", "/root/swactor/install.sh", "host", "--wheelhouse", "/mnt/wheelhouse", *args], timeout=300)
    assert "starting the supervisor: swactor-host run, detached" in done.stderr, done.stderr
    assert len(re.findall(r"^\s*Active: active \(running\)", done.stderr, re.M)) == len(SERVICES), done.stderr
    assert all_active(supervised(c)), supervised(c)
    pid = int(c.run(["cat", "/run/swactor-host/pid"]).stdout)
    assert pid != 1, pid
    return done.stderr, pid


def check_uninstall(c: Container) -> None:
    """`install.sh uninstall` on the running host stops the supervisor (`swactor-host stop`) and with
    it every service, then removes what the install recorded: the units, the supervisor's link, log
    and runtime dir, the venv, the user; only the container's main process is left."""
    done = c.run(["bash", "/root/swactor/install.sh", "uninstall", "--purge-secret"], timeout=300)
    assert "stopping the supervisor swactor-host" in done.stderr, done.stderr
    left = [p for p in checks.host_processes(c) if p["state"] != "Z"]  # zombies: PID 1 (a sleep) reaps none
    assert [p["pid"] for p in left] == [1], left
    for path in (PREFIX, "/usr/local/bin/swactor-host", "/usr/local/bin/swactor", "/var/log/swactor-host.log",
                 "/run/swactor-host", "/run/swactor", "/etc/swactor", "/var/lib/swactor", "/var/cache/swactor"):
        assert c.run(["test", "-e", path], check=False).returncode == 1, (path, done.stderr)
        assert c.run(["test", "-L", path], check=False).returncode == 1, (path, done.stderr)
    assert c.run(["getent", "passwd", "swactor"], check=False).returncode == 2, done.stderr


def test_a_host_without_systemd_joins_serves_and_stops_cleanly(hosts: tuple[Container, Container],
                                                                compiled_graphs: Path) -> None:
    h0, h1 = hosts
    timings: dict[str, float] = {}
    t_start = time.monotonic()

    # The pool's secret, given to both as an operator copies the first host's: both install at once.
    secret = os.urandom(32).hex() + "\n"
    h1.path("/root/cluster.secret").write_text(secret)
    h1_args = ["--advertise-ip", h1.addr, "--seed", f"{h0.addr}:7946", "--secret-file", "/root/cluster.secret"]

    def install_h0() -> float:
        h0.wait_booted()
        h0.run(["cp", "-a", "/mnt/swactor-src", "/root/swactor"])
        h0.path("/root/cluster.secret").write_text(secret)
        return install(h0, "--advertise-ip", h0.addr, "--orchestrator", "--secret-file", "/root/cluster.secret")

    def install_h1() -> subprocess.CompletedProcess[str]:
        # No --no-systemd: nothing but this install runs in h1, no systemd; the installer must see that.
        return h1.run_once(["bash", "/root/swactor/install.sh", "host", "--wheelhouse", "/mnt/wheelhouse",
                            "--no-start", *h1_args])

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        f0, f1 = pool.submit(install_h0), pool.submit(install_h1)
        t0 = time.monotonic()
        done1 = f1.result()
        timings["install h1 (no systemd)"] = time.monotonic() - t0
        timings["install h0 (systemd, orchestrator)"] = f0.result()
    check_install_without_systemd(h1, done1.stderr)
    assert units_active(h0, [*UNITS, "swactor-orchestrator"]) == dict.fromkeys([*UNITS, "swactor-orchestrator"],
                                                                                "active"), journal(h0)

    # h1 as the image runs: the Dockerfile's entrypoint, the supervisor, is the container's main process.
    assert check_dockerfile() == SUPERVISOR
    t0 = time.monotonic()
    h1.start_command(SUPERVISOR)
    h1.wait_started()
    units = wait_supervised(h1, all_active, "every unit active")
    timings["h1 supervisor: all active"] = time.monotonic() - t0
    assert all(u["restarts"] == 0 and u["main_pid"] > 0 for u in units.values()), units
    assert h1.run(["cat", "/run/swactor-host/pid"]).stdout.strip() == "1"
    check_processes(h1, units)
    check_status_text(h1)
    check_refused_while_running(h1, h1_args)

    # h1 joins: both nodes provisionable, a run over both hosts.
    node_ids = {int(c.path("/var/lib/swactor/node_id").read_text().strip()) for c in (h0, h1)}
    h1_node = int(h1.path("/var/lib/swactor/node_id").read_text().strip())
    t0 = time.monotonic()
    pool_view = wait_pool(h0, 2)
    timings["pool of 2 ready"] = time.monotonic() - t0
    assert {int(n["node_id"]) for n in pool_view["nodes"]} == node_ids, pool_view
    seeded = {c.name: seed_graphs(c, compiled_graphs) for c in (h0, h1)}
    t0 = time.monotonic()
    greedy_run_on_both([h0, h1], node_ids)
    timings[f"greedy run (graphs seeded: {seeded})"] = time.monotonic() - t0

    # A service killed inside h1 comes back; the pool serves again.
    timings["membership restarted after SIGKILL"] = kill_and_wait_restarted(h1, "swactor-membership.service")
    t0 = time.monotonic()
    wait_pool(h0, 2)
    greedy_run_on_both([h0, h1], node_ids)
    timings["pool ready + greedy run after the restart"] = time.monotonic() - t0

    # `docker stop`: SIGTERM to PID 1 while a run decodes on both hosts.
    run_id = start_decoding_run(h0)
    leased = supervised(h1)["swactor-arena.service"]["status_text"]
    t0 = time.monotonic()
    status = h1.terminate(timeout_s=STOP_S)
    timings["h1 stopped by SIGTERM"] = time.monotonic() - t0
    assert status == 0, (status, h1.console_tail(4000))
    assert netns_pids(h1) == [], netns_pids(h1)
    t0 = time.monotonic()
    clean = wait_clean_on_h0(h0, h1_node, run_id)
    timings["h0 clean of h1"] = time.monotonic() - t0
    print(f"h1's arena while the run decoded: {leased!r}; after the stop, on h0: run {clean['run']['outcome']} "
          f"({clean['run'].get('reason')}), h1's node {clean['node'] or 'gone'}, h0's arena {clean['arena']!r}", flush=True)
    # The supervisor's runtime dir and h1's /run/swactor (sockets; the arena's rings live in a memfd,
    # gone with its last process) were on the container's own /run, a tmpfs gone with it: the
    # overlay beneath holds none of it.
    assert not h1.path("/run/swactor").exists() and not h1.path("/run/swactor-host").exists()

    # The installer's own start, on a host whose main process is something else (a shell; here a
    # sleep, which reaps nothing: the stopped supervisor stays a zombie): the supervisor detached,
    # every unit active before the install returns, h1 back in the pool. A re-install stops it,
    # replaces the code and starts it again; the uninstall stops it for good.
    h1.start_command(["sleep", "infinity"])
    h1.wait_started()
    t0 = time.monotonic()
    _, first = install_detached(h1, h1_args)
    wait_pool(h0, 2)
    timings["h1 installed again, started detached, in the pool"] = time.monotonic() - t0
    t0 = time.monotonic()
    stderr, second = install_detached(h1, ["--no-systemd", *h1_args])  # asked for now, not detected
    assert "stopping the running supervisor and its services (swactor-host stop)" in stderr, stderr
    assert "systemd is not running" not in stderr and "swactor-host (--no-systemd)" in stderr, stderr
    assert second != first
    timings["h1 re-installed (stop, replace, start)"] = time.monotonic() - t0
    t0 = time.monotonic()
    check_uninstall(h1)
    timings["uninstall h1"] = time.monotonic() - t0
    h1.terminate(timeout_s=10, sig=signal.SIGKILL)  # the sleep (PID 1 ignores SIGTERM without a handler)
    timings["total"] = time.monotonic() - t_start
    print("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()), flush=True)

    # The supervised container's output (the sleep's container wrote none): checked last, so that a
    # stray line in it does not hide what the checks above find.
    print(f"{h1.name}: log stream of services {sorted(check_log_stream(h1))}", flush=True)
