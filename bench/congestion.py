"""Congestion controllers on a simulated link (tests/edge/linksim.py: two real aioquic connections, a virtual clock,
seeded loss): aioquic's Reno and Cubic beside swactor's loss_tolerant (services/swactor/edge/congestion.py).

    .venv/bin/python bench/congestion.py [--seeds 5] [--json bench/out/congestion.json]

Scenarios, each over --seeds seeds (the figures are medians over them):
  * prompt chunks: eight 150 KB objects (a 512-token prefill's activations, 64 rows of SmolLM2's 576 floats), one
    every 0.45 s (a stage's chunk compute on a CPU), at one-way 25/50/75 ms with 0/1/2 % random loss: when each
    chunk's last byte arrived after its write (aim: every chunk within its 0.45 s, so the link never holds the
    pipeline back), and the time over Reno's;
  * bulk through a bottleneck: 8 MB through 20 Mbit/s with a 100 KB drop-tail queue (losses that come with a queue)
    and through a 20 Mbit/s policer (a 3 KB queue: drops with no queueing): seconds, and the queue's drops. Here the
    loss-tolerant controller must back off like Reno, not keep the queue full.
Virtual time: the figures do not depend on this machine's load.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.edge.linksim import LinkSpec, transfer  # noqa: E402

ALGORITHMS = ("reno", "cubic", "loss_tolerant")
GAP_S = 0.45


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", type=pathlib.Path, default=ROOT / "bench" / "out" / "congestion.json")
    a = ap.parse_args()
    rows: list[dict] = []
    print("prompt chunks: 8 x 150 KB, one every 0.45 s; seconds from a chunk's write to its last byte (median over "
          f"{a.seeds} seeds)")
    print(f"{'one-way ms':>10} {'loss %':>6} " + " ".join(f"{alg + ' mean/max':>22}" for alg in ALGORITHMS)
          + "   loss_tolerant / reno (max)")
    for delay in (25, 50, 75):
        for loss in (0.0, 1.0, 2.0):
            cells, maxes = [], {}
            for alg in ALGORITHMS:
                runs = [transfer(alg, LinkSpec(delay_s=delay / 1000, loss=loss / 100, seed=seed), objects=8,
                                 object_bytes=150_000, gap_s=GAP_S) for seed in range(a.seeds)]
                assert all(r.finished for r in runs), f"{alg} at {delay} ms, {loss} %: a transfer did not finish"
                mean = statistics.median(statistics.mean(r.done_s) for r in runs)
                most = statistics.median(max(r.done_s) for r in runs)
                maxes[alg] = most
                cells.append(f"{mean:>10.3f} / {most:>9.3f}")
                rows.append({"scenario": "chunks", "delay_ms": delay, "loss_pct": loss, "algorithm": alg,
                             "mean_s": mean, "max_s": most})
            print(f"{delay:>10} {loss:>6g} " + " ".join(f"{c:>22}" for c in cells)
                  + f"   {maxes['loss_tolerant'] / maxes['reno']:.2f}")
    print("\nbulk: 8 MB at one-way 50 ms through 20 Mbit/s (ideal 3.2 s); seconds and the bottleneck's drops")
    for name, queue in (("100 KB drop-tail queue", 100_000), ("policer (3 KB queue)", 3000)):
        cells = []
        for alg in ALGORITHMS:
            runs = [transfer(alg, LinkSpec(delay_s=0.05, rate_bps=20e6, queue_bytes=queue, seed=seed), objects=1,
                             object_bytes=8_000_000) for seed in range(a.seeds)]
            assert all(r.finished for r in runs), f"{alg} through the {name}: a transfer did not finish"
            secs = statistics.median(r.done_s[0] for r in runs)
            drops = statistics.median(r.dropped_queue for r in runs)
            cells.append(f"{alg} {secs:.2f} s, {drops:g} drops")
            rows.append({"scenario": name, "algorithm": alg, "seconds": secs, "queue_drops": drops})
        print(f"  {name}: " + "; ".join(cells))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
