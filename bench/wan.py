"""WAN benchmark (issue 22 item 6): a local pool in network namespaces at one-way delays and losses between its hosts
(localcluster/linkshaping.py: NFQUEUE delayer, iptables loss), 3-stage and 2-stage runs through it, beside the
latency model, and the weights fetched over a rate-capped delayed link.

  .venv/bin/python bench/wan.py [--delays 0,10,25,50,75] [--losses 0,1,2] [--stages 2,3] [--max-tokens 24]
                                [--long-prompt 512] [--fetch-delay-ms 50 --fetch-rate-mbit 100] [--json PATH]
  .venv/bin/python bench/wan.py --soak-s 600 [--soak-delay-ms 75 --soak-loss-pct 2] [--apply-advice]   (the soak alone)

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

The soak (issue 22 item 5): one pool of 3 hosts at --soak-delay-ms one way (75: 150 ms RTT) and --soak-loss-pct,
3-stage runs back to back for --soak-s seconds (each 16 tokens, every 4th a 3-token chat); it counts every run's
outcome (aim: all completed) and the suspicions the hosts' membership raised over the soak (GetSelf
counters.suspicions, and the members seen anything but Alive when polled each run: aim zero, no host is unhealthy).
Every host starts on the probe timings its seeds' round trips call for (membership/seed_rtt.py; across shaped links
host 0 lists the other hosts as seeds, as docs/operations.md "WAN tuning" tells an operator's first host to). With
--apply-advice, before the soak each host's membership service is also restarted, one at a time, once it has kept the
timings its measured RTT rows call for (probe_timing.json, membership/probe_timing.py).

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
import time
from collections import Counter

import grpc

from swactor.localcluster import ClusterSpec, LocalCluster, ready
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.ready import members
from swactor.localcluster.run import RunResult, follow
from swactor.membership.probe_timing import ADVICE_FILE
from swactor.v1 import common_pb2 as pb
from swactor.v1 import membership_pb2 as mpb
from swactor.v1 import membership_pb2_grpc, orchestrator_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb

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


def measure(links: LinkConditions, stages: list[int], max_tokens: int, long_ids: list[int],
            tables: dict[str, dict[str, object]]) -> dict[int, dict]:
    spec = ClusterSpec(hosts=max(stages), netns=True, links=links, readiness_timeout_s=600.0, tables=tables)
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


def suspicions(cluster: LocalCluster) -> int:
    """The suspicions every host's membership raised so far (GetSelf counters)."""
    total = 0
    for h in cluster.hosts:
        with grpc.insecure_channel(f"unix:{h.sock('membership')}") as ch:
            got = membership_pb2_grpc.MembershipStub(ch).GetSelf(mpb.GetSelfRequest(), timeout=5)
            total += got.counters.suspicions
    return total


def kept_advice(path: pathlib.Path) -> dict[str, float]:
    if not path.exists():
        raise ready.NotReady(f"no {path.name} yet")
    return json.loads(path.read_text())


def apply_kept_advice(c: LocalCluster) -> dict[str, dict[str, float]]:
    """Each host's membership restarted, one host at a time, once it kept its probe timing advice; the pool is
    whole again after each. Returns the advice each host started with."""
    want = set(c.node_ids)
    applied = {}
    for h in c.hosts:
        applied[h.name] = ready.wait_for(f"{h.name}/membership's probe timing advice",
                                         lambda h=h: kept_advice(h.state_dir / ADVICE_FILE), 300.0)
        c.restart(f"{h.name}/membership")
        ready.wait_for(f"{h.name}/membership", lambda h=h: ready.health_serving(h.sock("membership")), 60.0)
        ready.wait_for("membership (every node Available)",
                       lambda: ready.all_available(c.hosts[0].sock("membership"), want), 120.0)
        with c.channel() as ch:
            stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
            ready.wait_for("orchestrator pool", lambda stub=stub: ready.pool_ready(stub, want), 120.0)
        print(f"    {h.name}: membership restarted with the kept advice {applied[h.name]}", flush=True)
    return applied


