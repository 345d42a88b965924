"""Compute-process data path figures (CPU device): ingress ring -> device, and a step roundtrip.

    .venv/bin/python bench/worker_service.py

- ingress throughput: one large object through a smaller ring window into device memory
  (producer in this process, consumer = the compute process, shared eventfds);
- small-object latency: write a decode-sized activation row (576 float32) -> ObjectLoaded event;
- step roundtrip: object in -> ExecuteStep (test doubling role) -> output object read back;
- a llama stage's one-row step (2 SmolLM2 blocks) through the process beside StageModel.step here: what the
  process adds to a step (with an ExecuteStep round trip per step: no grant).
Speed targets live here only, never in tests.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import swactor_ring as sr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swactor.worker.process import wire
from tests.worker_service.harness import Arena, WorkerProc, spec


def record(seq: int, payload: bytes) -> bytes:
    return bytes(sr.ObjectHeader(seq + 1, seq, len(payload)).encode()) + payload


def main() -> None:
    arena = Arena(256 << 20)
    w = WorkerProc(arena)
    try:
        w.initialize()
        # ---- ingress throughput ----
        size, window = 64 << 20, 1 << 20
        lay = arena.ring(window)
        w.install(lay, "Ingress", spec(size))
        prod = arena.producer(lay)
        data = record(0, np.random.default_rng(0).bytes(size))
        t0 = time.perf_counter()
        sent = 0
        while sent < len(data):
            n = prod.write(memoryview(data)[sent:])
            sent += n
            if n == 0:
                prod.wait_writable(5.0)
        ev = w.expect(wire.ObjectLoaded, ring_id=lay.ring_id)
        dt = time.perf_counter() - t0
        print(f"ingress: {size >> 20} MiB object through a {window >> 10} KiB ring -> device: "
              f"{dt * 1e3:.0f} ms, {size / dt / 1e9:.2f} GB/s")
        w.send(wire.ReleaseDeviceObject(ev.device_handle))
        # ---- small-object latency ----
        lay2 = arena.ring(1 << 16)
        w.install(lay2, "Ingress", spec(1 << 20, row=576))
        p2 = arena.producer(lay2)
        row = np.zeros(576, np.float32).tobytes()
        lat = []
        for seq in range(200):
            t0 = time.perf_counter()
            p2.write(record(seq, row))
            ev = w.expect(wire.ObjectLoaded, ring_id=lay2.ring_id, sequence=seq)
            lat.append(time.perf_counter() - t0)
            w.send(wire.ReleaseDeviceObject(ev.device_handle))
        print(f"object_loaded latency (2304 B row): median {statistics.median(lat) * 1e6:.0f} us, "
              f"p95 {sorted(lat)[190] * 1e6:.0f} us")
        # ---- step roundtrip ----
        w.send(wire.ConfigureRole(9, {"kind": "factory", "factory": "tests.worker_service.roles:make_doubling"}))
        w.expect(wire.RoleConfigured)
        lin, lout = arena.ring(1 << 16), arena.ring(1 << 16)
        w.install(lin, "Ingress", spec(1 << 20, row=576), edge_id=1)
        w.install(lout, "Egress", spec(1 << 20, row=576), edge_id=2, port_id=1)
        pin, cout = arena.producer(lin), arena.consumer(lout)
        rt = []
        for seq in range(100):
            t0 = time.perf_counter()
            pin.write(record(seq, row))
            ev = w.expect(wire.ObjectLoaded, ring_id=lin.ring_id, sequence=seq)
            w.send(wire.ExecuteStep(9, seq + 1, [wire.InputBinding(0, ev.object_id, seq, ev.device_handle)],
                                    [wire.OutputBinding(1, lout.ring_id, ev.object_id, seq, len(row))],
                                    {"start_pos": seq}, True))
            got = b""
            while len(got) < 40 + len(row):
                cout.wait_readable(5.0)
                got += cout.read(1 << 16)
            rt.append(time.perf_counter() - t0)
            w.expect(wire.StepCompleted, step_id=seq + 1)
        print(f"step roundtrip (load + ExecuteStep + produce, doubling role): median "
              f"{statistics.median(rt) * 1e3:.2f} ms, p95 {sorted(rt)[95] * 1e3:.2f} ms")
        llama_step(w, arena)
    finally:
        w.close()
        arena.close()


def llama_step(w: WorkerProc, arena: Arena, lo: int = 10, hi: int = 12, steps: int = 100) -> None:
    """A llama stage's one-row decode step through the process (its blocks' own time as StepCompleted says it) beside
    the same StageModel's step in this process: what the process adds to a step (ring I/O, lines, its loop)."""
    from swactor.worker.compute import StageModel
    from tests.worker_service.plans import MODEL

    if not Path(MODEL).exists():
        print(f"llama stage step: skipped, no {MODEL} (make model)")
        return
    w.send(wire.ConfigureRole(10, {"kind": "llama_stage", "gguf_path": MODEL, "layer_start": lo, "layer_end": hi,
                                   "max_seq_len": steps}))
    w.expect(wire.RoleConfigured, timeout=600, role_id=10)
    lin, lout = arena.ring(1 << 16), arena.ring(1 << 16)
    w.install(lin, "Ingress", spec(1 << 20, row=576), edge_id=3)
    w.install(lout, "Egress", spec(1 << 20, row=576), edge_id=4, port_id=1)
    pin, cout = arena.producer(lin), arena.consumer(lout)
    x = (np.random.default_rng(1).standard_normal(576) * 0.1).astype(np.float32)
    rt, blocks = [], []
    for seq in range(steps):
        t0 = time.perf_counter()
        pin.write(record(seq, x.tobytes()))
        ev = w.expect(wire.ObjectLoaded, ring_id=lin.ring_id, sequence=seq)
        w.send(wire.ExecuteStep(10, 1000 + seq, [wire.InputBinding(0, ev.object_id, seq, ev.device_handle)],
                                [wire.OutputBinding(1, lout.ring_id, ev.object_id, seq, x.nbytes)],
                                {"start_pos": seq}, True))
        got = b""
        while len(got) < 40 + x.nbytes:
            if not cout.wait_readable(5.0):
                raise RuntimeError(f"step {seq}: no output within 5 s; the process said {w.events[-3:]}")
            got += cout.read(1 << 16)
        rt.append(time.perf_counter() - t0)
        blocks.append(w.expect(wire.StepCompleted, step_id=1000 + seq).layers_us / 1e6)
    m = StageModel(MODEL, lo, hi, max_seq_len=steps)
    here = []
    for pos in range(steps):
        t0 = time.perf_counter()
        m.step(x[None, :], pos)
        here.append(time.perf_counter() - t0)
    skip = steps // 10  # the first steps jit the graphs
    med = lambda v: statistics.median(v[skip:]) * 1e3  # noqa: E731
    print(f"llama stage [{lo}, {hi}) one-row step: through the process {med(rt):.2f} ms (its blocks {med(blocks):.2f} ms), "
          f"StageModel.step in this process {med(here):.2f} ms: the process adds {med(rt) - med(here):.2f} ms a step")


if __name__ == "__main__":
    main()
