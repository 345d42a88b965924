"""Flood benchmark (issue 13): decode tok/s of an S = 3 run with and without hostile traffic at one
host's edge driver, on a local cluster in network namespaces (root).

    sudo .venv/bin/python bench/flood.py [--max-tokens 48] [--rounds 2] [--target 0] [--no-bad-certs]
                                         [--json bench/out/flood.json]

The hostile side is a fourth namespace on the cluster's bridge, not a member (tests/harness/flood.py):
one process sending junk QUIC Initials as fast as it can (tests/harness/udp_flood.py) and one doing
wrong-certificate handshakes over and over (tests/harness/bad_handshakes.py), both at the target
host's edge endpoint (default host 0: its driver carries the most edge ends, the orchestrator's
token-in and token-out besides stage 0's). After one warm-up run, each round is an unflooded run
and a flooded run of the same request (greedy, ignore_eos, the same prompt); the medians give the
ratio. Printed: flooded vs unflooded decode tok/s and their ratio (aim >= 0.8), the target driver's
RSS before / peak / after the flood, junk packets sent and the sender's rate, what the driver
refused (by reason) and answered with Retry, UDP datagrams the kernel dropped at the target
(receive buffer full), and the wrong-certificate handshakes tried / refused. On a shared 2-core box
the sender alone takes a core the pipeline would otherwise use: the load average is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swactor.localcluster import ClusterSpec, LocalCluster  # noqa: E402
from swactor.localcluster.layout import EDGE_PORT  # noqa: E402
from swactor.localcluster.run import follow  # noqa: E402
from swactor.v1 import orchestrator_pb2 as opb  # noqa: E402
from swactor.v1 import orchestrator_pb2_grpc  # noqa: E402
from tests.harness.flood import Flood, RssSampler, admission, edge_pid, rss_kib, udp_rcvbuf_errors, wait_for  # noqa: E402

PROMPT = "Once upon a time"
CONTROL_PORT = 7399  # nothing listens there


def refused(st: object) -> dict[str, int]:
    return dict(st.refused)  # type: ignore[attr-defined]


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2, help="unflooded + flooded run pairs")
    p.add_argument("--target", type=int, default=0, help="host index whose edge driver is flooded")
    p.add_argument("--no-bad-certs", action="store_true", help="junk Initials only")
    p.add_argument("--control", action="store_true",
                   help="send the junk to a closed UDP port of the target instead: the sender's and the kernel's "
                        "cost without the driver's (a baseline for the ratio on this machine)")
    p.add_argument("--compute-threads", type=int, default=0)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "out" / "flood.json")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("bench/flood.py needs root (network namespaces)", file=sys.stderr)
        return 2
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; S=3, {a.max_tokens} tokens, "
          f"flood target host {a.target}", flush=True)
    spec = ClusterSpec(hosts=3, netns=True, compute_threads=a.compute_threads)
    req = opb.SubmitRunRequest(prompt=PROMPT, stages=3, max_tokens=a.max_tokens, ignore_eos=True)
    plain: list[float] = []
    flooded: list[float] = []
    rounds: list[dict[str, object]] = []
    with LocalCluster(spec, progress=lambda s: print(f"  {s}", flush=True)) as cluster, cluster.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        warm = follow(stub, req, timeout_s=600)
        print(f"warm-up: {warm.outcome}, decode {warm.decode_tok_s or 0:.2f} tok/s", flush=True)
        pid = edge_pid(cluster, a.target)
        flood = Flood(cluster, a.target, bad_certs=not a.no_bad_certs and not a.control,
                      junk_port=CONTROL_PORT if a.control else EDGE_PORT)
        for r in range(a.rounds):
            res = follow(stub, req, timeout_s=600)
            assert res.outcome == "completed", res.summary()
            plain.append(res.decode_tok_s or 0.0)
            before = admission(cluster, a.target)
            drops0, rss0 = udp_rcvbuf_errors(cluster, a.target), rss_kib(pid)
            with RssSampler(pid) as rss:
                flood.start()
                # the flood is on once the driver refuses (the sender needs a moment to start)
                n0 = sum(refused(before).values())
                if a.control:
                    wait_for(lambda: bool(flood.procs) and flood.alive(), "the sender")
                else:
                    wait_for(lambda n0=n0: sum(refused(admission(cluster, a.target)).values()) > n0,
                             "the driver refusing the flood")
                res = follow(stub, req, timeout_s=600)
                alive = flood.alive()
                reports = flood.stop()
            wait_for(lambda: admission(cluster, a.target).half_open == 0, "half-open handshakes drained")
            after = admission(cluster, a.target)
            rss1 = rss_kib(pid)
            assert res.outcome == "completed", res.summary()
            flooded.append(res.decode_tok_s or 0.0)
            row = {"unflooded_tok_s": plain[-1], "flooded_tok_s": flooded[-1], "flood_ran_throughout": alive,
                   "rss_kib": {"before": rss0, "peak": rss.peak, "after": rss1}, "senders": reports,
                   "refused": diff(refused(after), refused(before)),
                   "retries_sent": after.retries_sent - before.retries_sent,
                   "handshakes_admitted": after.handshakes_admitted - before.handshakes_admitted,
                   "kernel_rcvbuf_drops": udp_rcvbuf_errors(cluster, a.target) - drops0}
            rounds.append(row)
            print(f"round {r + 1}: unflooded {plain[-1]:.2f} tok/s, flooded {flooded[-1]:.2f} tok/s "
                  f"(ratio {flooded[-1] / plain[-1]:.2f}); load {os.getloadavg()[0]:.2f}", flush=True)
    up, fl = statistics.median(plain), statistics.median(flooded)
    last = rounds[-1]
    junk = last["senders"].get("junk", {})  # type: ignore[union-attr]
    certs = last["senders"].get("bad_certs", {})  # type: ignore[union-attr]
    rss = last["rss_kib"]
    print(f"\ndecode tok/s (median of {a.rounds}): unflooded {up:.2f}, flooded {fl:.2f}, ratio {fl / up:.2f} (aim >= 0.8)")
    print(f"edge driver RSS (host {a.target}, last round): before {rss['before'] / 1024:.1f} MiB, "  # type: ignore[index]
          f"peak {rss['peak'] / 1024:.1f} MiB, after {rss['after'] / 1024:.1f} MiB")  # type: ignore[index]
    print(f"junk Initials sent: {junk.get('sent', 0)} in {junk.get('seconds', 0)} s ({junk.get('rate', 0)}/s); "
          f"kernel receive-buffer drops at the target: {last['kernel_rcvbuf_drops']}")
    print(f"driver: refused {last['refused']}, Retry sent {last['retries_sent']}, "
          f"handshakes admitted {last['handshakes_admitted']}")
    if certs:
        print(f"wrong-certificate handshakes: {certs.get('attempts', 0)} tried, {certs.get('refused', 0)} refused in TLS, "
              f"{certs.get('accepted', 0)} accepted, {certs.get('unanswered', 0)} unanswered (filter / Retry budget), "
              f"{certs.get('closed', 0) + certs.get('timeouts', 0)} other")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"unflooded_tok_s": plain, "flooded_tok_s": flooded, "ratio": fl / up,
                                  "rounds": rounds, "max_tokens": a.max_tokens, "target": a.target,
                                  "load_average": os.getloadavg()[0]}, indent=1))
    print(f"figures: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
