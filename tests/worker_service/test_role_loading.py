"""A cold ConfigureRole loads on a thread of the compute process: commands are served while the real
GGUF loads, and CancelRole / ShutdownWorker abandon the load at its next layer (spec §28-31)."""

from __future__ import annotations

import os
import select
import time
from typing import Any

import pytest

import swactor_ring as sr
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import framing, wire
from swactor.worker.process.core import WorkerCore
from swactor.worker.process.fsm import WorkerState
from swactor.worker.process.shell import Shell

from .harness import Arena, WorkerProc, spec
from .plans import LAYERS, MODEL

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not os.path.exists(MODEL), reason="run `make model`")]


def llama(start: int = 0, end: int = LAYERS) -> dict[str, Any]:
    return {"kind": "llama_stage", "gguf_path": MODEL, "layer_start": start, "layer_end": end, "max_seq_len": 32}


def role_events(w: WorkerProc, role_id: int) -> list[Any]:
    return [e for e in w.events if isinstance(e, wire.RoleProgress | wire.RoleConfigured | wire.RoleFailed)
            and e.role_id == role_id]


def test_cancel_during_load_serves_commands_meanwhile_and_the_worker_loads_again(worker: WorkerProc,
                                                                                 arena: Arena) -> None:
    worker.initialize()
    worker.send(wire.ConfigureRole(5, llama()))
    # The loop is not blocked by the load (parsing the GGUF alone takes seconds): a ring installs and
    # quiesces while it runs.
    lay = arena.ring(4096)
    worker.install(lay, "Ingress", spec(1024))
    worker.send(wire.UninstallRing(lay.ring_id, pb.UNINSTALL_EDGE_STOPPED))
    worker.expect(wire.RingQuiesced, ring_id=lay.ring_id)
    assert not [e for e in role_events(worker, 5) if not isinstance(e, wire.RoleProgress)], \
        "the load ended before the ring commands were answered: they waited for it"
    worker.send(wire.CancelRole(5))
    failed = worker.expect(wire.RoleFailed, role_id=5)
    assert failed.reason == pb.ROLE_FAILURE_LOAD_CANCELLED
    assert not [e for e in role_events(worker, 5) if isinstance(e, wire.RoleProgress) and e.layers_loaded > 0
                and e.phase == "weights"], \
        "layers were read after CancelRole"
    assert not [e for e in role_events(worker, 5) if isinstance(e, wire.RoleConfigured)]
    # No role was kept: a step on it is refused; the next ConfigureRole loads (cold) and runs.
    worker.send(wire.ExecuteStep(5, 1, [], []))
    assert worker.expect(wire.StepFailed, step_id=1).reason == pb.STEP_FAILURE_ROLE_UNAVAILABLE
    worker.send(wire.CancelRole(5))  # nothing loading any more: ignored, no event
    worker.send(wire.ConfigureRole(6, llama(0, 2)))
    assert worker.expect(wire.RoleConfigured, role_id=6).warm is False
    progress = [(e.phase, e.layers_loaded, e.layers_total) for e in role_events(worker, 6)
                if isinstance(e, wire.RoleProgress)]
    weights = [p for p in progress if p[0] == "weights"]
    compiled = [p for p in progress if p[0] == "compile"]
    assert weights == [("weights", 0, 2), ("weights", 1, 2), ("weights", 2, 2)]
    # then its graphs compile before RoleConfigured: counted in graph calls, up to all of them
    assert progress == weights + compiled and compiled[0][1] == 0 and compiled[-1][1] == compiled[-1][2] > 0
    worker.send(wire.CancelRole(6))  # configured already: stays resident (warm)
    worker.send(wire.ConfigureRole(7, llama(0, 2)))
    assert worker.expect(wire.RoleConfigured, role_id=7).warm is True
    assert [e for e in worker.events if isinstance(e, wire.RoleFailed)] == [failed]
    worker.send(wire.ShutdownWorker("Graceful"))
    assert worker.expect(wire.WorkerStopped).reason == pb.WORKER_STOPPED_GRACEFUL
    assert worker.wait_exit() == 0


def test_shutdown_during_load_abandons_it_and_exits_cleanly(worker: WorkerProc) -> None:
    worker.initialize()
    worker.send(wire.ConfigureRole(5, llama()))
    worker.send(wire.ShutdownWorker("Graceful"))
    failed = worker.expect(wire.RoleFailed, role_id=5)
    assert failed.reason == pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN
    assert worker.expect(wire.WorkerStopped).reason == pb.WORKER_STOPPED_GRACEFUL
    assert worker.wait_exit() == 0
    assert not [e for e in role_events(worker, 5) if isinstance(e, wire.RoleProgress) and e.layers_loaded > 0]
    assert not [e for e in worker.events if isinstance(e, wire.RoleConfigured)]
    kinds = [type(e).__name__ for e in worker.events]
    assert kinds.index("RoleFailed") < kinds.index("WorkerStopped")


def test_newer_configure_supersedes_the_load_in_flight(worker: WorkerProc) -> None:
    worker.initialize()
    worker.send(wire.ConfigureRole(5, llama()))
    worker.send(wire.ConfigureRole(6, llama(0, 1)))
    worker.send(wire.ConfigureRole(7, llama(0, 2)))  # supersedes 6 before 6 even started
    assert worker.expect(wire.RoleFailed, role_id=6).reason == pb.ROLE_FAILURE_LOAD_CANCELLED
    assert worker.expect(wire.RoleFailed, role_id=5).reason == pb.ROLE_FAILURE_LOAD_CANCELLED
    assert worker.expect(wire.RoleConfigured, role_id=7).warm is False
    worker.send(wire.ConfigureRole(8, llama(0, 2)))  # same weights: warm, answered at once
    assert worker.expect(wire.RoleConfigured, role_id=8).warm is True


