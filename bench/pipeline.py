"""Pipeline benchmark: TTFT and decode tok/s of real runs through a local cluster for S = 1..4
stages (one host each), next to the single-process worker (the compute core's StageModel over all
30 layers, same device, same prompt ids) measured in the same invocation; ratios pipeline / single.

  .venv/bin/python bench/pipeline.py [--stages 1,2,3,4] [--max-tokens 24] [--device CPU] [--loopback] [--model PATH]
                                     [--prefill-chunk N] [--long-prompt 512] [--sweep 16,32,64,128]
                                     [--png bench/out/pipeline_timeline.png] [--json bench/out/pipeline.json]
                                     [--runs 1] [--no-split-by-speed] [--no-step-grants]

Per S, one warm-up run (loads the stage weights and compiles its graphs before the barrier, or loads
them from the graph cache; the workers keep the weights for the next run of the same plan), one
measured run (TTFT, decode, CPU per step; --runs N: N of them, each printed, the figures the median
run's, the CPU over all N), one run with trace_objects (the per-token timeline and
the hop p50: producer commit -> consumer loaded) and one run of a --long-prompt prompt (prefill
tok/s). The single process runs the same prefill chunks (--prefill-chunk, default the
orchestrator's); --sweep measures its prefill per chunk size first. TTFT is client-side, from SubmitRun
to the first token, so it includes planning, (warm) provisioning, edge set-up and prefill; "prefill"
is the services' own readiness barrier -> first token.

The timeline PNG splits every decode token n of the measured runs into where its milliseconds went,
from the lifecycle events' wall-clock stamps (all processes share this machine's clock). Hop h is
edge h: h = 0 token-in (orchestrator -> stage 0), h = k stage k-1 -> stage k, h = S token-out:
  orchestrator   TOKEN_RECEIVED(n-1) -> token-in object committed (EDGE_OBJECT_SENT produced_us):
                 FSM, sample, inject
  send h         producer committed (produced_us, or the stage's OBJECT_PRODUCED) -> send pump handed
                 the last byte to QUIC (EDGE_OBJECT_SENT): ring + wake + pump on the sending host
  quic h         -> the peer's recv pump has the last byte (EDGE_OBJECT_RECEIVED arrived_us): QUIC
                 packetising, UDP, the peer's QUIC stack
  recv h         -> the consumer loaded it (OBJECT_LOADED(h) / TOKEN_RECEIVED(n)): recv ring commit,
                 wake, the worker's load + report to its node (or the orchestrator's token reader)
  dispatch k     OBJECT_LOADED(k) -> EXECUTE_STEP_STARTED(k): the stage node starts the step (~0 for a step
                 the worker started under a grant: it starts as its input loads)
  compute k      EXECUTE_STEP_STARTED(k) -> OBJECT_PRODUCED(k): the stage's layers
OBJECT_PRODUCED / OBJECT_LOADED are stamped by the stage node when the worker process reports them,
after the fact; a stamp later than the next (driver-stamped) checkpoint is clamped back to it, so its
lag lands in the segment before (compute / recv) and every token's segments add up to
TOKEN_RECEIVED(n-1) -> TOKEN_RECEIVED(n). On real multi-host deployments the hosts' clock offset
shifts only the "quic" segments (the one span whose two ends are stamped on different hosts).
Numbers on a shared 2-core box move with the load: all S share the two cores (S workers + S edge
drivers + orchestrator), so this measures overhead, not GPU scaling. The CPU table says how much:
CPU ms per step of each service (all hosts summed; a worker includes its compute process), from
/proc over the measured run; what is not compute there competes with the stage computing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from collections import defaultdict

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "llamacpp_greedy.json"
QUESTION = "Once upon a time"  # chat template; no EOS in llama.cpp's first 32 greedy tokens


def prompt_ids() -> list[int]:
    cases = json.loads(FIXTURE.read_text())["cases"]
    return next(c for c in cases if c["question"] == QUESTION and c["chat_template"])["prompt_tokens"]


def bench_single(model: pathlib.Path, device: str, ids: list[int], n: int, chunk: int, long_ids: list[int]):
    """The single process as the pipeline's stages run: prefill in `chunk`-row steps (1 = row by row), graphs
    compiled before the first measurement (StageModel.prepare, like a stage before its barrier)."""
    from swactor.worker.compute import GGUFModel, StageModel

    t0 = time.perf_counter()
    g = GGUFModel(model)
    m = StageModel(g, 0, g.params.n_layers, max_seq_len=4096, device=device, prefill_chunk=max(1, chunk))
    load = time.perf_counter() - t0
    compile_s = m.prepare().seconds

    def one() -> tuple[float, float, list[int]]:
        m.reset()
        t = time.perf_counter()
        tok = int(m.step(np.asarray(ids, np.int32), 0)[0])
        ttft = time.perf_counter() - t
        out, pos, t = [tok], len(ids), time.perf_counter()
        for _ in range(n - 1):
            tok = int(m.step(np.asarray([tok], np.int32), pos)[0])
            pos += 1
            out.append(tok)
        return ttft, (n - 1) / (time.perf_counter() - t), out

    def measure() -> dict[str, object]:
        ttft, dec, toks = one()
        m.reset()
        t = time.perf_counter()
        m.step(np.asarray(long_ids, np.int32), 0)
        prefill = len(long_ids) / (time.perf_counter() - t)
        return {"load_s": load, "compile_s": compile_s, "ttft_s": ttft, "decode_tok_s": dec, "tokens": toks,
                "prefill_tok_s": prefill}

    return measure


def chunk_sweep(model: pathlib.Path, device: str, chunks: list[int], long_ids: list[int]) -> dict[int, float]:
    """Single-process prefill tok/s of the long prompt per chunk size: what [orchestrator].prefill_chunk's default
    is chosen by (compile time per chunk is printed too: every stage pays it before its barrier, once per host with
    the graph cache)."""
    from swactor.worker.compute import GGUFModel, StageModel

    g, out = GGUFModel(model), {}
    for c in chunks:
        m = StageModel(g, 0, g.params.n_layers, max_seq_len=4096, device=device, prefill_chunk=c)
        compile_s = m.prepare().seconds
        best = 0.0
        for _ in range(2):
            m.reset()
            t = time.perf_counter()
            m.step(np.asarray(long_ids, np.int32), 0)
            best = max(best, len(long_ids) / (time.perf_counter() - t))
        out[c] = best
        print(f"  prefill_chunk {c:4d}: prefill {best:7.1f} tok/s over {len(long_ids)} tokens (compile {compile_s:.1f} s)",
              flush=True)
    return out


SEGMENTS = [("orchestrator", "FSM, sample, inject", "#7f7f7f"),
            ("send", "send host: ring, wake, pump", "#d62728"),
            ("quic", "QUIC transit", "#9467bd"),
            ("recv", "recv host: ring, wake, load", "#ff9896"),
            ("dispatch", "stage node: step dispatch", "#ffbb78"),
            ("compute", "stage compute", "#1f77b4")]


def timeline(events, stages: int) -> list[list[tuple[str, float]]]:
    """Per decode token n >= 1: [(segment, ms), ...] in pipeline order (see the module doc)."""
    from swactor.v1 import common_pb2 as pb

    at: dict[tuple[int, int | None, int], object] = {}
    for e in events:
        stage = e.stage_index if e.HasField("stage_index") else None
        at.setdefault((e.kind, stage, e.sequence), e)
    seqs = sorted({e.sequence for e in events if e.kind == pb.TOKEN_RECEIVED})
    rows = []
    for n in seqs[1:]:
        try:
            marks: list[tuple[str, int]] = [("", at[(pb.TOKEN_RECEIVED, None, n - 1)].time_us)]
            for h in range(stages + 1):
                sent = at[(pb.EDGE_OBJECT_SENT, h - 1 if h else None, n)]
                recv = at[(pb.EDGE_OBJECT_RECEIVED, h if h < stages else None, n)]
                if h == 0:
                    marks.append(("orchestrator", sent.counters["produced_us"] or sent.counters["picked_us"]))
                else:
                    marks.append((f"compute {h - 1}", at[(pb.OBJECT_PRODUCED, h - 1, n)].time_us))
                marks.append((f"send {h}", sent.time_us))
                marks.append((f"quic {h}", recv.counters["arrived_us"]))
                if h < stages:
                    marks.append((f"recv {h}", at[(pb.OBJECT_LOADED, h, n)].time_us))
                    marks.append((f"dispatch {h}", at[(pb.EXECUTE_STEP_STARTED, h, n)].time_us))
                else:
                    marks.append((f"recv {h}", at[(pb.TOKEN_RECEIVED, None, n)].time_us))
        except KeyError:
            continue  # an event of this step is missing (e.g. the last step raced the stop)
        t = [us for _, us in marks]
        for i in range(len(t) - 2, -1, -1):
            t[i] = min(t[i], t[i + 1])  # a late after-the-fact stamp: clamp back (module doc)
        rows.append([(marks[i][0], (t[i] - t[i - 1]) / 1000.0) for i in range(1, len(t))])
    return rows


def hop_ms(rows: list[list[tuple[str, float]]]) -> list[float]:
    """Per token and hop: send + quic + recv (producer commit -> consumer loaded), ms."""
    out = []
    for segs in rows:
        hops: dict[str, float] = defaultdict(float)
        for name, ms in segs:
            kind, _, idx = name.partition(" ")
            if kind in ("send", "quic", "recv"):
                hops[idx] += ms
        out += hops.values()
    return out


def service_kind(service: str, cmdline: bytes) -> str:
    """A service's kind, all hosts summed: "h1/worker" -> "worker"."""
    return service.split("/")[-1]


