"""Runs in flight (docs/runs-in-flight.md): aggregate tokens/s, per-run time per token (p50, p99) and time to first
token with 1, 2, 4, 8 runs submitted at once, for S = 1 and 3 stages (one host each) of a local cluster, beside one run
alone in the same invocation (the 1 column); with --link-delay-ms the hosts' links are delayed (NFQUEUE delayer,
namespaces only); the KV memory a run slot costs per stage comes from the orchestrator's dry run.

  .venv/bin/python bench/concurrency.py [--stages 1,3] [--runs 1,2,4,8] [--max-tokens 32] [--link-delay-ms 40]
                                        [--soak 200] [--device CPU] [--json bench/out/concurrency.json]

Each run decodes --max-tokens tokens (ignore_eos: equal lengths), from one of the llama.cpp fixture's prompts (3 to
40 tokens: the runs join at different times). The first run of each plan loads the stages and compiles every batch
width (or loads them from the graph cache): it is the warm-up, not measured. Aggregate = every run's tokens / the
wall time from the first SubmitRun to the last token; CPU ms per token of each kind of service (all hosts) says where
a 2-core box's time goes. Time per token = the gaps between a run's consecutive tokens at
the client (decode), over every run of the row. TTFT = SubmitRun to the run's first token. All hosts share this
machine's cores: S=3 computes its three stages on 2 cores, so the S=3 aggregate measures how well stage k computes one
run's step while stage k+1 computes another's and how much batching saves, not GPU scaling.

--soak N then sends N mixed runs through the last S, four at a time (lengths 2..17 tokens; every 5th stopped after
its first token, every 7th with stop_when_unwatched and its client gone after its first token) and prints every
service process's open fds and RSS, and every arena's leases, before and after (the aim: no growth).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))
FIXTURE = ROOT / "tests" / "fixtures" / "llamacpp_greedy.json"


def cpu_seconds(cluster: Any) -> dict[str, float]:
    from pipeline import cpu_seconds as per_service  # bench/pipeline.py: CPU seconds of each kind of service

    return per_service(cluster)


def prompts() -> list[list[int]]:
    return [c["prompt_tokens"] for c in json.loads(FIXTURE.read_text())["cases"]]


def row(results: list, n: int) -> dict[str, float]:
    gaps = np.concatenate([np.diff(r.token_s) for r in results if len(r.token_s) > 1]) * 1000
    tokens = sum(len(r.token_ids) for r in results)
    span = max(r.token_s[-1] for r in results) - min(r.submitted_s for r in results)
    ttft = [r.ttft_s for r in results if r.ttft_s is not None]
    return {"runs": n, "tokens": tokens, "aggregate_tok_s": tokens / span, "tpt_p50_ms": float(np.percentile(gaps, 50)),
            "tpt_p99_ms": float(np.percentile(gaps, 99)), "ttft_p50_s": float(np.median(ttft)), "ttft_max_s": max(ttft),
            "completed": sum(r.outcome == "completed" for r in results)}


def processes(cluster: Any) -> dict[str, int]:
    """Every service's pid and its children's (a worker's compute process), by name."""
    out = {}
    for svc in cluster.services:
        out[svc.name] = svc.pid
        for task in pathlib.Path(f"/proc/{svc.pid}/task").glob("*"):
            for child in (task / "children").read_text().split():
                out[f"{svc.name}/{child}"] = int(child)
    return out


def usage(cluster: Any) -> dict[str, tuple[int, int]]:
    """(open fds, RSS KiB) of every service process; leases per arena as ("arena hN", count, 0)."""
    out = {}
    for name, pid in processes(cluster).items():
        rss = next(int(x.split()[1]) for x in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                   if x.startswith("VmRSS:"))
        out[name] = (len(os.listdir(f"/proc/{pid}/fd")), rss)
    for i in range(len(cluster.hosts)):
        out[f"arena h{i} leases"] = (len(cluster.arena_stats(i).leases), 0)
    return out


def soak(cluster: Any, stub: Any, request: Callable[[int], Any], n: int) -> dict[str, object]:
    from swactor.localcluster.run import follow
    from swactor.v1 import orchestrator_pb2 as opb

    def one(i: int) -> str:
        req = request(i)
        req.max_tokens = 2 + i % 16
        if i % 7 == 0:  # its client goes away after the first token
            req.stop_when_unwatched = True
            resp = stub.SubmitRun(req, timeout=30)
            for u in stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id), timeout=600):
                if u.HasField("token"):
                    break
            return "client gone"
        stopper = (lambda u, r: stub.StopRun(opb.StopRunRequest(run_id=r.run_id), timeout=30)
                   if u.HasField("token") and len(r.token_ids) == 1 else None) if i % 5 == 0 else (lambda u, r: None)
        return follow(stub, req, on_update=stopper, timeout_s=600).outcome

    follow(stub, request(0), timeout_s=600)  # a warm pool: what the first runs allocate once is not growth
    before, t = usage(cluster), time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(one, range(n)))
    time.sleep(2.0)  # the last teardowns
    after = usage(cluster)
    print(f"\nsoak: {n} mixed runs in {time.monotonic() - t:.0f} s, outcomes "
          f"{ {o: outcomes.count(o) for o in sorted(set(outcomes))} }")
    print("| process | fds before | after | RSS KiB before | after |\n| --- | --- | --- | --- | --- |")
    for name in sorted(before):
        b, e = before[name], after.get(name, (-1, -1))
        print(f"| {name} | {b[0]} | {e[0]} | {b[1]} | {e[1]} |")
    return {"runs": n, "outcomes": outcomes, "before": before, "after": after}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default="1,3")
    ap.add_argument("--runs", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--link-delay-ms", type=float, default=0.0)
    ap.add_argument("--soak", type=int, default=0, help="mixed runs to send after the table (0: none)")
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--compute-threads", type=int, default=0,
                    help="[worker].compute_threads of every host (0 = the local cluster's default: every core)")
    ap.add_argument("--json", type=pathlib.Path, default=ROOT / "bench" / "out" / "concurrency.json")
    a = ap.parse_args()
    from swactor.localcluster import ClusterSpec, LocalCluster
    from swactor.localcluster.linkconditions import LinkConditions
    from swactor.localcluster.run import follow
    from swactor.v1 import orchestrator_pb2 as opb
    from swactor.v1 import orchestrator_pb2_grpc

    stages, counts = [int(s) for s in a.stages.split(",")], [int(n) for n in a.runs.split(",")]
    ps = prompts()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; {a.max_tokens} tokens a run, runs {counts}, "
          f"link delay {a.link_delay_ms:g} ms one way, device {a.device}", flush=True)
    out: dict[str, object] = {"link_delay_ms": a.link_delay_ms, "max_tokens": a.max_tokens, "stages": {}}
    spec = ClusterSpec(hosts=max(stages), device=a.device, slots=max(counts), compute_threads=a.compute_threads, links=LinkConditions(delay_ms=a.link_delay_ms),
                       readiness_timeout_s=900.0)  # the first load compiles every batch width: minutes on a CPU
    with LocalCluster(spec, progress=lambda s: print(f"  {s}", flush=True)) as cluster, cluster.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)

        def request(i: int, s: int) -> opb.SubmitRunRequest:
            return opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=ps[i % len(ps)]), stages=s,
                                        max_tokens=a.max_tokens, ignore_eos=True)

        for s in stages:
            plan = stub.Plan(request(0, s), timeout=60)
            per_slot = [st.kv_cache_bytes for st in plan.placement]
            t = time.monotonic()
            warm = follow(stub, request(0, s), timeout_s=1200)
            print(f"S={s}: warm-up run {warm.outcome} in {time.monotonic() - t:.1f} s (loads, compiles every batch "
                  f"width); KV per run slot per stage {[f'{b / 2**20:.1f} MiB' for b in per_slot]}, slots "
                  f"{[st.run_slots for st in plan.placement]}", flush=True)
            rows = []
            for n in counts:
                cpu0 = cpu_seconds(cluster)
                with ThreadPoolExecutor(n) as pool:
                    results = list(pool.map(partial(follow, stub, timeout_s=1200), [request(i, s) for i in range(n)]))
                rows.append(row(results, n))
                rows[-1]["cpu_ms_per_token"] = {k: (v - cpu0.get(k, 0.0)) * 1000 / rows[-1]["tokens"]
                                                for k, v in cpu_seconds(cluster).items()}
                base = rows[0]
                r = rows[-1]
                print(f"  {n} in flight: aggregate {r['aggregate_tok_s']:6.2f} tok/s ({r['aggregate_tok_s'] / base['aggregate_tok_s']:.2f}x "
                      f"one run), time/token p50 {r['tpt_p50_ms']:6.1f} ms ({r['tpt_p50_ms'] / base['tpt_p50_ms']:.2f}x) "
                      f"p99 {r['tpt_p99_ms']:6.1f} ms, TTFT p50 {r['ttft_p50_s']:.2f} s max {r['ttft_max_s']:.2f} s; "
                      f"{r['completed']}/{n} completed; CPU ms per token "
                      f"{ {k: round(v, 1) for k, v in sorted(r['cpu_ms_per_token'].items())} }", flush=True)
            out["stages"][str(s)] = {"kv_bytes_per_slot": per_slot, "rows": rows}  # type: ignore[index]
        if a.soak:
            out["soak"] = soak(cluster, stub, lambda i: request(i, stages[-1]), a.soak)
    print("\n| S | runs in flight | aggregate tok/s | vs one run | time/token p50 ms | vs one run | p99 ms | TTFT p50 s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for s, res in out["stages"].items():  # type: ignore[union-attr]
        base = res["rows"][0]
        for r in res["rows"]:
            print(f"| {s} | {r['runs']} | {r['aggregate_tok_s']:.2f} | {r['aggregate_tok_s'] / base['aggregate_tok_s']:.2f}x | "
                  f"{r['tpt_p50_ms']:.1f} | {r['tpt_p50_ms'] / base['tpt_p50_ms']:.2f}x | {r['tpt_p99_ms']:.1f} | "
                  f"{r['ttft_p50_s']:.2f} |")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
