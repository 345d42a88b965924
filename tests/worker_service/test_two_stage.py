"""A real 2-stage split of the default model: two compute processes, three rings in one memfd
arena, each stage driven by a StageController core; the greedy tokens must equal those of one
StageModel over all 30 layers. No network: stage 0's egress ring is stage 1's ingress ring."""

from __future__ import annotations

import os
import select
import time
from typing import Any

import numpy as np
import pytest

import swactor_ring as sr
from swactor.common.objflags import NO_TOKEN, PROMPT_CONTINUES
from swactor.v1 import common_pb2
from swactor.worker import stage_fsm
from swactor.worker.plan import build_plan
from swactor.worker.process import wire

from .harness import Arena, WorkerProc
from .plans import MODEL, provision

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not os.path.exists(MODEL), reason="run `make model`")]

PROMPT = [1, 4093, 314, 253, 2726, 28, 198, 30]  # arbitrary in-vocabulary ids
DECODE_STEPS = 3
MAX_SEQ = 32
CHUNK = 3  # the prompt as chunk objects of 3, 3, 2 tokens (docs/orchestrator.md "Prefill chunks")


def reference_tokens() -> list[int]:
    from swactor.worker.compute import StageModel

    m = StageModel(MODEL, 0, 30, max_seq_len=MAX_SEQ, prefill_chunk=CHUNK)
    out = [int(m.step(np.array(PROMPT, np.int32), 0)[0])]
    for k in range(DECODE_STEPS):
        out.append(int(m.step(np.array([out[-1]], np.int32), len(PROMPT) + k)[0]))
    return out


class Stage:
    def __init__(self, proc: WorkerProc, ctrl: stage_fsm.StageController) -> None:
        self.proc, self.ctrl = proc, ctrl
        self.kinds: list[str] = []

    def feed(self, inp: Any) -> None:
        for a in self.ctrl.handle(inp):
            match a:
                case stage_fsm.ToWorker(cmd):
                    self.proc.send(cmd)
                case stage_fsm.Report(ev):
                    self.kinds.append(common_pb2.LifecycleEventKind.Name(ev.kind))


def pump(stages: list[Stage], deadline: float) -> None:
    """Deliver every event the processes have written so far (waiting up to 50 ms for one)."""
    fds = {s.proc.proc.stdout.fileno(): s for s in stages}  # type: ignore[union-attr]
    ready, _, _ = select.select(list(fds), [], [], max(0.0, min(0.05, deadline - time.monotonic())))
    for fd in ready:
        s = fds[fd]
        while True:  # one read may bring several events: deliver them all
            ev = s.proc._read_one(time.monotonic() + 5)
            assert ev is not None, "worker closed stdout"
            assert not isinstance(ev, wire.WorkerFatal | wire.StepFailed | wire.ObjectFailed | wire.RingFault), ev
            s.feed(ev)
            if not s.proc.holds_frames:
                break


def test_two_stage_split_matches_single_model() -> None:
    """A traced run whose prompt arrives in chunks, all written at once: the stages pipeline them, the chunks before
    the last come out as NO_TOKEN objects that keep PROMPT_CONTINUES, then the tokens equal one StageModel's."""
    arena = Arena(16 << 20)
    procs = [WorkerProc(arena), WorkerProc(arena)]
    try:
        for p in procs:
            p.initialize()
        plans = [build_plan(provision(node_id=1, orchestrator=9, stage_index=0, layers=(0, 15), in_edge=1,
                                      out_edge=2, max_seq=MAX_SEQ, prefill_chunk=CHUNK, trace=True), node_id=1, role_id=40),
                 build_plan(provision(node_id=1, orchestrator=9, stage_index=1, layers=(15, 30), in_edge=2,
                                      out_edge=3, max_seq=MAX_SEQ, prefill_chunk=CHUNK, trace=True), node_id=1, role_id=41)]
        stages = [Stage(p, stage_fsm.StageController(node_id=1)) for p in procs]
        t_in, act, t_out = arena.ring(4096), arena.ring(1 << 16), arena.ring(4096)
        rings = [(t_in, act), (act, t_out)]
        for s, plan, (rin, rout) in zip(stages, plans, rings, strict=True):
            # rings first (the harness waits for RingInstalled), then the controller's ConfigureRole
            s.proc.install(rin, "Ingress", plan.inbound.object_spec, edge_id=plan.inbound.edge_id, port_id=0)
            s.proc.install(rout, "Egress", plan.outbound.object_spec, edge_id=plan.outbound.edge_id, port_id=1)
            s.feed(stage_fsm.Provision(plan))
            s.feed(stage_fsm.EdgeReady(plan.inbound.edge_id, rin.ring_id))
            s.feed(stage_fsm.EdgeReady(plan.outbound.edge_id, rout.ring_id))
        deadline = time.monotonic() + 240
        while not all(s.ctrl.state is stage_fsm.StageState.READY for s in stages):
            assert time.monotonic() < deadline, [s.ctrl.state for s in stages]
            pump(stages, deadline)
        token_in, token_out = arena.producer(t_in), arena.consumer(t_out)
        got: list[int] = []
        buf = b""
        chunks = [PROMPT[i:i + CHUNK] for i in range(0, len(PROMPT), CHUNK)]
        for seq, ids in enumerate(chunks):  # every chunk at once
            flags = PROMPT_CONTINUES if seq < len(chunks) - 1 else 0
            payload = np.array(ids, np.int32).tobytes()
            rec = bytes(sr.ObjectHeader(1000 + seq, seq, len(payload), flags).encode()) + payload
            assert token_in.write(rec) == len(rec)
        for seq in range(len(chunks) + DECODE_STEPS):
            if seq >= len(chunks):
                ids = np.array([got[-1]], np.int32).tobytes()
                rec = bytes(sr.ObjectHeader(1000 + seq, seq, len(ids)).encode()) + ids
                assert token_in.write(rec) == len(rec)
            while len(buf) < 44:
                assert time.monotonic() < deadline, f"no token for sequence {seq}"
                pump(stages, deadline)
                buf += token_out.read(4096)
            h = sr.ObjectHeader.parse(buf[:40], 4, 4)
            assert (h.sequence, h.extent, h.object_id) == (seq, 4, 1000 + seq)  # output sequence = input sequence
            token = int(np.frombuffer(buf[40:44], np.int32)[0])
            if seq < len(chunks) - 1:
                assert (h.flags, token) == (PROMPT_CONTINUES, NO_TOKEN)
            else:
                assert h.flags == 0
                got.append(token)
            buf = buf[44:]
        while not all(s.ctrl.state is stage_fsm.StageState.READY for s in stages):
            assert time.monotonic() < deadline
            pump(stages, deadline)
        for s in stages:
            assert s.kinds.count("STEP_COMPLETED") == len(chunks) + DECODE_STEPS
            assert s.kinds.count("OBJECT_PRODUCED") == len(chunks) + DECODE_STEPS
            assert "COMPILE_PROGRESS" in s.kinds and s.kinds.index("COMPILE_PROGRESS") < s.kinds.index("STAGE_READY")
        assert got == reference_tokens()
    finally:
        for p in procs:
            p.close()
        arena.close()
