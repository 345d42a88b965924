"""The compute process's pure core (spec §28-33): inputs in, actions out. No process, no fd, no sleep:
rings are in-memory (`tests.edgeend.fakes`), roles and device objects are plain values, the outcome
of every action the shell would perform is fed back by hand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from swactor.common.fsmtable import InvalidTransition
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import messages as m
from swactor.worker.process import wire
from swactor.worker.process.core import WorkerCore
from swactor.worker.process.fsm import WorkerInput, WorkerState, transition
from swactor.worker.process.roles import weights_key
from tests.edgeend.fakes import BytesSource, FakeCodec, FakeRing, HostSink

ARENA = 1 << 20
ABI = 3
CODEC = FakeCodec()
H = CODEC.header_len
CONFIG = {"kind": "factory", "factory": "tests.worker_service.roles:make_doubling"}


def events(actions: list[m.Action]) -> list[Any]:
    return [a.event for a in actions if isinstance(a, m.Emit)]


def only(actions: list[m.Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def fatal(actions: list[m.Action]) -> int:
    assert actions[-1] == m.Exit(1), actions
    (ev,) = [e for e in events(actions) if isinstance(e, wire.WorkerFatal)]
    return ev.reason  # type: ignore[no-any-return]


def spec(max_extent: int = 256) -> wire.ObjSpec:
    return wire.ObjSpec("Activations", max_extent, "Float", 4, 4, 4)  # rows of 16 bytes


def install(ring_id: int, direction: str, *, wake_fds: bool = False, **kw: Any) -> wire.InstallRing:
    layout = wire.Layout(kw.pop("layout_id", ring_id), 0, 4096, 0, 256, 3840, 64)
    return wire.InstallRing(ring_id, 10 + ring_id, kw.pop("port_id", 0), direction, layout,
                            kw.pop("object_spec", spec()), wake_fds)


def record(seq: int, payload: bytes, object_id: int = 500) -> bytes:
    from swactor.edgeend.objects import HeaderFacts

    return CODEC.encode(HeaderFacts(object_id + seq, seq, len(payload))) + payload


class Worker:
    """A core brought to Running, with its installed fake rings."""

    def __init__(self, threads: int = 0) -> None:
        self.core = WorkerCore(ARENA)
        self.sink = HostSink()
        self.rings: dict[int, FakeRing] = {}
        assert self(wire.InitializeWorker(1, ARENA, ABI, {"device": "CPU", "threads": threads})) == [m.OpenRingHelper()]
        assert self(m.RingHelperOpened(ABI, CODEC)) == [m.OpenBackend("CPU")]
        ready = self(m.BackendReady(42, "CPU", self.sink))
        assert events(ready) == [wire.WorkerReady(42, 1, ABI, {"device": "CPU", "threads": threads})]
        assert self.core.state is WorkerState.RUNNING

    def __call__(self, inp: Any) -> list[m.Action]:
        return self.core.handle(inp)

    def ring(self, ring_id: int, direction: str, capacity: int = 256) -> FakeRing:
        cmd = install(ring_id, direction)
        assert self(cmd) == [m.OpenRing(cmd)]
        ring = self.rings[ring_id] = FakeRing(capacity)
        assert events(self(m.RingOpened(ring_id, ring))) == [wire.RingInstalled(ring_id, 10 + ring_id, 0)]
        return ring

    def role(self, role_id: int = 9) -> Any:
        acts = self(wire.ConfigureRole(role_id, CONFIG))
        assert acts == [m.StartLoad(role_id, CONFIG, None)]
        role = SimpleNamespace(key=weights_key(CONFIG))
        assert events(self(m.LoadDone(role_id, role))) == [wire.RoleConfigured(role_id, False)]
        return role

    def stepping(self, egress: int | None = None) -> wire.DeviceHandle:
        """A role, ingress ring 5 with one object loaded, and step 1 running on it; with `egress` (a
        capacity) the step writes 16 bytes to egress ring 6. The loaded object's handle."""
        self.role()
        self.ring(5, "Ingress")
        if egress is not None:
            self.ring(6, "Egress", capacity=egress)
        h = self.load(5, 0, bytes(16))
        assert only(self(step(1, h, *([(6, 16)] if egress is not None else []))), m.RunStep)
        return h

    def load(self, ring_id: int, seq: int, payload: bytes) -> wire.DeviceHandle:
        self.rings[ring_id].push(record(seq, payload))
        (ev,) = events(self(m.Signal.WAKE))
        assert isinstance(ev, wire.ObjectLoaded) and ev.sequence == seq, ev
        return ev.device_handle


def step(step_id: int, handle: wire.DeviceHandle, *outs: tuple[int, int], release: bool = True,
         role_id: int = 9) -> wire.ExecuteStep:
    return wire.ExecuteStep(role_id, step_id, [wire.InputBinding(0, 500, 0, handle)],
                            [wire.OutputBinding(1, rid, 900, 0, extent) for rid, extent in outs], {"start_pos": 0},
                            release)


