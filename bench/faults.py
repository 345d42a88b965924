"""Fault table and load with faults (issue 12 items 3-4), on the fault suite's real local pool.

    .venv/bin/python bench/faults.py table      # run tests/faults, print the fault table
    .venv/bin/python bench/faults.py load [--runs 50]
    .venv/bin/python bench/faults.py resume [--after 10,50,200]

`table` runs the fault suite (every §36 source it injects, one test each, tests/faults/) and prints
its table: fault, detected by, reason, seconds from injection to the terminal outcome, arena leases
left on the surviving hosts after teardown, the next run. It is also written to bench/out/faults.json
and kept in docs/faults.md.

`load`: `--runs` short runs back to back on a healthy 3-host pool, then as many again while host 1
is killed (every process, as power loss) and restarted in the middle. Printed before and after
each phase, per host: open fds and RSS of every service process (the compute process included) and
the arena's live leases. Aims (not asserted): zero growth in fds and leases, RSS within 10 %;
runs that touch the dead host fault cleanly, later ones complete. Figures also go to
bench/out/faults_load.json.

`resume`: a request submitted with `resume` decodes through h0 -> h1 -> h2 (S=3) until it has generated
`--after` tokens, then h2 is killed (every process, as power loss). Printed per count: when the run's fault was
detected, when the first token of the run that continues the request arrived (both from the loss), the stages it
was re-planned on, and whether the client's stream equals the uninterrupted run's tokens (it must). The aim: the
next token <= 5 s after the loss is detected, with 200 tokens already generated. h2 is restarted between counts.
Figures also go to bench/out/faults_resume.json.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from swactor.localcluster import ready as cready  # noqa: E402
from swactor.v1 import orchestrator_pb2 as opb  # noqa: E402
from tests.faults import inject  # noqa: E402
from tests.faults.checks import REPORT_PATH, Row, table  # noqa: E402
from tests.faults.pool import FaultPool, NotYet, children, fault_pool, fd_count, rss_kib, wait_until  # noqa: E402

OUT = ROOT / "bench" / "out" / "faults_load.json"
RESUME_OUT = ROOT / "bench" / "out" / "faults_resume.json"


def run_table(pytest_args: list[str]) -> int:
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "tests/faults", *pytest_args],
                         cwd=ROOT)
    if REPORT_PATH.exists():
        rows = [Row(**r) for r in json.loads(REPORT_PATH.read_text())]
        print(table(rows))
    return rc


def snapshot(pool: FaultPool) -> dict[str, dict[str, int]]:
    """Per host: fds and RSS (KiB) summed over its service processes and their children, live leases."""
    out: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"fds": 0, "rss_kib": 0, "procs": 0})
    for s in pool.cluster.services:
        host = s.name.split("/")[0]
        for pid in [s.pid, *children(s.pid)]:
            if (n := fd_count(pid)) >= 0:
                out[host]["fds"] += n
                out[host]["rss_kib"] += max(rss_kib(pid), 0)
                out[host]["procs"] += 1
    for i in range(len(pool.hosts)):
        try:
            out[f"h{i}"]["leases"] = len(pool.leases(i))
        except Exception:  # a host that is down has no arena to ask
            out[f"h{i}"]["leases"] = -1
    return dict(out)


def _sockets(pid: int) -> dict[str, str]:
    """socket inode -> what it is, from the process's own network namespace view."""
    out: dict[str, str] = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
                f = line.split()
                port = int(f[2].rsplit(":", 1)[1], 16)
                out[f[9]] = f"{proto} to :{port}" if port else f"{proto} listening"
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
            f = line.split()
            out.setdefault(f[6], f"unix {Path(f[7]).name}" if len(f) > 7 else "unix (unnamed)")
    return out


def fd_kinds(pid: int) -> collections.Counter[str]:
    """What a process's fds are: sockets by protocol and peer port or socket name, eventfds, files..."""
    kinds: collections.Counter[str] = collections.Counter()
    socks: dict[str, str] | None = None
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                socks = _sockets(pid) if socks is None else socks
                target = socks.get(target[8:-1], "socket (other)")
            elif target.startswith("/"):
                target = "file " + ("/".join(Path(target).parts[-2:]))
            elif target.startswith("anon_inode:"):
                target = target.split("]")[0] + "]" if "[" in target else target
            else:  # pipe:[inode] and the like: by kind
                target = target.split(":")[0]
            kinds[target] += 1
    return kinds


