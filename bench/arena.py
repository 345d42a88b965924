"""Arena benchmark: lease+release round trips over the real socket, and first-touch cost of a
fresh 64 MiB ring with and without pre-faulting (MADV_POPULATE_WRITE) at lease.

    .venv/bin/python bench/arena.py [--round-trips 2000] [--touch-runs 5] [--ring-mib 64]

Round trips: one real swactor-arena process; this process holds the memfd and leases + releases
a 64 KiB ring back to back (blocking client, then asyncio client). First touch: lease a fresh
ring (prefault off / on), time the lease call, then the first write of the whole ring through
ring-rs (page faults included), then a second write of the same pages (already mapped) for
reference. Figures go to stdout and bench/out/arena.json.
Target: >= 500 lease+release round trips/s (a run leases two rings per stage, so this is orders
of magnitude above need; it guards against a regression to per-lease fsyncs or O(n) scans).
Pre-faulting has no target: it moves page allocation and zeroing from the first write to the
lease, but the writing process still takes one minor fault per 4 KiB page of its own mapping, so
the figures show what it buys on this host rather than pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import swactor_ring  # noqa: E402
from swactor.arena.client import AsyncArenaClient, Leased, connect_holder  # noqa: E402
from swactor.v1 import common_pb2  # noqa: E402
from tests.arena.conftest import start_arena  # noqa: E402
from tests.arena.sync_client import ArenaClient  # noqa: E402

MIB = 1 << 20
INGRESS = common_pb2.RING_DIRECTION_INGRESS
TARGET_RT_PER_S = 500.0


def spec(capacity: int) -> common_pb2.RingSpec:
    return common_pb2.RingSpec(data_capacity=capacity, alignment=64)


def round_trips_sync(client: ArenaClient, n: int) -> list[float]:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        out = client.lease(
            request_id=1_000_000 + i,
            requester="bench",
            edge_id=1,
            direction=INGRESS,
            ring_spec=spec(64 * 1024),
        )
        assert isinstance(out, Leased), out
        client.release(out.ring_id)
        lat.append(time.perf_counter() - t0)
    return lat


async def round_trips_async(client: AsyncArenaClient, n: int) -> list[float]:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        out = await client.lease(
            request_id=2_000_000 + i,
            requester="bench",
            edge_id=1,
            direction=INGRESS,
            ring_spec=spec(64 * 1024),
        )
        assert isinstance(out, Leased), out
        await client.release(out.ring_id)
        lat.append(time.perf_counter() - t0)
    return lat


def first_touch(client: ArenaClient, ring_bytes: int, prefault: bool, run: int) -> dict[str, float]:
    payload = b"\x5a" * ring_bytes
    t0 = time.perf_counter()
    out = client.lease(
        request_id=3_000_000 + run * 2 + prefault,
        requester="bench",
        edge_id=2,
        direction=INGRESS,
        ring_spec=spec(ring_bytes),
        prefault=prefault,
    )
    t_lease = time.perf_counter() - t0
    assert isinstance(out, Leased), out
    arena = client.hold.map()
    producer = swactor_ring.Producer(arena, out.ring_layout())
    consumer = swactor_ring.Consumer(arena, out.ring_layout())
    t0 = time.perf_counter()
    assert producer.write(payload) == ring_bytes
    t_first = time.perf_counter() - t0
    consumer.advance_consume(consumer.readable())
    t0 = time.perf_counter()
    assert producer.write(payload) == ring_bytes
    t_warm = time.perf_counter() - t0
    del producer, consumer
    client.release(out.ring_id)
    return {"lease_s": t_lease, "first_write_s": t_first, "warm_write_s": t_warm}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--round-trips", type=int, default=2000)
    p.add_argument("--touch-runs", type=int, default=5)
    p.add_argument("--ring-mib", type=int, default=64)
    args = p.parse_args()
    ring_bytes = args.ring_mib * MIB
    base = Path(tempfile.mkdtemp(prefix="sab-", dir="/tmp"))
    arena = start_arena(base, ceiling=8 << 30)
    results: dict[str, object] = {}
    try:
        with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
            round_trips_sync(client, 100)  # warm up channel and code paths
            lat = round_trips_sync(client, args.round_trips)
            total = sum(lat)
            results["sync"] = {
                "round_trips": len(lat),
                "per_s": len(lat) / total,
                "p50_us": pct(lat, 0.5) * 1e6,
                "p99_us": pct(lat, 0.99) * 1e6,
            }

            async def run_async() -> list[float]:
                async with AsyncArenaClient(hold, arena.socket) as aclient:
                    await round_trips_async(aclient, 100)
                    return await round_trips_async(aclient, args.round_trips)

            alat = asyncio.run(run_async())
            results["async"] = {
                "round_trips": len(alat),
                "per_s": len(alat) / sum(alat),
                "p50_us": pct(alat, 0.5) * 1e6,
                "p99_us": pct(alat, 0.99) * 1e6,
            }
            touch: dict[str, dict[str, float]] = {}
            for prefault in (False, True):
                runs = [first_touch(client, ring_bytes, prefault, r) for r in range(args.touch_runs)]
                touch["prefault" if prefault else "lazy"] = {
                    k: statistics.median(r[k] for r in runs)
                    for k in ("lease_s", "first_write_s", "warm_write_s")
                }
            results["first_touch"] = touch
            results["ring_bytes"] = ring_bytes
    finally:
        arena.stop()
        shutil.rmtree(base, ignore_errors=True)

    sync, asy, touch = results["sync"], results["async"], results["first_touch"]  # type: ignore[assignment]
    print(
        f"lease+release round trips (64 KiB ring, blocking client): {sync['per_s']:.0f}/s  "
        f"p50 {sync['p50_us']:.0f} us  p99 {sync['p99_us']:.0f} us"
    )
    print(
        f"lease+release round trips (64 KiB ring, asyncio client):  {asy['per_s']:.0f}/s  "
        f"p50 {asy['p50_us']:.0f} us  p99 {asy['p99_us']:.0f} us"
    )
    lazy, pre = touch["lazy"], touch["prefault"]
    mib = args.ring_mib
    for name, t in (("no prefault", lazy), ("prefault   ", pre)):
        print(
            f"fresh {mib} MiB ring, {name}: lease {t['lease_s'] * 1e3:7.2f} ms, first write {t['first_write_s'] * 1e3:7.2f} ms "
            f"({mib / t['first_write_s'] / 1024:.2f} GiB/s), warm write {t['warm_write_s'] * 1e3:7.2f} ms, "
            f"lease+first write {(t['lease_s'] + t['first_write_s']) * 1e3:7.2f} ms"
        )
    speedup = lazy["first_write_s"] / pre["first_write_s"]
    total_ratio = (lazy["lease_s"] + lazy["first_write_s"]) / (pre["lease_s"] + pre["first_write_s"])
    print(f"ratio first write no-prefault / prefault: {speedup:.2f}x; lease+first write: {total_ratio:.2f}x")
    print(
        f"ratio first write / warm write without prefault: {lazy['first_write_s'] / lazy['warm_write_s']:.2f}x"
    )
    print(
        f"target round trips >= {TARGET_RT_PER_S:.0f}/s: {'met' if sync['per_s'] >= TARGET_RT_PER_S else 'MISSED'}"
    )
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "arena.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