# ---- the worker FSM (§31) ----


def test_fsm_table() -> None:
    assert transition(WorkerState.BOOTING, WorkerInput.INITIALIZED) is WorkerState.RUNNING
    assert transition(WorkerState.RUNNING, WorkerInput.SHUTDOWN) is WorkerState.DRAINING
    assert transition(WorkerState.DRAINING, WorkerInput.DRAINED) is WorkerState.STOPPED
    assert transition(WorkerState.BOOTING, WorkerInput.SHUTDOWN) is WorkerState.STOPPED
    assert transition(WorkerState.RUNNING, WorkerInput.CONTROL_LOST) is WorkerState.FATAL
    for state, inp in [(WorkerState.RUNNING, WorkerInput.INITIALIZED), (WorkerState.RUNNING, WorkerInput.DRAINED),
                       (WorkerState.STOPPED, WorkerInput.FATAL), (WorkerState.FATAL, WorkerInput.SHUTDOWN)]:
        with pytest.raises(InvalidTransition):
            transition(state, inp)


@pytest.mark.parametrize("cmd", [wire.RingReadable(1), wire.ConfigureRole(1, {}), wire.ExecuteStep(1, 1, [], [])])
def test_commands_before_initialize_are_fatal(cmd: Any) -> None:
    core = WorkerCore(ARENA)
    assert fatal(core.handle(cmd)) == pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE
    assert core.state is WorkerState.FATAL
    assert core.handle(wire.ShutdownWorker()) == []  # a terminal state reads nothing more


def test_shutdown_while_booting_stops_at_once() -> None:
    core = WorkerCore(ARENA)
    acts = core.handle(wire.ShutdownWorker("AbortInFlight"))
    assert acts == [m.Emit(wire.WorkerStopped(pb.WORKER_STOPPED_GRACEFUL)), m.Exit(0)]
    assert core.state is WorkerState.STOPPED


@pytest.mark.parametrize(("cmd", "helper_abi", "reason"), [
    (wire.InitializeWorker(1, ARENA, ABI + 1, {}), ABI, pb.WORKER_FATAL_RING_HELPER_ABI_MISMATCH),
    (wire.InitializeWorker(1, ARENA * 2, ABI, {}), ABI, pb.WORKER_FATAL_ARENA_MAP_FAILED),
    (wire.InitializeWorker(1, ARENA, ABI, {"threads": -1}), ABI, pb.WORKER_FATAL_BACKEND_INIT_FAILED),
    (wire.InitializeWorker(1, ARENA, ABI, {"threads": True}), ABI, pb.WORKER_FATAL_BACKEND_INIT_FAILED),
    (wire.InitializeWorker(1, ARENA, ABI, {"memory_limit": -1}), ABI, pb.WORKER_FATAL_BACKEND_INIT_FAILED),
    (wire.InitializeWorker(1, ARENA, ABI, {"memory_limit": "1G"}), ABI, pb.WORKER_FATAL_BACKEND_INIT_FAILED),
])
def test_initialize_refusals_are_fatal_by_name(cmd: wire.InitializeWorker, helper_abi: int, reason: int) -> None:
    core = WorkerCore(ARENA)
    assert core.handle(cmd) == [m.OpenRingHelper()]
    assert fatal(core.handle(m.RingHelperOpened(helper_abi, CODEC))) == reason


@pytest.mark.parametrize("reason", [pb.WORKER_FATAL_ARENA_MAP_FAILED, pb.WORKER_FATAL_BACKEND_INIT_FAILED])
def test_backend_failure_reported_by_the_shell_is_fatal(reason: int) -> None:
    core = WorkerCore(ARENA)
    core.handle(wire.InitializeWorker(1, ARENA, ABI, {}))
    assert core.handle(m.RingHelperOpened(ABI, CODEC)) == [m.OpenBackend(None)]
    assert fatal(core.handle(m.HostFailed(reason, "no"))) == reason


def test_malformed_line_second_initialize_and_bad_shutdown_mode_are_fatal() -> None:
    assert fatal(Worker()(m.Malformed("line 3: not JSON"))) == pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE
    assert fatal(Worker()(wire.InitializeWorker(1, ARENA, ABI, {}))) == pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE
    assert fatal(Worker()(wire.ShutdownWorker("Now"))) == pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE


def test_control_closed_exits_without_an_event() -> None:
    w = Worker()
    assert w(m.Signal.CONTROL_CLOSED) == [m.Exit(1)]
    assert w.core.state is WorkerState.FATAL