def cpu_seconds(cluster, key=service_kind) -> dict[str, float]:
    """CPU seconds so far of each kind of service (orchestrator, worker, edge, ...), all hosts summed: every live
    process in a service's process group (the local cluster starts each service in its own session). `key` names
    what a process counts towards, from its service's name ("h1/worker") and its command line."""
    groups = {svc.pid: svc.name for svc in cluster.services}
    tick, out = os.sysconf("SC_CLK_TCK"), defaultdict(float)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            f = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if (service := groups.get(int(f[2]))) is None:  # f[2] = pgrp
                continue
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        out[key(service, cmdline)] += (int(f[11]) + int(f[12])) / tick
    return out


def per_token_table(rows: list[list[tuple[str, float]]], stages: int) -> dict[str, list[float]]:
    """Mean ms per token: kind -> [per hop / stage index ...] (hops 0..S, stages 0..S-1)."""
    out = {kind: [0.0] * (1 if kind == "orchestrator" else stages + (kind in ("send", "quic", "recv")))
           for kind, _, _ in SEGMENTS}
    for segs in rows:
        for name, ms in segs:
            kind, _, idx = name.partition(" ")
            out[kind][int(idx or 0)] += ms / len(rows)
    return out


def print_table(s: int, table: dict[str, list[float]], tokens: int) -> None:
    width = s + 1
    print(f"  S={s}: mean ms per decode token over {tokens} tokens (hop h = edge into stage h; "
          f"hop {s} = token-out), total {sum(map(sum, table.values())):.1f} ms")
    print(f"    {'segment (columns: hop / stage index)':44s}" + "".join(f"{i:>8d}" for i in range(width)) + f"{'sum':>9s}")
    for kind, label, _ in SEGMENTS:
        vals = table[kind]
        cells = "".join(f"{v:8.2f}" for v in vals) + " " * 8 * (width - len(vals))
        print(f"    {kind + ' = ' + label:44s}{cells}{sum(vals):9.2f}")