def fd_detail(pool: FaultPool) -> dict[str, collections.Counter[str]]:
    """Per service process and child (the worker's compute process: "h1/worker/child0"): fds by kind."""
    out: dict[str, collections.Counter[str]] = {}
    for s in pool.cluster.services:
        out[s.name] = fd_kinds(s.pid)
        for i, c in enumerate(children(s.pid)):
            out[f"{s.name}/child{i}"] = fd_kinds(c)
    return out


def show_fd_growth(before: dict[str, collections.Counter[str]], after: dict[str, collections.Counter[str]]) -> None:
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name, collections.Counter()), after.get(name, collections.Counter())
        delta = {k: a[k] - b[k] for k in set(a) | set(b) if a[k] != b[k]}
        if delta:
            print(f"    {name}: " + ", ".join(f"{v:+d} {k}" for k, v in sorted(delta.items())), flush=True)


def show(label: str, snap: dict[str, dict[str, int]], pool: FaultPool | None = None) -> None:
    print(f"  {label}: " + "; ".join(f"{h} fds {v['fds']} rss {v['rss_kib'] / 1024:.0f} MiB leases {v['leases']}"
                                      f" ({v['procs']} procs)" for h, v in sorted(snap.items())), flush=True)
    for h, v in sorted(snap.items()):
        if pool is not None and v.get("leases", 0) > 0:
            print(f"    {h} leases: {pool.leases(int(h[1:]))}", flush=True)


def pool_ready(pool: FaultPool) -> None:
    """The orchestrator judges the pool ready with every node (dead services are being restarted)."""
    try:
        cready.pool_ready(pool.stub, set(pool.cluster.node_ids))
    except cready.NotReady as e:
        raise NotYet(str(e)) from None


def runs(pool: FaultPool, n: int, during: threading.Event | None = None) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()
    for i in range(n):
        if during is not None and i == n // 2:
            during.set()
        try:
            w = pool.run(max_tokens=4, timeout_s=120)
            f = w.finished
            seen["completed" if f and f.outcome == opb.RUN_OUTCOME_COMPLETED else f"faulted {f.reason if f else w.error}"] += 1
        except grpc.RpcError as e:  # refused at once (a pool shortfall while the host is down): wait for it
            seen[f"refused {e.code().name}"] += 1  # type: ignore[attr-defined]
            with contextlib.suppress(TimeoutError):
                wait_until("pool ready", lambda: pool_ready(pool), 180)
    return seen


def load(n: int) -> int:
    figures: dict[str, object] = {"loadavg_start": os.getloadavg()}
    with fault_pool(progress=lambda line: print(line, flush=True)) as pool:
        pool.run(max_tokens=2, timeout_s=300)  # warm: graphs compiled
        before = snapshot(pool)
        fds_before = fd_detail(pool)
        show("healthy, before", before)
        t = time.monotonic()
        healthy = runs(pool, n)
        figures["healthy"] = {"runs": dict(healthy), "seconds": time.monotonic() - t}
        after = snapshot(pool)
        show("healthy, after ", after)
        fds_after = fd_detail(pool)
        show_fd_growth(fds_before, fds_after)
        print(f"  {n} runs in {figures['healthy']['seconds']:.1f} s: {dict(healthy)}", flush=True)  # type: ignore[index]

        kill = threading.Event()
        host_back: dict[str, float] = {}

        def killer() -> None:
            kill.wait()
            t0 = time.monotonic()
            inject.kill_host(pool, 1)
            pool.restart_host(1)
            host_back["s"] = time.monotonic() - t0

        thr = threading.Thread(target=killer, daemon=True)
        thr.start()
        t = time.monotonic()
        faulty = runs(pool, n, during=kill)
        thr.join(300)
        pool.wait_pool(120)
        pool.leases_left((0, 1, 2), timeout_s=15)
        figures["with_host_killed"] = {"runs": dict(faulty), "seconds": time.monotonic() - t,
                                       "host_restart_s": host_back.get("s")}
        end = snapshot(pool)
        show("after the host kill (h1's processes are new ones)", end, pool)
        show_fd_growth(fds_after, fd_detail(pool))
        print(f"  {n} runs with h1 killed and restarted at run {n // 2} in "
              f"{figures['with_host_killed']['seconds']:.1f} s (host back in {host_back.get('s', -1):.1f} s): "
              f"{dict(faulty)}", flush=True)  # type: ignore[index]
        figures.update(before=before, after=after, end=end, loadavg_end=os.getloadavg())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"loadavg {figures['loadavg_start']} -> {figures['loadavg_end']}")
    return 0