COMMAND_TABLE = [  # every wire command in Running, on an empty worker: what it asks of the shell
    (wire.InitializeWorker(1, ARENA, ABI, {}), [m.Emit, m.Exit]),  # sent twice: WorkerFatal
    (wire.ConfigureRole(5, CONFIG), [m.StartLoad]),
    (wire.CancelRole(5), []),  # nothing loading: ignored
    (install(5, "Ingress"), [m.OpenRing]),
    (wire.UninstallRing(5, pb.UNINSTALL_EDGE_STOPPED), [m.Emit]),  # RingQuiesced even if unknown
    (wire.ShareWakeFds(5), [m.ShareFds]),  # the fds leave the socket whether or not the ring is known
    (wire.RingReadable(5), []),
    (wire.RingWritable(5), []),
    (wire.ExecuteStep(5, 1, [], []), [m.Emit]),  # StepFailed: no role
    (wire.GrantSteps(5, 1, 1, 5, 0, 16, wire.OutputBinding(1, 6, 0, 0, 16)), [m.Emit]),  # GrantEnded: no role
    (wire.RevokeGrant(5, 1), []),  # no grant stands: ignored
    (wire.ReleaseDeviceObject(wire.DeviceHandle(1, 3)), [m.Emit]),  # ReleaseFailed: unknown
    (wire.ShutdownWorker("Graceful"), [m.Emit, m.Exit]),  # nothing in flight: stopped at once
]


def test_the_command_table_covers_every_wire_command() -> None:
    assert {type(c) for c, _ in COMMAND_TABLE} == set(wire.COMMANDS.values())


@pytest.mark.parametrize(("cmd", "kinds"), COMMAND_TABLE, ids=[type(c).__name__ for c, _ in COMMAND_TABLE])
def test_command_table(cmd: Any, kinds: list[type]) -> None:
    assert [type(a) for a in Worker()(cmd)] == kinds


# ---- rings ----


@pytest.mark.parametrize(("cmd", "reason"), [
    (install(5, "Sideways"), pb.RING_FAULT_RING_LAYOUT_INVALID),
    (install(5, "Ingress", layout_id=6), pb.RING_FAULT_RING_LAYOUT_INVALID),
    (install(5, "Ingress", object_spec=wire.ObjSpec("Activations", 0, "Float", 4, 4, 4)), pb.RING_FAULT_RING_LAYOUT_INVALID),
    (install(5, "Ingress", object_spec=wire.ObjSpec("Activations", 64, "Float", 4, 4, 3)), pb.RING_FAULT_RING_LAYOUT_INVALID),
])
def test_install_refusals_open_nothing(cmd: wire.InstallRing, reason: int) -> None:
    w = Worker()
    acts = w(cmd)
    assert not only(acts, m.OpenRing)
    (fault,) = events(acts)
    assert isinstance(fault, wire.RingFault) and (fault.ring_id, fault.reason) == (5, reason)


def test_install_twice_faults_and_drains_announced_fds() -> None:
    w = Worker()
    w.ring(5, "Ingress")
    acts = w(install(5, "Egress", wake_fds=True))
    assert acts[0] == m.ShareFds(5, None)  # the fds sent for it leave the socket, or the next ring gets them
    assert events(acts)[0].reason == pb.RING_FAULT_RING_STATE_INVALID


def test_ring_open_failure_is_a_ring_fault() -> None:
    w = Worker()
    w(install(5, "Ingress"))
    assert events(w(m.RingOpenFailed(5, pb.RING_FAULT_RING_LAYOUT_INVALID, "magic"))) == [
        wire.RingFault(5, 15, 0, pb.RING_FAULT_RING_LAYOUT_INVALID, "magic")]


def test_share_wake_fds_reopens_the_installed_end() -> None:
    w = Worker()
    ring = w.ring(5, "Ingress")
    assert w(wire.ShareWakeFds(5)) == [m.ShareFds(5, ring)]
    assert w(wire.ShareWakeFds(6)) == [m.ShareFds(6, None)]


def test_ingress_wakes_load_objects_into_handles() -> None:
    w = Worker()
    ring = w.ring(5, "Ingress", capacity=64)
    assert w.core.waits() == [ring]
    data = record(0, bytes(range(48)))
    ring.push(data[:30])  # half a header: nothing yet
    assert w(m.Signal.WAKE) == []
    ring.push(data[30:])
    (loaded,) = events(w(wire.RingReadable(5)))  # a hint is a wake too
    assert loaded == wire.ObjectLoaded(5, 15, 0, 500, 0, 48, wire.DeviceHandle(1, 1))
    assert w.core.handles[1].data == bytes(range(48))
    ring.closed = True
    assert w(m.Signal.WAKE) == []  # closed on an object boundary: orderly, nothing to report
    assert w.core.waits() == []


