"""WAN benchmark (issue 22 item 6): a local pool in network namespaces at one-way delays and losses between its hosts
(localcluster/linkshaping.py: NFQUEUE delayer, iptables loss), 3-stage and 2-stage runs through it, beside the
latency model, and the weights fetched over a rate-capped delayed link.

  .venv/bin/python bench/wan.py [--delays 0,10,25,50,75] [--losses 0,1,2] [--stages 2,3] [--max-tokens 24]
                                [--long-prompt 512] [--fetch-delay-ms 50 --fetch-rate-mbit 100] [--json PATH]

Per (loss, delay): one pool of max(stages) hosts. Per S: a first run (fetches the stages' weights from host 0's
model server, loads them), a measured run (decode ms per token: median gap between tokens; TTFT from SubmitRun), and
a run of a --long-prompt prompt (prefill: the services' readiness barrier -> first token).

Latency model: a token crosses the hops of the ring orchestrator -> stage 0 -> ... -> orchestrator that join two
hosts (the planner puts stage 0 on the orchestrator's host, so S of them), each one way:
    decode ms/token(delay) = decode ms/token(0 ms, no loss) + hops between hosts x delay
Prefill chunks are pipelined over the hops, so a long prompt should pay the hops about once, not once per chunk:
the aim is prefill(50 ms) <= 2 x prefill(0 ms). The fetch run is one more pool at --fetch-delay-ms and
--fetch-rate-mbit: each stage host's weight ranges (WEIGHTS_DOWNLOADED: bytes fetched and seconds) as a share of the
link's rate (aim >= 80 %).

Numbers on a shared 2-core box: every host's services share two cores, so the 0 ms figures are CPU-bound; what the
delays add is what this measures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import statistics
import sys

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.run import RunResult, follow
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "llamacpp_greedy.json"
PROMPT = "Write a Python function that reverses a string."


def prompt_ids() -> list[int]:
    """PROMPT through the chat template, as llama.cpp tokenized it (the fixture)."""
    cases = json.loads(FIXTURE.read_text())["cases"]
    return next(c for c in cases if c["question"] == PROMPT and c["chat_template"])["prompt_tokens"]


def decode_ms(res: RunResult) -> float:
    """Median ms between consecutive tokens (the first token's prefill left out)."""
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(res.token_s)]
    return statistics.median(gaps) if gaps else float("nan")


def host_hops(run: opb.Run, origin: int) -> int:
    """The hops of the run's ring that join two hosts."""
    stops = [origin, *(p.node_id for p in run.placement), origin]
    return sum(a != b for a, b in itertools.pairwise(stops))


def fetch_rates(res: RunResult, origin: int) -> list[float]:
    """MB/s of each stage host's weight fetch (not host 0's: it reads the model server on its own host)."""
    out = []
    for ev in res.events:
        if ev.kind == pb.WEIGHTS_DOWNLOADED and ev.node_id != origin and ev.counters["duration_ms"] > 0:
            out.append(ev.counters["bytes_fetched"] / 1e6 / (ev.counters["duration_ms"] / 1000))
    return out


