"""Orchestrator benchmarks: tokenizer, run-FSM core, run store, and the per-token overhead of a whole
run through gRPC with an in-memory fleet (what the orchestrator adds to every decode step).

    .venv/bin/python bench/orchestrator.py
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swactor.common.sampling import SamplingPolicy  # noqa: E402
from swactor.orchestrator.runs import fsm as F  # noqa: E402
from swactor.orchestrator.runs.store import RunStore  # noqa: E402
from swactor.orchestrator.tokens.tokenizer import StreamDecoder, Tokenizer  # noqa: E402
from swactor.v1 import common_pb2 as pb  # noqa: E402
from swactor.v1 import orchestrator_pb2 as opb  # noqa: E402
from tests.orchestrator.fakes import FakeFleet  # noqa: E402
from tests.orchestrator.harness import registry, serving  # noqa: E402
from tests.orchestrator.helpers import MODEL_PATH, model_facts, pool  # noqa: E402

# Mixed prose and code: every Python source of the orchestrator, about 150 KB.
TEXT = "".join(p.read_text() for p in sorted((ROOT / "services" / "swactor" / "orchestrator").rglob("*.py")))


def bench_tokenizer() -> None:
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(MODEL_PATH)
    load = time.perf_counter() - t0
    fresh = Tokenizer(tok.data)  # empty word cache
    t0 = time.perf_counter()
    ids = fresh.encode(TEXT)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids = tok.encode(TEXT)
    ids = tok.encode(TEXT)
    warm = (time.perf_counter() - t0) / 2
    dec = StreamDecoder(tok)
    t0 = time.perf_counter()
    for i in ids:
        dec.push(i)
    stream = time.perf_counter() - t0
    print(f"tokenizer: load {load:.2f} s; encode {len(TEXT)} chars -> {len(ids)} tokens: cold {len(ids) / cold:,.0f} tok/s, "
          f"warm {len(ids) / warm:,.0f} tok/s; stream decode {len(ids) / stream:,.0f} tok/s")


def bench_fsm(steps: int = 20000) -> None:
    counter = itertools.count(1)
    req = F.RunRequest(run_id=1, model=model_facts(), prompt_ids=(1, 2, 3), stages=4, max_tokens=steps + 10,
                       sampling=SamplingPolicy(), eog_ids=frozenset({2}))
    cfg = F.FsmConfig(orchestrator_node_id=99, max_seq_len_cap=1 << 20, pool_window_s=0.0)
    fsm = F.RunFsm(req, cfg, 0.0, id_source=lambda: next(counter))
    fsm.handle(F.MembershipChanged(pool(1, 2, 3, 4)), 0.0)
    fsm.handle(F.Tick(), 0.0)
    for k in range(4):
        fsm.handle(F.StageReady(k), 0.0)
    fsm.handle(F.EndpointsReady(), 0.0)
    t0 = time.perf_counter()
    for seq in range(steps):
        fsm.handle(F.TokenReceived(seq, 7), 1.0)
    dt = time.perf_counter() - t0
    print(f"run FSM: {steps / dt:,.0f} TokenReceived steps/s ({dt / steps * 1e6:.1f} us/step)")


def bench_store(n: int = 5000) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = RunStore.in_state_dir(Path(d))
        run = opb.Run(run_id=1, model="m", state=opb.RUN_STATE_RUNNING, created_us=1)
        t0 = time.perf_counter()
        for k in range(n):
            store.append(1, [pb.LifecycleEvent(kind=pb.TOKEN_RECEIVED, run_id=1, sequence=k, time_us=k)])
            run.token_ids.append(k)
            store.put(run)
        dt = time.perf_counter() - t0
        store.close()
    print(f"run store: {n / dt:,.0f} token steps/s (one event + one record write each, WAL)")


async def _e2e(tokens: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as d:
        fleet = FakeFleet([100 + (k % 50) for k in range(tokens)] + [2])
        async with serving(Path(d), fleet, pool(1, 2)) as s:
            await asyncio.sleep(0.06)
            t0 = time.perf_counter()
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="bench", raw=True, stages=2, max_tokens=tokens))
            n = 0
            async for u in s.stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id)):
                n += u.HasField("token")
            return time.perf_counter() - t0, n


def bench_end_to_end(tokens: int = 1000) -> None:
    registry().get("")  # model facts + tokenizer loaded before timing
    dt, n = asyncio.run(_e2e(tokens))
    print(f"whole run through gRPC, fake fleet: {n} tokens in {dt:.2f} s = {n / dt:,.0f} tok/s "
          f"({dt / n * 1e3:.2f} ms orchestrator overhead per decode step incl. store, watch stream)")


if __name__ == "__main__":
    import logging

    from swactor.common.events import configure_logging

    configure_logging("bench", level=logging.WARNING)
    if not MODEL_PATH.exists():
        sys.exit(f"{MODEL_PATH} missing: run `make model`")
    bench_tokenizer()
    bench_fsm()
    bench_store()
    bench_end_to_end()