def plot(timelines: dict[int, list[list[tuple[str, float]]]], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    colors = {kind: c for kind, _, c in SEGMENTS}
    fig, axes = plt.subplots(len(timelines), 1, figsize=(12, 2.4 + 1.7 * len(timelines)), squeeze=False)
    for ax, (s, rows) in zip(axes[:, 0], sorted(timelines.items()), strict=True):
        for i, segs in enumerate(rows):
            x = 0.0
            for name, ms in segs:
                kind, _, idx = name.partition(" ")
                shade = 1.0 - 0.15 * int(idx) if idx else 1.0
                ax.barh(i + 1, ms, left=x, color=colors[kind], alpha=max(0.35, shade), edgecolor="white", linewidth=0.3)
                x += ms
        ax.set_ylabel(f"S={s}\ntoken")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("ms since the previous token arrived at the orchestrator (lighter = later hop / stage)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c in SEGMENTS]
    fig.legend(handles, [f"{kind}: {label}" for kind, label, _ in SEGMENTS], loc="upper center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def speed_events(log_dir: pathlib.Path) -> list[dict[str, object]]:
    """The step_speed_measured events in a host's service logs (JSON lines), oldest first."""
    out = []
    for log in sorted(log_dir.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if '"step_speed_measured"' in line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", default="1,2,3,4")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--loopback", action="store_true", help="loopback addresses instead of network namespaces")
    ap.add_argument("--compute-threads", type=int, default=0,
                    help="[worker].compute_threads of every host (0 = the local cluster's default, cores // hosts)")
    ap.add_argument("--model", type=pathlib.Path, default=None, help="GGUF file (default: the shipped SmolLM2)")
    ap.add_argument("--prefill-chunk", type=int, default=None,
                    help="[orchestrator].prefill_chunk of the pool and the single process (default: the orchestrator's)")
    ap.add_argument("--long-prompt", type=int, default=512, help="tokens of the prefill-throughput prompt")
    ap.add_argument("--sweep", default="", help="chunk sizes to sweep in the single process first, e.g. 16,32,64,128")
    ap.add_argument("--png", type=pathlib.Path, default=ROOT / "bench" / "out" / "pipeline_timeline.png",
                    help="timeline plot ('' for none: no matplotlib needed)")
    ap.add_argument("--json", type=pathlib.Path, default=ROOT / "bench" / "out" / "pipeline.json")
    ap.add_argument("--runs", type=int, default=1,
                    help="measured runs per S after the warm-up (each printed; the figures are the median run's)")
    ap.add_argument("--no-split-by-speed", action="store_true",
                    help="[orchestrator].split_by_speed = false: the blocks stay where memory puts them (for comparison)")
    ap.add_argument("--no-step-grants", action="store_true",
                    help="[worker].step_grants = false: every decode step waits for its ExecuteStep (for comparison)")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error(f"--runs must be at least 1, got {a.runs}")
    stages = [int(s) for s in a.stages.split(",")]
    from swactor.localcluster import ClusterSpec, LocalCluster
    from swactor.localcluster.cluster import DEFAULT_MODEL
    from swactor.localcluster.run import follow
    from swactor.orchestrator.config import OrchestratorConfig
    from swactor.v1 import orchestrator_pb2 as opb
    from swactor.v1 import orchestrator_pb2_grpc

    ids, n, model = prompt_ids(), a.max_tokens, a.model or DEFAULT_MODEL
    chunk = OrchestratorConfig.prefill_chunk if a.prefill_chunk is None else a.prefill_chunk
    long_ids = (ids * (a.long_prompt // len(ids) + 1))[:a.long_prompt]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; prompt {QUESTION!r} ({len(ids)} ids, chat "
          f"template), {n} tokens, device {a.device}, prefill_chunk {chunk}, long prompt {len(long_ids)} ids", flush=True)
    if a.sweep:
        chunk_sweep(model, a.device, [int(c) for c in a.sweep.split(",")], long_ids)
    measure_single = bench_single(model, a.device, ids, n, chunk, long_ids)
    before = measure_single()
    print(f"single process (one StageModel, every layer), before the cluster: load {before['load_s']:.2f} s + compile "
          f"{before['compile_s']:.2f} s; TTFT {before['ttft_s']:.3f} s, decode {before['decode_tok_s']:.2f} tok/s, "
          f"prefill {before['prefill_tok_s']:.1f} tok/s", flush=True)
    single = before
    results: dict[int, dict[str, object]] = {}
    timelines = {}
    tables: dict[int, tuple[dict[str, list[float]], int]] = {}
    spec = ClusterSpec(hosts=max(stages), model=model, device=a.device, netns=False if a.loopback else None,
                       compute_threads=a.compute_threads,
                       orchestrator={"prefill_chunk": chunk, **({"split_by_speed": False} if a.no_split_by_speed else {})},
                       workers={h: {"step_grants": False} for h in range(max(stages))} if a.no_step_grants else {})
    with LocalCluster(spec, progress=lambda s: print(f"  {s}", flush=True)) as cluster, cluster.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        for s in stages:
            req = opb.SubmitRunRequest(prompt=QUESTION, stages=s, max_tokens=n)
            warm = follow(stub, req, timeout_s=600)  # the first run of this plan: loads weights, compiles (or the cache)
            cpu0 = cpu_seconds(cluster)
            runs = [follow(stub, req, timeout_s=600) for _ in range(a.runs)]  # untraced: the figures
            res = sorted(runs, key=lambda r: r.decode_tok_s or 0.0)[len(runs) // 2]  # the median run's
            steps = sum(max(1, -(-r.prompt_tokens // max(1, chunk)) + len(r.token_ids)) for r in runs)  # chunks + tokens
            cpu = {k: (v - cpu0.get(k, 0.0)) * 1000 / steps for k, v in cpu_seconds(cluster).items()}
            if a.runs > 1:
                print(f"S={s}: {a.runs} measured runs (the median run's figures below):", flush=True)
                for i, r in enumerate(runs):
                    where = " ".join(f"{str(p.node_id)[-4:]}[{p.layer_start},{p.layer_end_exclusive})"
                                     for p in r.finished.placement) if r.finished else "?"
                    print(f"  run {i + 1}: decode {r.decode_tok_s or 0:.1f} tok/s, TTFT {r.ttft_s or 0:.3f} s (provision "
                          f"{r.summary()['provision_s'] or 0:.2f} s), stages on {where}", flush=True)
                said = {h.name: speed_events(h.log_dir) for h in cluster.hosts}  # what moved the blocks, if they moved
                speeds = [f"{name} {ev[-1]['us_per_layer']} us/layer over {ev[-1].get('layers')} layers "
                          f"({ev[-1].get('measured_on', 'step')}; {len(ev)} said)" for name, ev in said.items() if ev]
                print(f"  the hosts' speeds said last: {'; '.join(speeds) or 'none'}", flush=True)
            assert res.prompt_tokens == len(ids), (res.prompt_tokens, len(ids))
            traced = follow(stub, opb.SubmitRunRequest(prompt=QUESTION, stages=s, max_tokens=n, trace_objects=True),
                            timeout_s=600)  # per-object events: the timeline
            long = follow(stub, opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=long_ids), stages=s, max_tokens=1),
                          timeout_s=600)
            summ = res.summary()
            summ["warmup_ttft_s"] = warm.ttft_s
            summ["warmup_provision_s"] = warm.summary()["provision_s"]
            summ["matches_single"] = all(r.token_ids == single["tokens"][: len(r.token_ids)] for r in runs)
            summ["tokens"] = res.token_ids
            summ["cpu_ms_per_step"] = cpu
            lp = long.summary()["prefill_s"]
            summ["long_prefill_tok_s"] = len(long_ids) / lp if lp else None
            results[s] = summ
            tl = timeline(traced.events, s)
            timelines[s] = tl
            hops = hop_ms(tl)
            summ["hop_p50_ms"] = float(np.median(hops)) if hops else None
            print(f"S={s}: {res.outcome} ({summ['reason']}), TTFT {res.ttft_s:.2f} s (first run of the plan "
                  f"{warm.ttft_s:.2f} s, provision {summ['warmup_provision_s'] or 0:.2f} s; prefill {summ['prefill_s']:.2f} s), "
                  f"decode {res.decode_tok_s:.2f} tok/s (traced {traced.decode_tok_s:.2f}), prefill of {len(long_ids)} "
                  f"tokens {summ['long_prefill_tok_s'] or 0:.1f} tok/s, teardown {summ['teardown_s']:.2f} s; "
                  f"tokens match single process: {summ['matches_single']}", flush=True)
            if tl:
                table = per_token_table(tl, s)
                summ["per_token_ms"] = table
                tables[s] = (table, len(tl))
                print_table(s, table, len(tl))
                print(f"  S={s}: hop (producer commit -> consumer loaded) p50 {summ['hop_p50_ms']:.2f} ms over {len(hops)}")
            else:
                print(f"  S={s}: no complete per-token timeline (edge timing events missing)")
    after = measure_single()  # the load on a shared box moves: the better of before and after is the baseline
    print(f"single process, after the cluster: TTFT {after['ttft_s']:.3f} s, decode {after['decode_tok_s']:.2f} tok/s, "
          f"prefill {after['prefill_tok_s']:.1f} tok/s")
    single = {**before, "ttft_s": min(before["ttft_s"], after["ttft_s"]),
              "decode_tok_s": max(before["decode_tok_s"], after["decode_tok_s"]),
              "prefill_tok_s": max(before["prefill_tok_s"], after["prefill_tok_s"]), "before": before, "after": after}
    print("\n S   TTFT s  ratio   decode tok/s  ratio   prefill tok/s  ratio   hop p50 ms   first-run TTFT s"
          f"   (ratio = pipeline / single process; single: TTFT {single['ttft_s']:.3f} s, decode "
          f"{single['decode_tok_s']:.2f} tok/s, prefill {single['prefill_tok_s']:.1f} tok/s, cold start = load + compile "
          f"{single['load_s'] + single['compile_s']:.2f} s)")
    for s, r in results.items():
        ttft, dec, pre = r["ttft_s"], r["decode_tok_s"], r["long_prefill_tok_s"] or 0.0
        hop = "-" if r["hop_p50_ms"] is None else f"{r['hop_p50_ms']:.2f}"
        print(f"{s:2d}  {ttft:7.2f}  {ttft / single['ttft_s']:5.1f}x  {dec:12.2f}  {dec / single['decode_tok_s']:5.2f}x"
              f"  {pre:13.1f}  {pre / single['prefill_tok_s']:5.2f}x  {hop:>10s}  {r['warmup_ttft_s']:17.2f}")
    print("\nper decode token, mean ms (all hops / stages summed):")
    print("  S " + "".join(f"{k:>13s}" for k, _, _ in SEGMENTS) + f"{'total':>10s}")
    for s, (table, _) in tables.items():
        print(f"{s:3d} " + "".join(f"{sum(table[k]):13.2f}" for k, _, _ in SEGMENTS)
              + f"{sum(map(sum, table.values())):10.2f}")
    print("\nCPU ms per step by service (all hosts summed; the untraced run's CPU / (prompt chunks + generated tokens)):")
    kinds = sorted({k for r in results.values() for k in r["cpu_ms_per_step"]})
    print("  S " + "".join(f"{k:>14s}" for k in kinds) + f"{'total':>10s}")
    for s, r in results.items():
        c = r["cpu_ms_per_step"]
        print(f"{s:3d} " + "".join(f"{c.get(k, 0.0):14.2f}" for k in kinds) + f"{sum(c.values()):10.2f}")
    if str(a.png) not in ("", "."):
        plot(timelines, a.png)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"single": single, "pipeline": results, "max_tokens": n,
                                  "load_average": os.getloadavg()[0]}, indent=1, default=str))
    print(f"timeline: {a.png if str(a.png) not in ('', '.') else '-'}; figures: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