def soak(links: LinkConditions, seconds: float, tables: dict[str, dict[str, object]],
         apply_advice: bool = False) -> dict[str, object]:
    """3-stage runs back to back through a pool at `links` for `seconds`: outcomes and false suspicions (after
    applying each host's kept probe timing advice, with `apply_advice`)."""
    spec = ClusterSpec(hosts=3, netns=True, links=links, readiness_timeout_s=600.0, tables=tables)
    outcomes: Counter[str] = Counter()
    not_alive: list[str] = []
    decode: list[float] = []
    with LocalCluster(spec, progress=lambda s: print(f"    {s}", file=sys.stderr, flush=True)) as c, \
            c.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        warm = follow(stub, opb.SubmitRunRequest(prompt=PROMPT, stages=3, max_tokens=2), timeout_s=900)
        assert warm.finished is not None and warm.finished.outcome == opb.RUN_OUTCOME_COMPLETED, warm.summary()
        applied = apply_kept_advice(c) if apply_advice else {}
        before = suspicions(c)
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < seconds:
            chat = n % 4 == 3
            req = opb.SubmitRunRequest(prompt="Say hi." if chat else PROMPT, stages=3, max_tokens=3 if chat else 16,
                                       ignore_eos=not chat, raw=not chat)
            try:
                res = follow(stub, req, timeout_s=300)
            except grpc.RpcError as e:  # refused: the pool has too few Available (or Suspect) hosts
                outcomes[f"refused {e.code().name}"] += 1  # type: ignore[attr-defined]
                print(f"    run {n}: refused: {e.details()}", flush=True)  # type: ignore[attr-defined]
                n += 1
                time.sleep(1.0)
                continue
            fin = res.finished
            outcomes[opb.RunOutcome.Name(fin.outcome) if fin is not None else "no outcome"] += 1
            if fin is not None and fin.outcome != opb.RUN_OUTCOME_COMPLETED:
                print(f"    run {n}: {fin.reason} {fin.detail}", flush=True)
            elif not chat:
                decode.append(decode_ms(res))
            for h in c.hosts:
                bad = [f"{m.metadata.node_id}={mpb.MemberStatus.Name(m.status)}" for m in members(h.sock("membership"))
                       if m.status != mpb.MEMBER_STATUS_ALIVE]
                not_alive += [f"run {n}, seen by {h.name}: {b}" for b in bad]
            n += 1
            if n % 20 == 0:
                print(f"    {n} runs in {time.monotonic() - t0:.0f} s: {dict(outcomes)}", flush=True)
        elapsed = time.monotonic() - t0
        raised = suspicions(c) - before
    return {"links": links.as_dict(), "seconds": elapsed, "runs": n, "outcomes": dict(outcomes),
            "suspicions_raised": raised, "not_alive_seen": not_alive, "advice_applied": applied,
            "decode_ms_median": statistics.median(decode) if decode else None}


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
    ap.add_argument("--soak-s", type=float, default=0.0, help="the soak alone, this many seconds (0: the sweep)")
    ap.add_argument("--soak-delay-ms", type=float, default=75.0, help="the soak's one-way delay between hosts")
    ap.add_argument("--soak-loss-pct", type=float, default=2.0, help="the soak's loss between hosts")
    ap.add_argument("--apply-advice", action="store_true", help="before the soak, restart each host's membership "
                    "with the probe timings it kept from its measured RTT")
    ap.add_argument("--congestion-control", default="", help="[edge].congestion_control of every host (default: "
                    "the installed one)")
    ap.add_argument("--membership", default="", help="[membership] keys of every host, e.g. "
                    "probe_timeout_s=1.0,probe_interval_s=2.0")
    a = ap.parse_args()
    tables: dict[str, dict[str, object]] = {}
    if a.congestion_control:
        tables["edge"] = {"congestion_control": a.congestion_control}
    if a.membership:
        try:
            tables["membership"] = {k: float(v) for k, v in (kv.split("=", 1) for kv in a.membership.split(","))}
        except ValueError:
            ap.error(f"--membership takes key=seconds pairs separated by commas, got {a.membership!r}")
    if a.soak_s > 0:
        links = LinkConditions(delay_ms=a.soak_delay_ms, loss_pct=a.soak_loss_pct)
        print(f"load average {os.getloadavg()[0]:.2f}; soak {a.soak_s:g} s at {links.describe()}", flush=True)
        got = soak(links, a.soak_s, tables, a.apply_advice)
        print(f"\nsoak: {got['runs']} runs in {got['seconds']:.0f} s at {links.describe()}: outcomes {got['outcomes']} "
              f"(aim: all completed); suspicions raised {got['suspicions_raised']}, members seen not Alive "
              f"{len(got['not_alive_seen'])} (aim: 0); decode {got['decode_ms_median'] or float('nan'):.1f} ms/token")
        path = a.json.with_name("wan_soak.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=2))
        return 0
    delays = [float(d) for d in a.delays.split(",")]
    losses = [float(p) for p in a.losses.split(",")]
    stages = [int(s) for s in a.stages.split(",")]
    ids = prompt_ids()
    long_ids = (ids * (a.long_prompt // len(ids) + 1))[:a.long_prompt]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; delays {delays} ms one way, losses {losses} %, "
          f"S {stages}, {a.max_tokens} tokens, prefill of {len(long_ids)} tokens; tables {tables}", flush=True)
    rows: list[dict] = []
    base: dict[int, dict] = {}
    for loss in losses:
        for delay in delays:
            print(f"  pool at one-way {delay:g} ms, loss {loss:g} %", flush=True)
            got = measure(LinkConditions(delay_ms=delay, loss_pct=loss), stages, a.max_tokens, long_ids, tables)
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
        got = measure(links, [max(stages)], 2, long_ids[:16], tables)
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