@pytest.mark.parametrize(("data", "reason"), [
    (record(0, bytes(20)), pb.OBJECT_FAILURE_EXTENT_ALIGNMENT_INVALID),
    (record(0, bytes(512)), pb.OBJECT_FAILURE_EXTENT_EXCEEDS_MAX),
    (record(4, bytes(16)), pb.OBJECT_FAILURE_SEQUENCE_VIOLATION),
    (b"JUNK" + record(0, bytes(16))[4:], pb.OBJECT_FAILURE_HEADER_MALFORMED),
])
def test_ingress_object_failures(data: bytes, reason: int) -> None:
    w = Worker()
    ring = w.ring(5, "Ingress", capacity=1024)
    ring.push(data)
    (ev,) = events(w(m.Signal.WAKE))
    assert isinstance(ev, wire.ObjectFailed) and ev.reason == reason
    assert w.core.waits() == []  # a faulted parser is not slept on


def test_broken_ring_is_a_ring_fault() -> None:
    w = Worker()
    ring = w.ring(5, "Ingress")
    ring.broken = pb.RING_FAULT_RING_STATE_INVALID
    assert events(w(m.Signal.WAKE)) == [wire.RingFault(5, 15, 0, pb.RING_FAULT_RING_STATE_INVALID, "fake ring faulted")]


def test_uninstall_discards_a_partial_object_and_closes_the_end() -> None:
    w = Worker()
    ring = w.ring(5, "Ingress")
    ring.push(record(0, bytes(48))[:H + 16])
    w(m.Signal.WAKE)
    assert len(w.sink.live) == 1
    acts = w(wire.UninstallRing(5, pb.UNINSTALL_EDGE_STOPPED))
    assert acts == [m.CloseRing(ring), m.Emit(wire.RingQuiesced(5))]
    assert w.sink.live == []
    assert events(w(wire.UninstallRing(5, pb.UNINSTALL_EDGE_STOPPED))) == [wire.RingQuiesced(5)]  # idempotent


# ---- device objects ----


def test_release_device_objects() -> None:
    w = Worker()
    w.ring(5, "Ingress")
    h = w.load(5, 0, bytes(16))
    obj = w.core.handles[h.id]
    assert events(w(wire.ReleaseDeviceObject(wire.DeviceHandle(2, h.id)))) == [
        wire.ReleaseFailed(wire.DeviceHandle(2, h.id), pb.RELEASE_FAILURE_STALE_GENERATION)]
    assert w(wire.ReleaseDeviceObject(h)) == [m.FreeDeviceObject(obj), m.Emit(wire.DeviceObjectReleased(h))]
    assert events(w(wire.ReleaseDeviceObject(h))) == [wire.ReleaseFailed(h, pb.RELEASE_FAILURE_UNKNOWN_HANDLE)]


# ---- steps ----


def test_step_success_waits_for_egress_space_then_releases_inputs() -> None:
    w = Worker()
    role = w.role()
    w.ring(5, "Ingress")
    out = w.ring(6, "Egress", capacity=H + 8)  # the output does not fit at once: backpressure
    h = w.load(5, 0, bytes(16))
    inp = w.core.handles[h.id]
    acts = w(step(40, h, (6, 16)))
    assert acts == [m.RunStep(40, role, [inp], {"start_pos": 0})]
    assert events(w(wire.ReleaseDeviceObject(h))) == [wire.ReleaseFailed(h, pb.RELEASE_FAILURE_IN_USE)]
    result = BytesSource(bytes(range(16)))
    assert w(m.StepRan(40, [result])) == []
    assert out in w.core.waits()
    assert out.drain() == record(0, bytes(range(16)), 900)[:H + 8]  # header, then what fits of the payload
    acts = w(m.Signal.WAKE)
    assert events(acts) == [wire.ObjectProduced(6, 16, 0, 900, 0, 16), wire.DeviceObjectReleased(h),
                            wire.StepCompleted(9, 40)]
    assert only(acts, m.FreeDeviceObject) == [m.FreeDeviceObject(result), m.FreeDeviceObject(inp)]
    assert out.drain() == bytes(range(8, 16))
    assert w.core.step is None and w.core.handles == {}


def test_step_without_outputs_keeps_inputs_when_asked() -> None:
    w = Worker()
    w.role()
    w.ring(5, "Ingress")
    h = w.load(5, 0, bytes(16))
    w(step(1, h, release=False))
    assert events(w(m.StepRan(1, []))) == [wire.StepCompleted(9, 1)]
    assert h.id in w.core.handles


