"""The compute process driven for real: stdin/stdout frames (JSON lines and binary), memfd arena, ring-rs rings (§28-33)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import swactor_ring as sr
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import framing, wire
from swactor.worker.process.loop import WAKE_CHECK_S

from .harness import Arena, WorkerProc, spec

pytestmark = pytest.mark.timeout(120)


def record(seq: int, payload: bytes, *, object_id: int | None = None) -> bytes:
    return bytes(sr.ObjectHeader(object_id or 500 + seq, seq, len(payload)).encode()) + payload


@pytest.mark.parametrize(
    "frame",
    [b"{not json\n", b'["InstallRing"]\n', b'{"type": "FormatDisk"}\n', b'{"type": "RingReadable", "ring_id": "x"}\n',
     bytes((0xFE, 0, 0, 0, 0)), framing.frame(wire.StepCompleted(1, 1))],
    ids=["not json", "not an object", "unknown type", "mistyped field", "unknown binary tag", "an event's frame"],
)
def test_malformed_control_message_is_fatal(worker: WorkerProc, frame: bytes) -> None:
    worker.initialize()
    worker.send_bytes(frame)
    ev = worker.expect(wire.WorkerFatal)
    assert ev.reason == pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE
    assert worker.wait_exit() == 1


def test_command_before_initialize_is_fatal(worker: WorkerProc, arena: Arena) -> None:
    worker.send(wire.RingReadable(1))
    assert worker.expect(wire.WorkerFatal).reason == pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE
    assert worker.wait_exit() == 1


def test_abi_mismatch_and_bad_arena(arena: Arena) -> None:
    w = WorkerProc(arena)
    try:
        w.send(wire.InitializeWorker(1, arena.size, sr.RING_VERSION + 7, {}))
        assert w.expect(wire.WorkerFatal).reason == pb.WORKER_FATAL_RING_HELPER_ABI_MISMATCH
    finally:
        w.close()
    w = WorkerProc(arena, env={"SWACTOR_ARENA_BYTES": str(arena.size * 2)})
    try:
        w.send(wire.InitializeWorker(1, arena.size * 2, sr.RING_VERSION, {}))
        assert w.expect(wire.WorkerFatal).reason == pb.WORKER_FATAL_ARENA_MAP_FAILED
    finally:
        w.close()


def test_every_ingress_object_failure(worker: WorkerProc, arena: Arena) -> None:
    ready = worker.initialize()
    assert ready.worker_generation == 1 and ready.ring_helper_abi == sr.RING_VERSION
    good = np.arange(8, dtype=np.float32).tobytes()  # 2 rows of 4 floats
    cases = {
        pb.OBJECT_FAILURE_HEADER_MALFORMED: b"NOPE" + record(0, good)[4:],
        pb.OBJECT_FAILURE_UNSUPPORTED_OBJECT_VERSION: record(0, good)[:4] + b"\x09\x00" + record(0, good)[6:],
        pb.OBJECT_FAILURE_EXTENT_EXCEEDS_MAX: record(0, bytes(128)),
        pb.OBJECT_FAILURE_EXTENT_ALIGNMENT_INVALID: record(0, bytes(20)),  # 5 floats: not a whole 4-float row
        pb.OBJECT_FAILURE_SEQUENCE_VIOLATION: record(3, good),
        pb.OBJECT_FAILURE_EOF_MID_OBJECT: record(0, good)[:-5],
    }
    rings = {}
    for i, (reason, data) in enumerate(cases.items()):
        layout = arena.ring(256)
        worker.install(layout, "Ingress", spec(64), edge_id=10 + i)
        prod = arena.producer(layout)
        assert prod.write(data) == len(data)
        if reason == pb.OBJECT_FAILURE_EOF_MID_OBJECT:
            prod.close()
        rings[reason] = layout.ring_id
        worker.send(wire.RingReadable(layout.ring_id))
    for reason, ring_id in rings.items():
        ev = worker.expect(wire.ObjectFailed, ring_id=ring_id)
        assert ev.reason == reason, (reason, ev)
    assert not any(isinstance(e, wire.ObjectLoaded) for e in worker.events)


def asleep(pid: int, timeout_s: float = 10.0) -> None:
    """Until the process's main thread sleeps in epoll_wait (its loop's select)."""
    deadline = time.monotonic() + timeout_s
    while "epoll" not in Path(f"/proc/{pid}/wchan").read_text():
        assert time.monotonic() < deadline, f"process {pid} never slept in epoll_wait"
        time.sleep(0.01)


def wake_missed(log: Path) -> list[dict[str, object]]:
    """The ring_wake_missed events a compute process logged to `log`."""
    return [e for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == "ring_wake_missed"]


def test_an_unsignalled_ring_is_looked_at_again_and_said(arena: Arena, tmp_path: Path) -> None:
    """A ring whose wake-ups never reach the process (its producer signals other eventfds than the ones it was given,
    as a lost wake-up would leave it) still gets its object loaded: the loop looks at armed ring ends again every
    WAKE_CHECK_S and logs ring_wake_missed naming the ring, where before the run waited out its first-token timeout."""
    log = tmp_path / "worker.log"
    worker = WorkerProc(arena, log=log)
    try:
        worker.initialize()
        layout = arena.ring(256)
        worker.install(layout, "Ingress", spec(64))
        asleep(worker.proc.pid)  # it armed the ring and sleeps on it: the object below arrives unsignalled
        data = record(0, np.arange(8, dtype=np.float32).tobytes())
        assert arena.producer(layout, shared=False).write(data) == len(data)
        ev = worker.expect(wire.ObjectLoaded, timeout=3 * WAKE_CHECK_S + 5, ring_id=layout.ring_id)
        assert (ev.sequence, ev.extent) == (0, 32)
    finally:
        worker.close()
    missed = wake_missed(log)
    assert missed and missed[0]["ring_ids"] == [layout.ring_id], missed


def test_a_ring_on_private_eventfds_is_looked_at_but_not_said_lost(arena: Arena, tmp_path: Path) -> None:
    """Installed without the other end's eventfds (not shared yet): nobody could have signalled it, so an object
    found there by the periodic look is no lost wake-up (ShareWakeFds, or any command, makes the process look)."""
    log = tmp_path / "worker.log"
    worker = WorkerProc(arena, log=log)
    try:
        worker.initialize()
        layout = arena.ring(256)
        worker.send(wire.InstallRing(layout.ring_id, 7, 0, "Ingress", layout, spec(64), False))  # no wake fds
        worker.expect(wire.RingInstalled, ring_id=layout.ring_id)
        asleep(worker.proc.pid)
        data = record(0, np.arange(8, dtype=np.float32).tobytes())
        assert arena.producer(layout).write(data) == len(data)
        worker.expect(wire.ObjectLoaded, timeout=3 * WAKE_CHECK_S + 5, ring_id=layout.ring_id)
    finally:
        worker.close()
    assert not wake_missed(log)


def test_a_lost_wake_up_found_by_another_input_is_said_too(arena: Arena, tmp_path: Path) -> None:
    """The object arrives unsignalled and a command wakes the loop first: the ring is looked at again then, and the
    loss is logged as well (it used to be said only when the timed look found it)."""
    log = tmp_path / "worker.log"
    worker = WorkerProc(arena, log=log)
    try:
        worker.initialize()
        quiet, other = arena.ring(256), arena.ring(256)
        worker.install(quiet, "Ingress", spec(64))
        asleep(worker.proc.pid)
        data = record(0, np.arange(8, dtype=np.float32).tobytes())
        assert arena.producer(quiet, shared=False).write(data) == len(data)
        worker.send(wire.InstallRing(other.ring_id, 8, 1, "Ingress", other, spec(64), False))
        worker.expect(wire.ObjectLoaded, timeout=3 * WAKE_CHECK_S + 5, ring_id=quiet.ring_id)
    finally:
        worker.close()
    missed = wake_missed(log)
    assert [e["ring_ids"] for e in missed] == [[quiet.ring_id]], missed


def test_a_signalled_ring_is_not_said_lost(arena: Arena, tmp_path: Path) -> None:
    """Objects whose producer signals the shared eventfd load without a ring_wake_missed line."""
    log = tmp_path / "worker.log"
    worker = WorkerProc(arena, log=log)
    try:
        worker.initialize()
        layout = arena.ring(256)
        worker.install(layout, "Ingress", spec(64))
        prod = arena.producer(layout)
        for seq in range(3):
            asleep(worker.proc.pid)
            data = record(seq, np.arange(8, dtype=np.float32).tobytes())
            assert prod.write(data) == len(data)
            ev = worker.expect(wire.ObjectLoaded, ring_id=layout.ring_id, sequence=seq)
            worker.send(wire.ReleaseDeviceObject(ev.device_handle))
    finally:
        worker.close()
    assert not wake_missed(log)


def test_object_larger_than_ring_loads_once_complete(worker: WorkerProc, arena: Arena) -> None:
    worker.initialize()
    layout = arena.ring(128)
    worker.install(layout, "Ingress", spec(4096))
    prod = arena.producer(layout)
    payload = np.arange(256, dtype=np.float32).tobytes()  # 1 KiB through a 128-byte window
    data = record(0, payload)
    sent = 0
    while sent < len(data):
        n = prod.write(data[sent:])
        sent += n
        if n == 0:
            assert prod.wait_writable(10.0)  # the worker drains into device memory and frees space
    ev = worker.expect(wire.ObjectLoaded, ring_id=layout.ring_id)
    assert (ev.sequence, ev.extent, ev.object_id) == (0, 1024, 500)
    assert ev.device_handle.worker_generation == 1
    worker.send(wire.ReleaseDeviceObject(ev.device_handle))
    worker.expect(wire.DeviceObjectReleased, device_handle=ev.device_handle)
    worker.send(wire.ReleaseDeviceObject(ev.device_handle))
    assert worker.expect(wire.ReleaseFailed).reason == pb.RELEASE_FAILURE_UNKNOWN_HANDLE


def configure_doubling(worker: WorkerProc, role_id: int = 9) -> wire.RoleConfigured:
    worker.send(wire.ConfigureRole(role_id, {"kind": "factory", "factory": "tests.worker_service.roles:make_doubling"}))
    worker.expect(wire.RoleProgress, layers_loaded=2, layers_total=2)
    return worker.expect(wire.RoleConfigured, role_id=role_id)  # type: ignore[no-any-return]


def test_prefill_in_output_out_with_same_sequence(worker: WorkerProc, arena: Arena) -> None:
    worker.initialize()
    assert configure_doubling(worker).warm is False
    lin, lout = arena.ring(256), arena.ring(96, alignment=16)  # output (3 rows x 16 B + header) wraps the egress ring
    worker.install(lin, "Ingress", spec(4096), edge_id=1, port_id=0)
    worker.install(lout, "Egress", spec(4096), edge_id=2, port_id=1)
    prod, cons = arena.producer(lin), arena.consumer(lout)
    out = bytearray()
    for seq, rows in enumerate([3, 1, 1]):
        x = np.arange(rows * 4, dtype=np.float32) + seq
        prod.write(record(seq, x.tobytes()))
        worker.send(wire.RingReadable(lin.ring_id))
        loaded = worker.expect(wire.ObjectLoaded, sequence=seq)
        worker.send(wire.ExecuteStep(9, 40 + seq, [wire.InputBinding(0, loaded.object_id, seq, loaded.device_handle)],
                                     [wire.OutputBinding(1, lout.ring_id, 900 + seq, seq, rows * 16)],
                                     {"start_pos": seq}, True))
        for _ in range(20):  # drain as a send-pump would; the step waits for space (backpressure)
            chunk = cons.read(1 << 16)
            out += chunk
            if len(out) >= 40 + rows * 16:
                break
            cons.wait_readable(5.0)
        produced = worker.expect(wire.ObjectProduced, sequence=seq)
        assert (produced.ring_id, produced.object_id, produced.extent) == (lout.ring_id, 900 + seq, rows * 16)
        worker.expect(wire.StepCompleted, step_id=40 + seq)
        worker.expect(wire.DeviceObjectReleased, device_handle=loaded.device_handle)
        h = sr.ObjectHeader.parse(bytes(out[:40]), 1 << 20, 1)
        assert (h.sequence, h.object_id, h.extent) == (seq, 900 + seq, rows * 16)
        np.testing.assert_array_equal(np.frombuffer(bytes(out[40:40 + rows * 16]), np.float32), x * 2)
        out = out[40 + rows * 16:]
    # warm reuse: the same role config resets state instead of reloading
    worker.send(wire.ConfigureRole(9, {"kind": "factory", "factory": "tests.worker_service.roles:make_doubling"}))
    assert worker.expect(wire.RoleConfigured, role_id=9).warm is True


def test_step_failures(worker: WorkerProc, arena: Arena) -> None:
    worker.initialize()
    bogus = wire.InputBinding(0, 1, 0, wire.DeviceHandle(1, 77))
    worker.send(wire.ExecuteStep(9, 1, [bogus], [], {}, True))
    assert worker.expect(wire.StepFailed, step_id=1).reason == pb.STEP_FAILURE_ROLE_UNAVAILABLE
    configure_doubling(worker)
    worker.send(wire.ExecuteStep(9, 2, [bogus], [], {}, True))
    assert worker.expect(wire.StepFailed, step_id=2).reason == pb.STEP_FAILURE_INVALID_INPUT_HANDLE
    lin = arena.ring(256)
    worker.install(lin, "Ingress", spec(4096))
    arena.producer(lin).write(record(0, bytes(16)))
    worker.send(wire.RingReadable(lin.ring_id))
    loaded = worker.expect(wire.ObjectLoaded)
    binding = wire.InputBinding(0, loaded.object_id, 0, loaded.device_handle)
    worker.send(wire.ExecuteStep(9, 3, [binding], [wire.OutputBinding(1, 4242, 1, 0, 16)], {}, False))
    assert worker.expect(wire.StepFailed, step_id=3).reason == pb.STEP_FAILURE_INVALID_OUTPUT_RING
    lout = arena.ring(256)
    worker.install(lout, "Egress", spec(4096), edge_id=2)
    worker.send(wire.ExecuteStep(9, 4, [binding], [wire.OutputBinding(1, lout.ring_id, 1, 0, 32)], {}, False))
    assert worker.expect(wire.StepFailed, step_id=4).reason == pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID
    worker.send(wire.ExecuteStep(9, 5, [binding], [wire.OutputBinding(1, lout.ring_id, 1, 0, 16)],
                                 {"fail": True}, False))
    assert worker.expect(wire.StepFailed, step_id=5).reason == pb.STEP_FAILURE_TINYGRAD_ERROR
    worker.send(wire.ExecuteStep(9, 6, [binding], [wire.OutputBinding(1, lout.ring_id, 1, 0, 16)],
                                 {"oom": True}, False))
    assert worker.expect(wire.StepFailed, step_id=6).reason == pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY


def test_uninstall_and_graceful_shutdown(worker: WorkerProc, arena: Arena) -> None:
    worker.initialize()
    lin = arena.ring(256)
    worker.install(lin, "Ingress", spec(4096))
    worker.send(wire.UninstallRing(lin.ring_id, pb.UNINSTALL_EDGE_STOPPED))
    worker.expect(wire.RingQuiesced, ring_id=lin.ring_id)
    lout = arena.ring(256)
    worker.install(lout, "Egress", spec(4096))
    worker.send(wire.ShutdownWorker("Graceful"))
    worker.expect(wire.RingQuiesced, ring_id=lout.ring_id)
    assert worker.expect(wire.WorkerStopped).reason == pb.WORKER_STOPPED_GRACEFUL
    assert worker.wait_exit() == 0


def test_sigkill_leaves_no_stray_output(worker: WorkerProc) -> None:
    worker.initialize()
    worker.proc.send_signal(signal.SIGKILL)
    assert worker.wait_exit() == -signal.SIGKILL
