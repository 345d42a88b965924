"""Membership benchmark: convergence and failure-detection time of real swactor-membership
processes, one per network namespace, for N = 3, 5, 8 hosts (needs root).

    .venv/bin/python bench/membership.py [--sizes 3 5 8] [--runs 3] [--idle-s 30]

Per run: all N processes are spawned at once; "convergence" is the time from spawn (and from the
moment the last node served gRPC) until every host lists all N alive. Then one non-seed host is
SIGKILLed; "detection" is the time until every other host lists it dead (first: until one does).
The idle run keeps N = max(sizes) hosts up for --idle-s seconds and counts suspect/dead events
(false positives), at the WAN conditions --idle-delay-ms (one way) and --idle-loss-pct give every packet between
hosts (localcluster/linkshaping.py), and prints the RTTs the members measured (membership/rtt.py). Targets (issue):
convergence <= 3 s and detection <= 5 s at N = 8, zero false positives; issue 22: zero false suspicions at 150 ms RTT
and 2 % loss over 10 minutes (`--sizes 5 --runs 1 --idle-s 600 --idle-delay-ms 75 --idle-loss-pct 2`). Figures go to
stdout and bench/out/membership.json.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swactor.localcluster.linkconditions import LinkConditions  # noqa: E402
from swactor.localcluster.linkshaping import LinkShaping, ShapedHost  # noqa: E402
from swactor.membership.config import MembershipConfig  # noqa: E402
from swactor.v1 import membership_pb2 as pb  # noqa: E402
from tests.harness import NetnsCluster, netns_unavailable_reason  # noqa: E402
from tests.membership.cluster import MembershipCluster, Node, wait_until  # noqa: E402

POLL_S = 0.05


def _all_alive(nodes: list[Node]) -> bool:
    ids = {n.node_id for n in nodes}
    return all({m.metadata.node_id for m in n.members() if m.status == pb.MEMBER_STATUS_ALIVE} == ids for n in nodes)


def _dump(nodes: list[Node]) -> None:
    index = {n.node_id: i for i, n in enumerate(nodes)}
    for i, n in enumerate(nodes):
        view = [(index.get(m.metadata.node_id, "?"), pb.MemberStatus.Name(m.status)[14:])
                for m in n.members(include_departed=True)]
        print(f"h{i} sees {view}\n{n.log_tail(8)}", file=sys.stderr)


def one_run(n: int, workdir: Path) -> dict[str, float]:
    with NetnsCluster(n, prefix="bench") as net:
        cluster = MembershipCluster(net, workdir)
        try:
            t0 = time.monotonic()
            started = [cluster.start(i) for i in range(n)]
            nodes = [cluster.ready(s, timeout=60) for s in started]
            t_ready = time.monotonic()
            try:
                wait_until(lambda: _all_alive(nodes), 60, f"{n} hosts to converge", interval=POLL_S)
            except AssertionError:
                _dump(nodes)
                raise
            t_conv = time.monotonic()

            victim, others = nodes[-1], nodes[:-1]
            t1 = time.monotonic()
            victim.signal(signal.SIGKILL)
            first: float | None = None
            deadline = t1 + 60
            while time.monotonic() < deadline:
                dead = [o.status_of(victim.node_id) == pb.MEMBER_STATUS_DEAD for o in others]
                if any(dead) and first is None:
                    first = time.monotonic() - t1
                if all(dead):
                    break
                time.sleep(POLL_S)
            else:
                raise AssertionError("SIGKILLed host not detected within 60 s")
            return {
                "converge_from_spawn_s": t_conv - t0,
                "converge_from_last_ready_s": t_conv - t_ready,
                "detect_first_s": first or 0.0,
                "detect_all_s": time.monotonic() - t1,
            }
        finally:
            cluster.stop_all()


def idle_run(n: int, seconds: float, workdir: Path, links: LinkConditions) -> dict[str, object]:
    with NetnsCluster(n, prefix="bench") as net:
        cluster = MembershipCluster(net, workdir)
        shaping = LinkShaping(links, [ShapedHost(f"h{h.index}", h.ns, workdir / f"link-h{h.index}") for h in net.hosts])
        try:
            for h in net.hosts:
                (workdir / f"link-h{h.index}").mkdir()
            shaping.apply(timeout_s=30)  # before the first packet: the pool forms at these conditions
            nodes = [cluster.ready(s, timeout=60) for s in [cluster.start(i) for i in range(n)]]
            wait_until(lambda: _all_alive(nodes), 60, f"{n} hosts to converge", interval=POLL_S)
            watches = [cluster.watch(node) for node in nodes]
            time.sleep(seconds)
            bad = {pb.MEMBER_EVENT_KIND_SUSPECT, pb.MEMBER_EVENT_KIND_DEAD}
            false_events = sum(1 for w in watches for e in w.events if e.kind in bad)
            suspicions = sum(node.get_self().counters.suspicions for node in nodes)
            still = _all_alive(nodes)
            rtts = [r.rtt_us / 1000 for r in nodes[0].stub.GetRtts(pb.GetRttsRequest(), timeout=2).rtts]
            return {"hosts": n, "seconds": seconds, "links": links.as_dict(), "false_suspect_or_dead_events": false_events,
                    "suspicions_raised": suspicions, "all_alive_at_end": still, "rtt_pairs": len(rtts),
                    "rtt_ms_median": statistics.median(rtts) if rtts else None,
                    "rtt_ms_max": max(rtts) if rtts else None}
        finally:
            cluster.stop_all()
            shaping.remove()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[3, 5, 8])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--idle-s", type=float, default=30.0)
    p.add_argument("--idle-delay-ms", type=float, default=0.0, help="one-way delay between hosts in the idle run")
    p.add_argument("--idle-loss-pct", type=float, default=0.0, help="packets lost between hosts in the idle run")
    args = p.parse_args()
    reason = netns_unavailable_reason()
    if reason:
        raise SystemExit(f"bench/membership.py: {reason}")
    cfg = MembershipConfig()
    print(f"probe interval {cfg.probe_interval_s} s, probe timeout {cfg.probe_timeout_s} s, "
          f"suspicion mult {cfg.suspicion_mult} (max x{cfg.suspicion_max_mult}), runs per size {args.runs}")
    results: dict[str, object] = {"probe_interval_s": cfg.probe_interval_s, "sizes": {}}
    print(f"{'N':>3} {'converge(spawn)':>16} {'converge(ready)':>16} {'detect(first)':>14} {'detect(all)':>12}")
    with tempfile.TemporaryDirectory(prefix="swactor-bench-membership-") as tmp:
        for n in args.sizes:
            runs = []
            for r in range(args.runs):
                d = Path(tmp) / f"n{n}-r{r}"
                d.mkdir()
                runs.append(one_run(n, d))
            med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
            results["sizes"][str(n)] = {"median": med, "runs": runs}  # type: ignore[index]
            print(f"{n:>3} {med['converge_from_spawn_s']:>15.2f}s {med['converge_from_last_ready_s']:>15.2f}s "
                  f"{med['detect_first_s']:>13.2f}s {med['detect_all_s']:>11.2f}s")
        if args.idle_s > 0:
            d = Path(tmp) / "idle"
            d.mkdir()
            links = LinkConditions(delay_ms=args.idle_delay_ms, loss_pct=args.idle_loss_pct)
            idle = idle_run(max(args.sizes), args.idle_s, d, links)
            results["idle"] = idle
            print(f"idle N={idle['hosts']} for {idle['seconds']:.0f} s, links: {links.describe()}: "
                  f"{idle['false_suspect_or_dead_events']} false suspect/dead events, {idle['suspicions_raised']} "
                  f"suspicions, all alive at end: {idle['all_alive_at_end']}; RTT measured by the members over "
                  f"{idle['rtt_pairs']} pairs: median {idle['rtt_ms_median']} ms, max {idle['rtt_ms_max']} ms")
    n8 = results["sizes"].get("8", {}).get("median") if isinstance(results["sizes"], dict) else None  # type: ignore[union-attr]
    if n8:
        print(f"targets at N=8: convergence {n8['converge_from_last_ready_s']:.2f} s / 3 s "
              f"(ratio {n8['converge_from_last_ready_s'] / 3:.2f}), detection {n8['detect_all_s']:.2f} s / 5 s "
              f"(ratio {n8['detect_all_s'] / 5:.2f})")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "membership.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