def test_step_refusals() -> None:
    w = Worker()
    w.ring(5, "Ingress")
    w.ring(6, "Egress")
    h = w.load(5, 0, bytes(16))

    def refused(cmd: wire.ExecuteStep) -> int:
        acts = w(cmd)
        assert not only(acts, m.RunStep)
        (ev,) = events(acts)
        return ev.reason  # type: ignore[no-any-return]

    assert refused(step(1, h, (6, 16))) == pb.STEP_FAILURE_ROLE_UNAVAILABLE  # no role yet
    w.role()
    assert refused(step(2, h, (6, 16), role_id=8)) == pb.STEP_FAILURE_ROLE_UNAVAILABLE
    assert refused(step(3, wire.DeviceHandle(1, 99), (6, 16))) == pb.STEP_FAILURE_INVALID_INPUT_HANDLE
    assert refused(step(4, wire.DeviceHandle(0, h.id), (6, 16))) == pb.STEP_FAILURE_INVALID_INPUT_HANDLE
    assert refused(step(5, h, (6, 16), (6, 16))) == pb.STEP_FAILURE_INVALID_OUTPUT_RING
    assert refused(step(6, h, (5, 16))) == pb.STEP_FAILURE_INVALID_OUTPUT_RING  # an ingress ring
    assert refused(step(7, h, (77, 16))) == pb.STEP_FAILURE_INVALID_OUTPUT_RING
    w(step(8, h, (6, 16)))
    assert refused(step(9, h, (6, 16))) == pb.STEP_FAILURE_ROLE_UNAVAILABLE  # one step at a time


@pytest.mark.parametrize(("outputs", "reason"), [
    ([], pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID),  # one output bound, none returned
    ([BytesSource(bytes(32))], pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID),  # binding says 16 bytes
])
def test_step_outputs_that_do_not_match_the_bindings(outputs: list[Any], reason: int) -> None:
    w = Worker()
    h = w.stepping(egress=256)
    acts = w(m.StepRan(1, outputs))
    assert events(acts) == [wire.StepFailed(9, 1, reason, events(acts)[0].detail)]
    assert only(acts, m.FreeDeviceObject) == [m.FreeDeviceObject(o) for o in outputs]
    assert h.id in w.core.handles  # a failed step keeps its inputs


@pytest.mark.parametrize("reason", [pb.STEP_FAILURE_TINYGRAD_ERROR, pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY,
                                    pb.STEP_FAILURE_OUTPUT_COPY_FAILED])
def test_role_failure_is_a_step_failure(reason: int) -> None:
    w = Worker()
    w.stepping()
    assert events(w(m.StepRaised(1, reason, "boom"))) == [wire.StepFailed(9, 1, reason, "boom")]
    assert w.core.step is None
    assert events(w(m.StepRan(1, []))) == []  # a late outcome of an ended step is dropped


def test_output_copy_failure_faults_the_ring_and_the_step() -> None:
    w = Worker()
    w.stepping(egress=256)
    bad = BytesSource(bytes(16), fail=True)
    acts = w(m.StepRan(1, [bad]))
    assert [type(e).__name__ for e in events(acts)] == ["RingFault", "StepFailed"]
    assert (events(acts)[0].reason, events(acts)[1].reason) == (pb.RING_FAULT_DEVICE_COPY_FAILED,
                                                             pb.STEP_FAILURE_OUTPUT_COPY_FAILED)
    assert only(acts, m.FreeDeviceObject) == [m.FreeDeviceObject(bad)]


def test_uninstalling_an_output_ring_mid_object_fails_the_step() -> None:
    w = Worker()
    w.stepping(egress=H + 8)  # the output does not fit at once: still mid-object below
    out = w.rings[6]
    w(m.StepRan(1, [BytesSource(bytes(16))]))
    acts = w(wire.UninstallRing(6, pb.UNINSTALL_EDGE_STOPPED))
    assert [(type(e).__name__, getattr(e, "reason", None)) for e in events(acts)] == [
        ("RingFault", pb.RING_FAULT_WORKER_INTERNAL), ("StepFailed", pb.STEP_FAILURE_INVALID_OUTPUT_RING), ("RingQuiesced", None)]
    assert m.CloseRing(out) in acts


def test_a_run_leaving_a_batched_step_drops_its_output_alone() -> None:
    """Two runs' rows in one step (outputs to rings 6 and 7): run 7's edge stops mid-object; run 6's output is
    written and the step completes (docs/runs-in-flight.md: a run stopped while others decode)."""
    w = Worker()
    w.role()
    w.ring(5, "Ingress")
    w.ring(6, "Egress")
    w.ring(7, "Egress", capacity=H + 8)  # its output does not fit at once: mid-object when the ring goes
    a, b = w.load(5, 0, bytes(16)), w.load(5, 1, bytes(16))
    batched = wire.ExecuteStep(9, 1, [wire.InputBinding(0, 500, 0, a), wire.InputBinding(0, 501, 1, b)],
                               [wire.OutputBinding(1, 6, 900, 0, 16), wire.OutputBinding(1, 7, 901, 0, 16)],
                               {"rows": [{"slot": 0, "start_pos": 0}, {"slot": 1, "start_pos": 0}]}, True)
    assert only(w(batched), m.RunStep)
    acts = w(m.StepRan(1, [BytesSource(bytes(16)), BytesSource(bytes(16))]))
    assert [type(e).__name__ for e in events(acts)] == ["ObjectProduced"]  # ring 6's; ring 7 still writing
    acts = w(wire.UninstallRing(7, pb.UNINSTALL_EDGE_STOPPED))
    assert [type(e).__name__ for e in events(acts)] == ["DeviceObjectReleased", "DeviceObjectReleased", "StepCompleted",
                                                        "RingQuiesced"]
    assert w.core.step is None