def measure(links: LinkConditions, stages: list[int], max_tokens: int, long_ids: list[int]) -> dict[int, dict]:
    spec = ClusterSpec(hosts=max(stages), netns=True, links=links, readiness_timeout_s=600.0)
    out: dict[int, dict] = {}
    with LocalCluster(spec, progress=lambda s: print(f"    {s}", file=sys.stderr, flush=True)) as c, \
            c.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        origin = c.node_ids[0]
        for s in stages:
            req = opb.SubmitRunRequest(prompt=PROMPT, stages=s, max_tokens=max_tokens, ignore_eos=True)
            first = follow(stub, req, timeout_s=900)
            res = follow(stub, req, timeout_s=900)
            long = follow(stub, opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=long_ids), stages=s, max_tokens=1),
                          timeout_s=900)
            for r in (first, res, long):
                assert r.finished is not None and r.finished.outcome == opb.RUN_OUTCOME_COMPLETED, r.summary()
            out[s] = {"decode_ms": decode_ms(res), "ttft_s": res.ttft_s, "prefill_s": long.summary()["prefill_s"],
                      "host_hops": host_hops(res.finished, origin), "fetch_mb_s": fetch_rates(first, origin),
                      "placement": [p.node_id for p in res.finished.placement]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delays", default="0,10,25,50,75", help="one-way delays between hosts, ms")
    ap.add_argument("--losses", default="0,1,2", help="loss between hosts, percent")
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--long-prompt", type=int, default=512)
    ap.add_argument("--fetch-delay-ms", type=float, default=50.0)
    ap.add_argument("--fetch-rate-mbit", type=float, default=100.0, help="0: no fetch run")
    ap.add_argument("--json", type=pathlib.Path, default=ROOT / "bench" / "out" / "wan.json")
    a = ap.parse_args()
    delays = [float(d) for d in a.delays.split(",")]
    losses = [float(p) for p in a.losses.split(",")]
    stages = [int(s) for s in a.stages.split(",")]
    ids = prompt_ids()
    long_ids = (ids * (a.long_prompt // len(ids) + 1))[:a.long_prompt]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; delays {delays} ms one way, losses {losses} %, "
          f"S {stages}, {a.max_tokens} tokens, prefill of {len(long_ids)} tokens", flush=True)
    rows: list[dict] = []
    base: dict[int, dict] = {}
    for loss in losses:
        for delay in delays:
            print(f"  pool at one-way {delay:g} ms, loss {loss:g} %", flush=True)
            got = measure(LinkConditions(delay_ms=delay, loss_pct=loss), stages, a.max_tokens, long_ids)
            for s, m in got.items():
                if delay == 0 and loss == 0:
                    base[s] = m
                b = base.get(s)
                model = b["decode_ms"] + m["host_hops"] * delay if b else None
                rows.append({"stages": s, "delay_ms": delay, "loss_pct": loss, **m, "model_ms": model,
                             "vs_model": m["decode_ms"] / model if model else None,
                             "prefill_vs_0ms": m["prefill_s"] / b["prefill_s"] if b and b["prefill_s"] else None})
    print("\n S  delay ms  loss %  decode ms/token  model ms/token  measured/model  tok/s   TTFT s  prefill s  "
          "prefill / 0 ms  host hops")
    for r in rows:
        model = f"{r['model_ms']:.1f}" if r["model_ms"] else "-"
        ratio = f"{r['vs_model']:.2f}" if r["vs_model"] else "-"
        pre = f"{r['prefill_vs_0ms']:.2f}" if r["prefill_vs_0ms"] else "-"
        print(f"{r['stages']:>2} {r['delay_ms']:>9g} {r['loss_pct']:>7g} {r['decode_ms']:>16.1f} {model:>15} "
              f"{ratio:>15} {1000 / r['decode_ms']:>6.1f} {r['ttft_s']:>8.2f} {r['prefill_s']:>10.2f} {pre:>15} "
              f"{r['host_hops']:>10}")
    fetch = None
    if a.fetch_rate_mbit > 0:
        links = LinkConditions(delay_ms=a.fetch_delay_ms, rate_mbit=a.fetch_rate_mbit)
        print(f"  weights fetch pool: {links.describe()}", flush=True)
        got = measure(links, [max(stages)], 2, long_ids[:16])
        rates = got[max(stages)]["fetch_mb_s"]
        link_mb_s = a.fetch_rate_mbit / 8
        fetch = {"delay_ms": a.fetch_delay_ms, "rate_mbit": a.fetch_rate_mbit, "mb_s": rates,
                 "share_of_link": [r / link_mb_s for r in rates]}
        print(f"\nweights over one-way {a.fetch_delay_ms:g} ms at {a.fetch_rate_mbit:g} Mbit/s ({link_mb_s:.1f} MB/s): "
              + ", ".join(f"{r:.1f} MB/s ({r / link_mb_s:.0%})" for r in rates) + " per stage host (aim >= 80 %)")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"rows": rows, "fetch": fetch}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
