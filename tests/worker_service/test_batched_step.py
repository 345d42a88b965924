"""Runs in flight through a real compute process (docs/runs-in-flight.md): one llama_stage role holding two KV
slots, each run with its own ingress and egress ring in one memfd arena; the prompts run as one-input steps in their
slots, then every decode step is ONE ExecuteStep binding both runs' objects. Each run's tokens must equal a solo
StageModel's, and a second run's ConfigureRole of the resident role resets its own slot only."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import swactor_ring as sr
from swactor.worker.process import wire

from .harness import Arena, WorkerProc, spec
from .plans import MODEL

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not os.path.exists(MODEL), reason="run `make model`")]

PROMPTS = {0: [1, 4093, 314, 253, 2726, 28], 1: [6403, 1980, 253, 655]}
DECODE_STEPS = 4
MAX_SEQ = 32
TOKENS = spec(64, kind="Tokens", family="Int", row=1)


def solo(prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's tokens from one StageModel in this process, one run after another."""
    from swactor.worker.compute import StageModel

    m, outs = StageModel(MODEL, 0, 30, max_seq_len=MAX_SEQ), []
    for prompt in prompts:
        m.reset()
        out = [int(m.step(np.array(prompt, np.int32), 0)[0])]
        for k in range(DECODE_STEPS):
            out.append(int(m.step(np.array([out[-1]], np.int32), len(prompt) + k)[0]))
        outs.append(out)
    return outs


def config(slot: int) -> dict[str, Any]:
    return {"kind": "llama_stage", "gguf_path": MODEL, "layer_start": 0, "layer_end": 30, "max_seq_len": MAX_SEQ,
            "slots": 2, "slot": slot}


class Run:
    """One run's rings on the process: token ids in, sampled tokens out."""

    def __init__(self, arena: Arena, proc: WorkerProc, slot: int) -> None:
        self.slot, self.tin, self.tout = slot, arena.ring(4096), arena.ring(4096)
        proc.install(self.tin, "Ingress", TOKENS, edge_id=100 + slot, port_id=0)
        proc.install(self.tout, "Egress", TOKENS, edge_id=200 + slot, port_id=1)
        self.writer, self.reader = arena.producer(self.tin), arena.consumer(self.tout)
        self.seq, self.pos, self.tokens, self.buf = 0, 0, [], b""

    def send(self, proc: WorkerProc, ids: list[int]) -> tuple[wire.InputBinding, wire.OutputBinding]:
        payload = np.array(ids, np.int32).tobytes()
        rec = bytes(sr.ObjectHeader(1000 + self.seq, self.seq, len(payload)).encode()) + payload
        assert self.writer.write(rec) == len(rec)
        loaded = proc.expect(wire.ObjectLoaded, ring_id=self.tin.ring_id, sequence=self.seq)
        binding = wire.InputBinding(0, loaded.object_id, self.seq, loaded.device_handle)
        out = wire.OutputBinding(1, self.tout.ring_id, 5000 + self.seq, self.seq, 4)
        return binding, out

    def runtime(self) -> dict[str, Any]:
        return {"slot": self.slot, "start_pos": self.pos, "sample": True}

    def took(self, rows: int) -> None:
        while len(self.buf) < 44:
            self.buf += self.reader.read(4096)
        h = sr.ObjectHeader.parse(self.buf[:40], 4, 4)
        assert (h.sequence, h.extent) == (self.seq, 4)
        self.tokens.append(int(np.frombuffer(self.buf[40:44], np.int32)[0]))
        self.buf, self.seq, self.pos = self.buf[44:], self.seq + 1, self.pos + rows


def test_two_runs_decode_as_one_batched_step_each_equal_to_its_solo_run() -> None:
    arena = Arena(16 << 20)
    proc = WorkerProc(arena)
    try:
        proc.initialize()
        runs = [Run(arena, proc, 0), Run(arena, proc, 1)]
        proc.send(wire.ConfigureRole(40, config(0)))
        assert proc.expect(wire.RoleConfigured, timeout=240, role_id=40).warm is False
        proc.send(wire.ConfigureRole(41, config(1)))  # the second run: the resident role, its own slot reset
        assert proc.expect(wire.RoleConfigured, role_id=41).warm is True
        step_id = 0
        for run in runs:  # each prompt as a one-input step in its slot
            step_id += 1
            inp, out = run.send(proc, PROMPTS[run.slot])
            proc.send(wire.ExecuteStep(41, step_id, [inp], [out], run.runtime()))
            assert proc.expect(wire.StepCompleted, step_id=step_id).layers_us == 0  # many rows: not a decode step's
            run.took(len(PROMPTS[run.slot]))
        for _ in range(DECODE_STEPS):  # both runs' rows: one step, one pass over the weights
            step_id += 1
            bound = [run.send(proc, [run.tokens[-1]]) for run in runs]
            proc.send(wire.ExecuteStep(41, step_id, [i for i, _ in bound], [o for _, o in bound],
                                       {"rows": [run.runtime() for run in runs]}))
            assert proc.expect(wire.StepCompleted, step_id=step_id).layers_us == 0  # several runs' rows: neither's
            for run in runs:
                run.took(1)
        assert [run.tokens for run in runs] == solo([PROMPTS[0], PROMPTS[1]])
        step_id += 1  # one run's one row: the step says its blocks' own time (the host's speed: step_speed.py)
        inp, out = runs[0].send(proc, [runs[0].tokens[-1]])
        proc.send(wire.ExecuteStep(41, step_id, [inp], [out], runs[0].runtime()))
        assert proc.expect(wire.StepCompleted, step_id=step_id).layers_us > 0
        runs[0].took(1)
        step_id += 1  # a batch whose rows do not match its inputs is the step's failure, named
        bound = [run.send(proc, [run.tokens[-1]]) for run in runs]
        proc.send(wire.ExecuteStep(41, step_id, [i for i, _ in bound], [o for _, o in bound],
                                   {"rows": [runs[0].runtime()]}))
        failed = proc.expect(wire.StepFailed, step_id=step_id)
        assert "runtime.rows must list one" in failed.detail
    finally:
        proc.close()
        arena.close()