def test_load_failure_is_a_role_failure_not_a_worker_fault(worker: WorkerProc) -> None:
    worker.initialize()
    worker.send(wire.ConfigureRole(5, llama(0, LAYERS + 5)))
    ev = worker.expect(wire.RoleFailed, role_id=5)
    assert ev.reason == pb.ROLE_FAILURE_WEIGHTS_LOAD_FAILED and f"[0, {LAYERS + 5})" in ev.detail
    worker.send(wire.ConfigureRole(6, {**llama(), "gguf_path": "/nonexistent.gguf"}))
    assert worker.expect(wire.RoleFailed, role_id=6).reason == pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND
    worker.send(wire.ShutdownWorker("Graceful"))
    assert worker.expect(wire.WorkerStopped).reason == pb.WORKER_STOPPED_GRACEFUL
    assert worker.wait_exit() == 0


@pytest.mark.parametrize("threads", [-1, "4", True])
def test_bad_backend_threads_is_fatal_by_name(arena: Arena, threads: object) -> None:
    w = WorkerProc(arena)
    try:
        w.send(wire.InitializeWorker(1, arena.size, sr.RING_VERSION, {"device": "CPU", "threads": threads}))
        ev = w.expect(wire.WorkerFatal)
        assert ev.reason == pb.WORKER_FATAL_BACKEND_INIT_FAILED and "backend.threads" in ev.detail
        assert w.wait_exit() == 1
    finally:
        w.close()


def test_backend_threads_reach_the_compute_core(arena: Arena) -> None:
    """In process (core + shell, no loop): InitializeWorker.backend.threads is what StageModel runs its kernels on."""
    out: list[Any] = []
    core = WorkerCore(arena.size)
    shell = Shell(core, out.append, arena.fd, arena.size)
    shell.command_frame(framing.frame(wire.InitializeWorker(1, arena.size, sr.RING_VERSION,
                                                            {"device": "CPU", "threads": 1})))
    assert core.state is WorkerState.RUNNING and out[-1].backend == {"device": "CPU", "threads": 1}
    shell.command_frame(framing.frame(wire.ConfigureRole(3, llama(0, 1))))
    deadline = time.monotonic() + 60
    while core.roles.loading is not None:  # sleep on the loaders' wakeup pipe, as the loop does
        left = deadline - time.monotonic()
        assert left > 0, f"the load did not end within 60 s: {out}"
        select.select([shell.loaders.wakeup.fileno()], [], [], left)
        shell.loader_woke()
    assert [e for e in out if isinstance(e, wire.RoleConfigured)] == [wire.RoleConfigured(3, False)]
    assert core.roles.role.model.threads == 1


def test_the_kv_dtype_is_part_of_the_weights_key() -> None:
    """A float16 KV cache is a different resident role (other buffers, other graphs): never reused for float32."""
    from swactor.worker.process.roles import weights_key

    assert weights_key({**llama(0, 2), "kv_dtype": "float16"}) != weights_key(llama(0, 2))
    assert weights_key({**llama(0, 2), "kv_dtype": "float32"}) == weights_key(llama(0, 2))  # the default, spelled out


@pytest.mark.parametrize("kv_dtype", ["int8", "", 16, None])
def test_an_unknown_kv_dtype_is_a_config_error_before_the_load(kv_dtype: object) -> None:
    from swactor.worker.process.llama_role import LlamaStageRole
    from swactor.worker.process.roles import RoleError

    def progress(*_: object) -> None:
        raise AssertionError("the load started")

    with pytest.raises(RoleError) as e:
        LlamaStageRole.load({**llama(0, 2), "kv_dtype": kv_dtype}, None, progress, ())  # type: ignore[arg-type]
    assert e.value.reason == pb.ROLE_FAILURE_CONFIG_INVALID
    assert str(e.value).startswith(f"config.kv_dtype must be one of float32, float16, got {kv_dtype!r}")


def test_a_float16_kv_role_loads_in_the_compute_process_as_its_own_resident_role(worker: WorkerProc) -> None:
    worker.initialize()
    worker.send(wire.ConfigureRole(5, {**llama(0, 2), "kv_dtype": "bfloat16"}))
    failed = worker.expect(wire.RoleFailed, role_id=5)
    assert failed.reason == pb.ROLE_FAILURE_CONFIG_INVALID and "config.kv_dtype" in failed.detail
    worker.send(wire.ConfigureRole(6, {**llama(0, 2), "kv_dtype": "float16"}))
    assert worker.expect(wire.RoleConfigured, role_id=6).warm is False
    worker.send(wire.ConfigureRole(7, {**llama(0, 2), "kv_dtype": "float16"}))
    assert worker.expect(wire.RoleConfigured, role_id=7).warm is True
    worker.send(wire.ConfigureRole(8, llama(0, 2)))  # float32: the float16 role is not reused
    assert worker.expect(wire.RoleConfigured, role_id=8).warm is False
    worker.send(wire.ShutdownWorker("Graceful"))
    assert worker.expect(wire.WorkerStopped).reason == pb.WORKER_STOPPED_GRACEFUL
