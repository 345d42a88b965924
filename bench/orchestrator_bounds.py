"""The bounded orchestrator (issue 13 item 5), in process with a fake fleet; figures are printed, never asserted.

1. 1,000 runs through the run queue (queue depth 32, retention: the newest 100 runs): orchestrator
   RSS (the bench client shares the process) and run store size before, during (peak) and after.
2. RPC latency while hostile prompts are submitted: 4 MiB of one letter without a space (just under
   gRPC's 4 MiB message limit), as a raw prompt and through the chat template, with the request byte
   limit raised past it so the tokenizer (in its worker thread) does the refusing, then with the
   default limit (refused on its size before parsing). The hostile client is another process; a probe
   in the orchestrator's process calls ListRuns / GetRun / ListNodes back to back meanwhile, and
   p50 / p99 / max of those calls are printed (aim: p99 <= 100 ms).

    .venv/bin/python bench/orchestrator_bounds.py [--runs 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swactor.orchestrator.runs.manager import Limits  # noqa: E402
from swactor.orchestrator.runs.retention import RetentionPolicy  # noqa: E402
from swactor.v1 import orchestrator_pb2 as opb  # noqa: E402
from tests.orchestrator.fakes import FakeFleet  # noqa: E402
from tests.orchestrator.harness import registry, serving  # noqa: E402
from tests.orchestrator.helpers import MODEL_PATH, pool  # noqa: E402

HOSTILE = "x" * ((4 << 20) - 64)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


async def probe(stub, stop: asyncio.Event, run_id: int, latencies: list[float]) -> None:
    calls = [lambda: stub.ListRuns(opb.ListRunsRequest(limit=10)), lambda: stub.GetRun(opb.GetRunRequest(run_id=run_id)),
             lambda: stub.ListNodes(opb.ListNodesRequest())]
    k = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        await calls[k % len(calls)]()
        latencies.append(time.perf_counter() - t0)
        k += 1


def summary(latencies: list[float]) -> str:
    if not latencies:
        return "no probe call completed"
    ms = sorted(x * 1e3 for x in latencies)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (f"{len(ms)} probe RPCs: p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms")


async def hostile(label: str, limits: Limits, kinds: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        async with serving(Path(d), FakeFleet([2]), pool(1), limits=limits) as s:
            await asyncio.sleep(0.06)
            seed = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="seed", raw=True, max_tokens=1))
            client = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--hostile-client", str(s.socket), *kinds,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            assert client.stdin is not None and client.stdout is not None
            await client.stdout.readline()  # "ready": requests built, channel connected
            latencies: list[float] = []
            stop = asyncio.Event()
            prober = asyncio.create_task(probe(s.stub, stop, seed.run_id, latencies))
            await asyncio.sleep(0.2)
            quiet = list(latencies)
            latencies.clear()
            t0 = time.perf_counter()
            client.stdin.write(b"go\n")
            await client.stdin.drain()
            outcomes = (await client.stdout.read()).decode().splitlines()
            took = time.perf_counter() - t0
            stop.set()
            await prober
            await client.wait()
    print(f"  {label}: {len(kinds)} submitted, all answered in {took * 1e3:.0f} ms -> {'; '.join(sorted(set(outcomes)))}")
    print(f"    while submitting: {summary(latencies)}")
    print(f"    idle, for comparison: {summary(quiet)}")


def hostile_client(sock: str, kinds: list[str]) -> None:
    """The hostile submitter (a process of its own): SubmitRun of each kind at once, one line per answer."""
    from concurrent.futures import ThreadPoolExecutor

    from swactor.v1 import orchestrator_pb2_grpc

    requests = [opb.SubmitRunRequest(prompt=HOSTILE, raw=kind == "raw", max_tokens=8) for kind in kinds]
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        print("ready", flush=True)
        sys.stdin.readline()

        def one(req: opb.SubmitRunRequest) -> str:
            try:
                return f"accepted {stub.SubmitRun(req, timeout=30).run_id}"
            except grpc.RpcError as e:
                return f"{e.code().name}: {e.details()[:80]}"  # type: ignore[attr-defined]

        with ThreadPoolExecutor(len(requests)) as pool_:
            for line in pool_.map(one, requests):
                print(line, flush=True)


def bench_hostile() -> None:
    print("RPC latency while 4 MiB one-word prompts are submitted (by another process):")
    raised = Limits(max_request_bytes=8 << 20)
    asyncio.run(hostile("raw prompt, byte limit raised to 8 MiB (the tokenizer refuses it)", raised, ["raw"]))
    asyncio.run(hostile("chat prompt, byte limit raised to 8 MiB (template + tokenizer)", raised, ["chat"]))
    asyncio.run(hostile("4 at once, byte limit raised to 8 MiB", raised, ["raw", "chat", "raw", "chat"]))
    asyncio.run(hostile("raw prompt, default byte limit (1 MiB)", Limits(), ["raw"]))


async def through_queue(runs: int, keep: int) -> None:
    tokens = 16
    fleet = FakeFleet([100 + k for k in range(tokens)] + [2])
    limits = Limits(queue_depth=32, retention=RetentionPolicy(max_runs=keep, max_age_s=0))
    with tempfile.TemporaryDirectory() as d:
        # One run slot: the runs go one at a time through the queue (the fake fleet serves one run at a time).
        async with serving(Path(d), fleet, pool(1), limits=limits, max_slots_per_stage=1) as s:
            await asyncio.sleep(0.06)
            rss0, store0 = rss_bytes(), s.store.size_bytes()
            peak = {"rss": rss0, "store": store0, "queued": 0}
            marks: list[str] = []
            sampling = True

            async def sample() -> None:
                while sampling:
                    peak["rss"] = max(peak["rss"], rss_bytes())
                    peak["store"] = max(peak["store"], s.store.size_bytes())
                    peak["queued"] = max(peak["queued"], s.orch.queued())
                    await asyncio.sleep(0.02)

            sampler = asyncio.create_task(sample())
            t0 = time.perf_counter()
            refused = 0
            for n in range(1, runs + 1):
                while True:
                    try:
                        await s.stub.SubmitRun(opb.SubmitRunRequest(prompt=f"run {n}", raw=True, max_tokens=tokens + 1))
                        break
                    except grpc.aio.AioRpcError as e:
                        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            raise
                        refused += 1  # the queue is full: wait for room
                        await asyncio.sleep(0.01)
                fleet.injected.clear()  # the fake fleet's own record of the bench, not the orchestrator's
                fleet.plans.clear()
                fleet.provisioned.clear()
                fleet.stopped.clear()
                if n % (runs // 4) == 0:
                    marks.append(f"{n}: RSS {mib(rss_bytes())}, store {mib(s.store.size_bytes())}")
            while s.orch.live_run_ids():
                await asyncio.sleep(0.01)
            took = time.perf_counter() - t0
            s.orch.maintain()
            sampling = False
            await sampler
            kept = len(s.store.finished_runs())
            rss1, store1 = rss_bytes(), s.store.size_bytes()
    print(f"{runs} runs through the queue ({tokens} tokens each, queue depth 32, keep the newest {keep}): "
          f"{took:.1f} s, {runs / took:.0f} runs/s; queue peak {peak['queued']}, {refused} submits found it full "
          "and retried")
    print(f"  RSS: before {mib(rss0)}, peak {mib(peak['rss'])}, after {mib(rss1)}")
    print(f"  run store: before {mib(store0)}, peak {mib(peak['store'])}, after {mib(store1)}; runs kept {kept}")
    print(f"  along the way (submitted: RSS, store): {'; '.join(marks)}")


if __name__ == "__main__":
    import logging

    from swactor.common.events import configure_logging

    args = argparse.ArgumentParser()
    args.add_argument("--runs", type=int, default=1000)
    args.add_argument("--keep", type=int, default=100)
    args.add_argument("--hostile-client", nargs="+", metavar=("SOCKET", "KIND"), help=argparse.SUPPRESS)
    opts = args.parse_args()
    if opts.hostile_client:
        hostile_client(opts.hostile_client[0], opts.hostile_client[1:])
        sys.exit(0)
    configure_logging("bench", level=logging.WARNING)
    if not MODEL_PATH.exists():
        sys.exit(f"{MODEL_PATH} missing: run `make model`")
    registry().get("")
    print(f"load average before: {Path('/proc/loadavg').read_text().split()[:3]}")
    asyncio.run(through_queue(opts.runs, opts.keep))
    bench_hostile()
    print(f"load average after: {Path('/proc/loadavg').read_text().split()[:3]}")
