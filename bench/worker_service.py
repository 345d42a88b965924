"""Compute-process data path figures (CPU device): ingress ring -> device, and a step roundtrip.

    .venv/bin/python bench/worker_service.py

- ingress throughput: one large object through a smaller ring window into device memory
  (producer in this process, consumer = the compute process, shared eventfds);
- small-object latency: write a decode-sized activation row (576 float32) -> ObjectLoaded event;
- step roundtrip: object in -> ExecuteStep (test doubling role) -> output object read back;
- a llama stage's one-row step (2 SmolLM2 blocks) through the process beside StageModel.step here: what the
  process adds to a step (with an ExecuteStep round trip per step: no grant), and the process's CPU time a step;
- a step's control messages (ObjectLoaded, ExecuteStep, ObjectProduced, StepCompleted, ReleaseDeviceObject,
  DeviceObjectReleased) encoded and decoded as the stream carries them (framing.py) beside all as JSON lines.
Speed targets live here only, never in tests.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import swactor_ring as sr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swactor.worker.process import framing, wire
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
        control_messages()
    finally:
        w.close()
        arena.close()


def llama_step(w: WorkerProc, arena: Arena, lo: int = 10, hi: int = 12, steps: int = 300) -> None:
    """A llama stage's one-row decode step through the process (its blocks' own time as StepCompleted says it) beside
    the same StageModel's step in this process: what the process adds to a step (ring I/O, its messages, its loop)."""
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
    cpu = []
    for seq in range(steps):
        if seq == steps // 10:
            cpu.append(process_cpu_s(w.proc.pid))
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
    cpu.append(process_cpu_s(w.proc.pid))
    m = StageModel(MODEL, lo, hi, max_seq_len=steps)
    here = []
    for pos in range(steps):
        t0 = time.perf_counter()
        m.step(x[None, :], pos)
        here.append(time.perf_counter() - t0)
    skip = steps // 10  # the first steps jit the graphs
    med = lambda v: statistics.median(v[skip:]) * 1e3  # noqa: E731
    print(f"llama stage [{lo}, {hi}) one-row step: through the process {med(rt):.2f} ms (its blocks {med(blocks):.2f} ms), "
          f"StageModel.step in this process {med(here):.2f} ms: the process adds {med(rt) - med(here):.2f} ms a step; "
          f"its CPU {(cpu[1] - cpu[0]) / (steps - skip) * 1e3:.2f} ms a step")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, its threads included (/proc: clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def control_messages(n: int = 20000) -> None:
    """A step's control messages through the codec: what the node and the process spend on them, both ends."""
    handle = wire.DeviceHandle(1, 5)
    step = [wire.ObjectLoaded(3, 7, 0, 11, 12, 2304, handle, 0, 0, 1_700_000_000_000_000),
            wire.ExecuteStep(1, 5, [wire.InputBinding(0, 11, 12, handle)], [wire.OutputBinding(1, 4, 11, 12, 2304)],
                             {"start_pos": 17}, True),
            wire.ObjectProduced(4, 8, 1, 11, 12, 2304, 1_700_000_000_000_000), wire.StepCompleted(1, 5, 120),
            wire.DeviceObjectReleased(handle), wire.ReleaseDeviceObject(handle)]
    events = {type(e) for e in step if type(e).__name__ in wire.EVENTS}

    def json_lines() -> None:
        for msg in step:
            line = wire.encode(msg)
            (wire.decode_event if type(msg) in events else wire.decode_command)(line)

    def frames() -> None:
        for msg in step:
            data = framing.frame(msg)
            (framing.decode_event if type(msg) in events else framing.decode_command)(data)

    took = {}
    for name, fn in (("JSON lines", json_lines), ("frames", frames)):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        took[name] = (time.perf_counter() - t0) / n * 1e6
    print(f"a step's 6 control messages, encoded and decoded: JSON lines {took['JSON lines']:.0f} us, "
          f"as framed now {took['frames']:.0f} us ({took['JSON lines'] / took['frames']:.1f}x less)")


if __name__ == "__main__":
    main()