# ---- role loading ----


def test_load_progress_cancel_and_a_queued_config() -> None:
    w = Worker(threads=2)
    assert w(wire.ConfigureRole(5, CONFIG)) == [m.StartLoad(5, CONFIG, 2)]
    assert events(w(m.LoadProgress(5, 0, 2))) == [wire.RoleProgress(5, 0, 2)]
    assert events(w(m.LoadProgress(5, 0, 2))) == []  # one event per layer
    other = {**CONFIG, "layers": 1, "layer_end": 1}  # other weights (weights_key differs)
    acts = w(wire.ConfigureRole(6, other))
    assert acts == [m.CancelLoad(5)]  # 6 waits for 5 to end: never two sets of weights
    acts = w(wire.ConfigureRole(7, other))
    assert events(acts) == [wire.RoleFailed(6, pb.ROLE_FAILURE_LOAD_CANCELLED, "superseded by ConfigureRole 7")]
    assert events(w(m.LoadProgress(5, 1, 2))) == []  # cancelled: no more progress
    acts = w(m.LoadDone(5, SimpleNamespace(key=weights_key(CONFIG))))  # finished anyway: dropped
    assert events(acts) == [wire.RoleFailed(5, pb.ROLE_FAILURE_LOAD_CANCELLED, "superseded by ConfigureRole 6")]
    assert acts[-1] == m.StartLoad(7, other, 2)
    assert events(w(m.LoadFailed(7, pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND, "gone"))) == [wire.RoleFailed(7, pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND, "gone")]
    assert w.core.roles.role is None