def resume(counts: list[int]) -> int:
    from swactor.v1 import common_pb2 as pb

    rows = []
    with fault_pool(progress=lambda line: print(line, flush=True)) as pool:
        pool.run(max_tokens=2, timeout_s=300)  # warm: graphs compiled
        for after in counts:
            total = after + 24
            solo = pool.run(max_tokens=total, timeout_s=600)
            watch = pool.submit(max_tokens=total, resume=True)
            watch.wait_tokens(after, timeout_s=600)
            lost_at = inject.kill_host(pool, 2)
            ended = watch.wait_end(300)
            first = pool.get_run(watch.run_id)
            faulted = [e.time_us / 1e6 for e in watch.events if e.kind == pb.RUN_FAULTED and e.run_id == first.run_id]
            nxt = [e.time_us / 1e6 for e in watch.events if e.kind == pb.TOKEN_RECEIVED and e.run_id != first.run_id]
            last = watch.finished
            # where the seconds to the next token went: the continuing run's lifecycle, from the loss
            phases = {}
            for e in watch.events:
                if e.run_id != first.run_id and pb.LifecycleEventKind.Name(e.kind) not in phases:
                    phases[pb.LifecycleEventKind.Name(e.kind)] = round(e.time_us / 1e6 - lost_at, 2)
            row = {"after": after, "generated_before_loss": len(first.token_ids), "reason": first.reason,
                   "detected_s": round(faulted[0] - lost_at, 2) if faulted else None,
                   "next_token_s": round(nxt[0] - lost_at, 2) if nxt else None,
                   "stages_after": len(last.placement) if last is not None else None,
                   "outcome": opb.RunOutcome.Name(last.outcome) if ended and last is not None else "not ended",
                   "tokens_equal": watch.tokens == solo.tokens, "phases_s": phases}
            rows.append(row)
            print(f"  after {after} tokens: {row}", flush=True)
            pool.restart_host(2)
            pool.wait_pool(300)
    print(f"\n{'tokens before':>13} {'detected s':>10} {'next token s':>12} {'after detection s':>17} {'stages':>6} "
          f"{'tokens equal':>12}")
    for r in rows:
        gap = None if r["next_token_s"] is None or r["detected_s"] is None else r["next_token_s"] - r["detected_s"]
        print(f"{r['generated_before_loss']:>13} {r['detected_s']!s:>10} {r['next_token_s']!s:>12} "
              f"{'-' if gap is None else f'{gap:.2f}':>17} {r['stages_after']!s:>6} {r['tokens_equal']!s:>12}")
    RESUME_OUT.parent.mkdir(parents=True, exist_ok=True)
    RESUME_OUT.write_text(json.dumps({"rows": rows, "loadavg": os.getloadavg()}, indent=1) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("table").add_argument("pytest_args", nargs="*")
    sub.add_parser("load").add_argument("--runs", type=int, default=50)  # fds growth by process and kind too
    sub.add_parser("resume").add_argument("--after", default="10,50,200",
                                          help="tokens generated before the host is lost, comma-separated")
    args = ap.parse_args()
    if args.cmd == "resume":
        return resume([int(n) for n in args.after.split(",")])
    return run_table(args.pytest_args) if args.cmd == "table" else load(args.runs)


if __name__ == "__main__":
    sys.exit(main())
