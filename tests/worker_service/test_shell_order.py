"""The compute process's shell performs the core's actions in the order the core gave them: an outcome
(a step that ran) is fed back only after the actions decided before it, so objects reach stdout in ring
order even when the next one lands in the ring while a step computes (the CI flake behind a stage's
"object sequence 2 loaded in state Executing")."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from swactor.worker.process import wire
from swactor.worker.process.shell import Shell
from tests.worker_service.test_worker_core import Worker, record, step


class LandsAnObjectWhileComputing:
    """A role whose step, like a long prefill chunk, runs while the upstream writes the next object."""

    def __init__(self, ring: Any, seq: int) -> None:
        self.ring, self.seq = ring, seq

    def step(self, inputs: list[Any], runtime: dict[str, Any]) -> list[Any]:
        self.ring.push(record(self.seq, bytes(16)))
        return []


def test_objects_loaded_around_a_step_reach_stdout_in_ring_order() -> None:
    w = Worker()
    w.role()
    ingress = w.ring(5, "Ingress")
    h0 = w.load(5, 0, bytes(16))
    ingress.push(record(1, bytes(16)))  # waiting in the ring when step 0 starts: loaded in the same input
    w.core.roles.role = LandsAnObjectWhileComputing(ingress, 2)
    out: list[wire.Event] = []
    shell = Shell(w.core, out.append, arena_fd=-1, arena_bytes=0)
    shell.bridge = SimpleNamespace(free=lambda obj: None)
    shell.feed(step(1, h0, release=True))
    loaded = [e.sequence for e in out if isinstance(e, wire.ObjectLoaded)]
    assert loaded == [1, 2], out
    assert any(isinstance(e, wire.StepCompleted) for e in out), out
