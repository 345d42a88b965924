"""Gateway benchmark (issue 23 aims): what the OpenAI-compatible gateway adds to a streamed answer, and many streaming
clients at once.

  .venv/bin/python bench/gateway.py [--runs 4] [--max-tokens 64] [--clients 64] [--slow-every 8] [--json PATH]

1. Overhead. One 2-host pool, one run at a time, the same greedy prompt alternately through WatchRun (gRPC, as
   `swactor submit --watch` reads it) and through the gateway's SSE stream (`/v1/completions`, stream: true, read
   with a plain HTTP client). Per path: tokens/s over the decode (first to last token). The gateway's CPU per streamed
   token is its process's user+system time over the gateway runs divided by the tokens it streamed (aims: <= 0.3 ms
   CPU per token, tokens/s within 1 % of WatchRun's).
2. Many clients. --clients streaming requests at once (every --slow-every-th one reads a chunk every 50 ms): each
   must get its whole text (equal to the solo answer) or a clean error; the gateway's resident memory is sampled
   before, at its peak and after (aim: bounded, back near where it started).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import socket
import statistics
import threading
import time
from urllib.parse import urlsplit

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.run import RunResult, follow
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

PROMPT = "Once upon a time, in a small village by the sea, there lived"
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def decode_rate(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")


def sse_completion(url: str, token: str, max_tokens: int, slow: bool = False) -> tuple[str, list[float], str]:
    """One streamed /v1/completions: its text, each text chunk's arrival time, and its finish_reason (or the error)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True})
    conn.request("POST", f"{u.path}/completions", body, {"Authorization": f"Bearer {token}",
                                                          "Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        return "", [], f"HTTP {r.status}: {r.read()[:200]!r}"
    text, times, finish = [], [], "no [DONE]"
    for raw in r:
        line = raw.decode().rstrip("\n")
        if slow:
            time.sleep(0.05)
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            finish = f"error: {event['error']['message']}"
            break
        choice = event["choices"][0]
        if choice["finish_reason"]:
            finish = choice["finish_reason"]
        else:  # one chunk per token that completed text
            times.append(time.monotonic())
            text.append(choice["text"])
    conn.close()
    return "".join(text), times, finish


def watchrun(stub, max_tokens: int) -> RunResult:
    req = opb.SubmitRunRequest(prompt=PROMPT, raw=True, max_tokens=max_tokens, sampling=opb.Sampling(temperature=0))
    return follow(stub, req)


def overhead(c: LocalCluster, token: str, runs: int, max_tokens: int) -> dict:
    pid = c.service("h0/gateway").pid
    assert c.openai_url is not None
    with c.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        watchrun(stub, max_tokens)  # warm: weights loaded, graphs compiled
        grpc_rates, gw_rates, gw_tokens, gw_cpu = [], [], 0, 0.0
        for _ in range(runs):
            res = watchrun(stub, max_tokens)
            grpc_rates.append(decode_rate(res.token_s))
            before = cpu_s(pid)
            text, times, _ = sse_completion(c.openai_url, token, max_tokens)
            gw_cpu += cpu_s(pid) - before
            gw_tokens += len(times)
            gw_rates.append(decode_rate(times))
            assert text == res.text, (text, res.text)
    g, w = statistics.median(grpc_rates), statistics.median(gw_rates)
    return {"watchrun_tokens_per_s": round(g, 2), "gateway_tokens_per_s": round(w, 2),
            "gateway_over_watchrun": round(w / g, 4), "gateway_cpu_ms_per_token": round(gw_cpu * 1000 / gw_tokens, 3),
            "gateway_tokens": gw_tokens}


def many_clients(c: LocalCluster, token: str, clients: int, slow_every: int, max_tokens: int) -> dict:
    pid = c.service("h0/gateway").pid
    assert c.openai_url is not None
    solo, _, _ = sse_completion(c.openai_url, token, max_tokens)
    results: list[tuple[str, list[float], str] | None] = [None] * clients
    base = rss_mb(pid)
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak.append(rss_mb(pid))

    def one(i: int) -> None:
        try:
            results[i] = sse_completion(c.openai_url or "", token, max_tokens, slow=slow_every > 0 and i % slow_every == 0)
        except Exception as e:  # a broken connection is a result too
            results[i] = ("", [], f"exception: {e}")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    done.set()
    sampler.join()
    time.sleep(1.0)
    after = rss_mb(pid)
    whole = sum(1 for r in results if r and r[2] in ("stop", "length") and r[0] == solo)
    errors = [r[2] for r in results if r and r[2] not in ("stop", "length")]
    differ = sum(1 for r in results if r and r[2] in ("stop", "length") and r[0] != solo)
    tokens = sum(len(r[1]) for r in results if r)
    return {"clients": clients, "whole_text": whole, "clean_errors": len(errors), "text_differs": differ,
            "errors": sorted(set(errors))[:5], "wall_s": round(wall, 1), "tokens_per_s": round(tokens / wall, 1),
            "gateway_rss_mb": {"before": round(base, 1), "peak": round(max(peak), 1), "after": round(after, 1)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--client-tokens", type=int, default=16)
    ap.add_argument("--slow-every", type=int, default=8)
    ap.add_argument("--slots", type=int, default=1)
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    spec = ClusterSpec(hosts=2, openai_port=free_port(), slots=args.slots,
                       orchestrator={"queue_depth": args.clients + 8, "default_stages": 2})
    with LocalCluster(spec, progress=lambda s: print(s, flush=True)) as c:
        assert c.openai_token_file is not None
        token = c.openai_token_file.read_text().strip()
        out = {"overhead": overhead(c, token, args.runs, args.max_tokens),
               "many_clients": many_clients(c, token, args.clients, args.slow_every, args.client_tokens)}
    o, m = out["overhead"], out["many_clients"]
    print(f"\nstreamed token rate: WatchRun {o['watchrun_tokens_per_s']} tok/s, gateway {o['gateway_tokens_per_s']} "
          f"tok/s = {o['gateway_over_watchrun']:.3f}x (aim >= 0.99x)")
    print(f"gateway CPU per streamed token: {o['gateway_cpu_ms_per_token']} ms (aim <= 0.3 ms), "
          f"over {o['gateway_tokens']} tokens")
    print(f"{m['clients']} streaming clients at once ({args.slow_every and m['clients'] // args.slow_every} slow "
          f"readers): {m['whole_text']} whole text, {m['clean_errors']} clean errors, {m['text_differs']} other text; "
          f"{m['wall_s']} s, {m['tokens_per_s']} tok/s; gateway RSS {m['gateway_rss_mb']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