def test_cancel_role() -> None:
    w = Worker()
    w(wire.ConfigureRole(5, CONFIG))
    assert w(wire.CancelRole(5)) == [m.CancelLoad(5)]
    assert w(wire.CancelRole(5)) == []  # asked once
    assert events(w(m.LoadFailed(5, pb.ROLE_FAILURE_LOAD_CANCELLED, "at 1/2 layers"))) == [
        wire.RoleFailed(5, pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole")]
    role = w.role(6)
    assert w(wire.CancelRole(6)) == []  # configured: stays resident, warm for the next run
    assert w(wire.ConfigureRole(7, CONFIG)) == [m.ResetRole(7, role, CONFIG)]
    assert events(w(m.RoleReset(7))) == [wire.RoleConfigured(7, True)]
    assert w(wire.ConfigureRole(8, CONFIG)) == [m.ResetRole(8, role, CONFIG)]
    assert events(w(m.RoleReset(8, pb.ROLE_FAILURE_CONFIG_INVALID, "sampling"))) == [wire.RoleFailed(8, pb.ROLE_FAILURE_CONFIG_INVALID, "sampling")]
    assert events(w(wire.ExecuteStep(7, 1, [], [])))[0].reason == pb.STEP_FAILURE_ROLE_UNAVAILABLE


def test_runs_in_flight_share_the_resident_role_one_slot_each() -> None:
    w = Worker()
    a, b, c = ({**CONFIG, "slot": i} for i in (0, 1, 0))
    assert w(wire.ConfigureRole(5, a)) == [m.StartLoad(5, a, None)]
    assert w(wire.ConfigureRole(6, b)) == []  # the same weights: it waits for the load, never a second one
    role = SimpleNamespace(key=weights_key(CONFIG))
    acts = w(m.LoadDone(5, role))
    assert events(acts) == [wire.RoleConfigured(5, False)] and acts[-1] == m.ResetRole(6, role, b)
    assert not w.core.roles.ready(6)  # until its slot is reset
    assert events(w(m.RoleReset(6))) == [wire.RoleConfigured(6, True)]
    assert w.core.roles.ready(5) and w.core.roles.ready(6)
    assert w(wire.ConfigureRole(7, c)) == [m.ResetRole(7, role, c)]  # a new run in slot 0: run 5 is gone from it
    assert events(w(m.RoleReset(7))) == [wire.RoleConfigured(7, True)]
    assert not w.core.roles.ready(5) and w.core.roles.ready(6) and w.core.roles.ready(7)
    other = {**CONFIG, "layer_end": 1}  # other weights: every run bound to the resident role loses it
    assert w(wire.ConfigureRole(8, other))[-1] == m.StartLoad(8, other, None)
    assert not w.core.roles.ready(6) and not w.core.roles.ready(7)


def test_a_run_cancelled_during_the_load_leaves_it_to_the_runs_that_joined() -> None:
    w = Worker()
    w(wire.ConfigureRole(5, CONFIG))
    w(wire.ConfigureRole(6, {**CONFIG, "slot": 1}))
    acts = w(wire.CancelRole(5))
    assert events(acts) == [wire.RoleFailed(5, pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole")]
    assert only(acts, m.CancelLoad) == []  # run 6 still needs the weights
    role = SimpleNamespace(key=weights_key(CONFIG))
    acts = w(m.LoadDone(5, role))
    assert events(acts) == [] and acts[-1] == m.ResetRole(6, role, {**CONFIG, "slot": 1})
    assert events(w(m.RoleReset(6))) == [wire.RoleConfigured(6, True)]
    assert not w.core.roles.ready(5) and w.core.roles.ready(6)


def test_a_failed_load_fails_every_run_that_joined_it() -> None:
    w = Worker()
    w(wire.ConfigureRole(5, CONFIG))
    w(wire.ConfigureRole(6, {**CONFIG, "slot": 1}))
    acts = w(m.LoadFailed(5, pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND, "gone"))
    assert events(acts) == [wire.RoleFailed(5, pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND, "gone"),
                            wire.RoleFailed(6, pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND, "gone")]


# ---- draining ----


def test_graceful_shutdown_finishes_the_step_then_quiesces() -> None:
    w = Worker()
    w.role()
    inr = w.ring(5, "Ingress")
    out = w.ring(6, "Egress", capacity=H + 8)
    h = w.load(5, 0, bytes(16))
    kept = w.core.handles[w.load(5, 1, bytes(16)).id]  # loaded, never used: freed by the drain
    w(step(1, h, (6, 16)))
    w(m.StepRan(1, [BytesSource(bytes(16))]))
    assert events(w(wire.ShutdownWorker("Graceful"))) == []
    assert w.core.state is WorkerState.DRAINING
    for cmd, reason in [(wire.ConfigureRole(3, CONFIG), pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN),
                        (wire.ExecuteStep(9, 2, [], []), pb.STEP_FAILURE_WORKER_SHUTTING_DOWN),
                        (install(7, "Ingress"), pb.RING_FAULT_WORKER_SHUTTING_DOWN)]:
        assert events(w(cmd))[0].reason == reason
    out.drain()
    acts = w(m.Signal.WAKE)
    assert [type(e).__name__ for e in events(acts)] == [
        "ObjectProduced", "DeviceObjectReleased", "StepCompleted", "RingQuiesced", "RingQuiesced", "WorkerStopped"]
    assert events(acts)[-1] == wire.WorkerStopped(pb.WORKER_STOPPED_GRACEFUL)
    assert m.CloseRing(inr) in acts and m.CloseRing(out) in acts
    assert m.FreeDeviceObject(kept) in acts and w.core.handles == {}
    assert acts[-1] == m.Exit(0)
    assert w.core.state is WorkerState.STOPPED


def test_abort_in_flight_fails_the_step_and_abandons_a_load() -> None:
    w = Worker()
    w.stepping()
    other = {"kind": "factory", "factory": "tests.worker_service.roles:other"}
    assert w(wire.ConfigureRole(6, other)) == [m.StartLoad(6, other, None)]  # other weights: a cold load
    acts = w(wire.ShutdownWorker("AbortInFlight"))
    assert [(type(e).__name__, getattr(e, "reason", None)) for e in events(acts)] == [
        ("RoleFailed", pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN), ("StepFailed", pb.STEP_FAILURE_WORKER_SHUTTING_DOWN),
        ("RingQuiesced", None), ("WorkerStopped", pb.WORKER_STOPPED_ABORT_IN_FLIGHT)]
    assert m.CancelLoad(6) in acts and acts[-1] == m.Exit(0)
    assert w(m.LoadDone(6, SimpleNamespace(key=()))) == []  # stopped: the abandoned load's outcome changes nothing


def test_the_device_memory_limit_reaches_the_backend() -> None:
    core = WorkerCore(ARENA)
    core.handle(wire.InitializeWorker(1, ARENA, ABI, {"device": "CPU", "memory_limit": 1 << 20}))
    assert core.handle(m.RingHelperOpened(ABI, CODEC)) == [m.OpenBackend("CPU", 1 << 20)]


# ---- step grants (docs/worker.md "Step grants") ----


def grant(sequence: int = 0, step_id: int = 7, grant_id: int = 1, start_pos: int = 3) -> wire.GrantSteps:
    """Rows of 16 bytes on ingress ring 5, each written to egress ring 6."""
    return wire.GrantSteps(9, step_id, grant_id, 5, sequence, 16, wire.OutputBinding(1, 6, 0, 0, 16),
                           {"start_pos": start_pos, "slot": 0})


def granted_worker() -> tuple[Worker, Any]:
    w = Worker()
    role = w.role()
    w.ring(5, "Ingress")
    w.ring(6, "Egress")
    assert w(grant()) == []
    return w, role


def push(w: Worker, seq: int, payload: bytes, flags: int = 0) -> list[m.Action]:
    from swactor.edgeend.objects import HeaderFacts

    w.rings[5].push(CODEC.encode(HeaderFacts(500 + seq, seq, len(payload), flags)) + payload)
    return w(m.Signal.WAKE)


def test_granted_rows_run_as_they_load_each_as_the_controller_would_have_sent_it() -> None:
    w, role = granted_worker()
    for k in range(2):  # one step id and one position further each
        acts = push(w, k, bytes(16))
        (loaded,) = events(acts)
        assert loaded == wire.ObjectLoaded(5, 15, 0, 500 + k, k, 16, loaded.device_handle, 0, 7 + k)
        inp = w.core.handles[loaded.device_handle.id]
        assert only(acts, m.RunStep) == [m.RunStep(7 + k, role, [inp], {"start_pos": 3 + k, "slot": 0})]
        assert w.core.step is not None and w.core.step.cmd.outputs == [wire.OutputBinding(1, 6, 500 + k, k, 16, 0)]
        assert events(w(m.StepRan(7 + k, [BytesSource(bytes(16))]))) == [wire.ObjectProduced(6, 16, 0, 500 + k, k, 16),
                                            wire.DeviceObjectReleased(loaded.device_handle), wire.StepCompleted(9, 7 + k)]
    assert w.core.handles == {} and w.core.grant is not None and w.core.grant.sequence == 2


@pytest.mark.parametrize(("payload", "flags", "cause"), [
    (bytes(32), 0, "is not a granted row"),  # two rows: a prompt chunk, the controller's
    (bytes(16), 1, "is not a granted row"),  # PROMPT_CONTINUES: a prompt row
])
def test_an_object_the_grant_does_not_cover_ends_it_before_its_object_loaded(payload: bytes, flags: int, cause: str) -> None:
    w, _role = granted_worker()
    acts = push(w, 0, payload, flags)
    ended, loaded = events(acts)
    assert (ended.grant_id, ended.sequence) == (1, 0) and cause in ended.cause
    assert isinstance(loaded, wire.ObjectLoaded) and loaded.granted_step == 0
    assert not only(acts, m.RunStep) and w.core.grant is None


def test_an_object_behind_a_step_in_flight_is_the_controllers() -> None:
    w, _role = granted_worker()
    assert events(push(w, 0, bytes(16)))[0].granted_step == 7  # step 7 in flight from here
    acts = push(w, 1, bytes(16))
    ended, loaded = events(acts)
    assert "in flight" in ended.cause and ended.sequence == 1 and loaded.granted_step == 0
    assert not only(acts, m.RunStep)


def test_revoke_ends_the_grant_once_and_the_next_rows_wait_for_execute_step() -> None:
    w, _role = granted_worker()
    assert events(w(wire.RevokeGrant(9, 1))) == [wire.GrantEnded(9, 1, 0, "revoked")]
    assert w(wire.RevokeGrant(9, 1)) == []  # already ended: ignored
    acts = push(w, 0, bytes(16))
    assert events(acts)[0].granted_step == 0 and not only(acts, m.RunStep)


def test_a_grant_ends_with_its_rings_and_is_refused_without_role_rings_or_beside_another() -> None:
    w, _role = granted_worker()
    acts = w(wire.UninstallRing(6, pb.UNINSTALL_EDGE_STOPPED))
    assert [type(e).__name__ for e in events(acts)] == ["GrantEnded", "RingQuiesced"]

    w = Worker()
    assert "not configured" in events(w(grant()))[0].cause
    w.role()
    assert "not installed" in events(w(grant()))[0].cause
    w.ring(5, "Ingress")
    w.ring(6, "Egress")
    bad = wire.GrantSteps(9, 7, 3, 5, 0, 16, wire.OutputBinding(1, 6, 0, 0, 16), {"start_pos": "3"})
    assert "runtime.start_pos must be a non-negative integer, got '3'" in events(w(bad))[0].cause
    assert w(grant()) == []
    assert events(w(grant(grant_id=2))) == [wire.GrantEnded(9, 2, 0, "grant 1 stands")]


def test_shutdown_ends_the_grant() -> None:
    w, _role = granted_worker()
    acts = w(wire.ShutdownWorker("Graceful"))
    assert events(acts)[0] == wire.GrantEnded(9, 1, 0, "worker shutting down")
