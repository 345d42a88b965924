"""GpuWorkerCtl core (§31): every transition, with time passed in (no sleeps, no processes)."""

from __future__ import annotations

from swactor.v1 import common_pb2 as pb
from swactor.worker.ctl_fsm import (
    CtlCore,
    CtlState,
    Deliver,
    FromWorker,
    KillProcess,
    NeverReady,
    ProcessExited,
    Send,
    Spawned,
    SpawnFailed,
    SpawnProcess,
    Start,
    StdoutMalformed,
    Tick,
    WorkerCrashed,
    WorkerFailed,
    WriteCommand,
)
from swactor.worker.process import wire

READY = wire.WorkerReady(42, 1, 1, {})


def delivered(actions: list) -> list:
    return [a.event for a in actions if isinstance(a, Deliver)]


def running() -> CtlCore:
    core = CtlCore(arena_ceiling=1 << 20, ring_helper_abi=1, init_timeout_s=5, stop_timeout_s=2)
    assert core.handle(Start(), 0.0) == [SpawnProcess(1)]
    assert core.state is CtlState.SPAWNING
    (write,) = core.handle(Spawned(1, 42), 0.1)
    assert isinstance(write, WriteCommand) and write.command == wire.InitializeWorker(1, 1 << 20, 1, {})
    assert core.state is CtlState.INITIALIZING
    assert delivered(core.handle(FromWorker(1, READY), 0.1)) == [READY]
    assert core.state is CtlState.RUNNING and core.deadline is None
    return core


def install(core: CtlCore, ring_id: int = 7) -> None:
    layout = wire.Layout(ring_id, 0, 4096, 0, 256, 3840, 64)
    cmd = wire.InstallRing(ring_id, 3, 0, "Ingress", layout, wire.ObjSpec("Activations", 64, "Float", 4, 4, 4))
    assert core.handle(Send(cmd), 0.0) == [WriteCommand(cmd)]
    core.handle(FromWorker(1, wire.RingInstalled(ring_id, 3, 0)), 0.0)


def test_initialize_timeout_kills_and_fails() -> None:
    core = CtlCore(1 << 20, 1, init_timeout_s=5)
    core.handle(Start(), 0.0)
    core.handle(Spawned(1, 1), 1.0)
    assert core.handle(Tick(), 5.9) == []
    actions = core.handle(Tick(), 6.0)
    assert actions[0] == KillProcess(1)
    (ev,) = delivered(actions)
    assert isinstance(ev, WorkerFailed) and ev.cause is NeverReady.INITIALIZE_TIMEOUT
    assert core.state is CtlState.FAILED


def test_worker_fatal_and_early_exit_and_spawn_failure() -> None:
    for inp, cause, fatal in [
            (FromWorker(1, wire.WorkerFatal(pb.WORKER_FATAL_ARENA_MAP_FAILED, "x")), NeverReady.WORKER_FATAL,
             pb.WORKER_FATAL_ARENA_MAP_FAILED),
            (ProcessExited(1, 1), NeverReady.PROCESS_EXITED, pb.WORKER_FATAL_REASON_UNSPECIFIED)]:
        core = CtlCore(1 << 20, 1)
        core.handle(Start(), 0.0)
        core.handle(Spawned(1, 1), 0.0)
        (ev,) = delivered(core.handle(inp, 0.0))
        assert isinstance(ev, WorkerFailed) and (ev.cause, ev.fatal) == (cause, fatal) and core.state is CtlState.FAILED
    core = CtlCore(1 << 20, 1)
    core.handle(Start(), 0.0)
    (ev,) = delivered(core.handle(SpawnFailed(1, "no python"), 0.0))
    assert ev.cause is NeverReady.SPAWN_FAILED


def test_wrong_generation_ready_is_a_protocol_fault() -> None:
    core = CtlCore(1 << 20, 1)
    core.handle(Start(), 0.0)
    core.handle(Spawned(1, 1), 0.0)
    actions = core.handle(FromWorker(1, wire.WorkerReady(1, 99, 1, {})), 0.0)
    assert KillProcess(1) in actions and core.state is CtlState.FAILED


def test_crash_synthesizes_worker_crashed_ring_faults_and_step_failure() -> None:
    core = running()
    install(core, 7)
    install(core, 8)
    core.handle(FromWorker(1, wire.ObjectLoaded(7, 3, 0, 1, 0, 16, wire.DeviceHandle(1, 5))), 0.0)
    step = wire.ExecuteStep(9, 77, [wire.InputBinding(0, 1, 0, wire.DeviceHandle(1, 5))], [], {}, True)
    assert core.handle(Send(step), 0.0) == [WriteCommand(step)]
    events = delivered(core.handle(ProcessExited(1, -9), 0.0))
    assert isinstance(events[0], WorkerCrashed) and events[0].returncode == -9
    assert wire.StepFailed(9, 77, pb.STEP_FAILURE_WORKER_PROCESS_EXITED, "worker process gone") in events
    assert [e.ring_id for e in events if isinstance(e, wire.RingFault)] == [7, 8]
    assert all(e.reason == pb.RING_FAULT_WORKER_PROCESS_EXITED for e in events if isinstance(e, wire.RingFault))
    assert core.state is CtlState.FAILED and core.handles == set()
    # the dead generation's rings quiesce at once on UninstallRing: the reaped process is the proof
    assert delivered(core.handle(Send(wire.UninstallRing(7, pb.UNINSTALL_RING_FAULTED)), 0.0)) == [wire.RingQuiesced(7)]
    # restart: a new generation, old handles invalid
    assert core.handle(Start(), 10.0) == [SpawnProcess(2)]
    assert core.rings == {}


def test_malformed_stdout_is_a_crash() -> None:
    core = running()
    actions = core.handle(StdoutMalformed(1, "not json"), 0.0)
    assert KillProcess(1) in actions and isinstance(delivered(actions)[0], WorkerCrashed)


def test_running_validates_commands() -> None:
    core = running()
    install(core, 7)
    layout = wire.Layout(7, 0, 4096, 0, 256, 3840, 64)
    dup = wire.InstallRing(7, 3, 0, "Ingress", layout, wire.ObjSpec("Activations", 64, "Float", 4, 4, 4))
    (ev,) = delivered(core.handle(Send(dup), 0.0))
    assert isinstance(ev, wire.RingFault) and ev.reason == pb.RING_FAULT_RING_STATE_INVALID
    stale = wire.ExecuteStep(9, 1, [wire.InputBinding(0, 1, 0, wire.DeviceHandle(0, 5))], [], {}, True)
    (ev,) = delivered(core.handle(Send(stale), 0.0))
    assert ev == wire.StepFailed(9, 1, pb.STEP_FAILURE_INVALID_INPUT_HANDLE, ev.detail)
    (ev,) = delivered(core.handle(Send(wire.ReleaseDeviceObject(wire.DeviceHandle(0, 5))), 0.0))
    assert ev == wire.ReleaseFailed(wire.DeviceHandle(0, 5), pb.RELEASE_FAILURE_STALE_GENERATION)
    assert delivered(core.handle(Send(wire.UninstallRing(99, pb.UNINSTALL_EDGE_STOPPED)), 0.0)) == [wire.RingQuiesced(99)]
    core.handle(FromWorker(1, wire.ObjectLoaded(7, 3, 0, 1, 0, 16, wire.DeviceHandle(1, 5))), 0.0)
    good = wire.ExecuteStep(9, 2, [wire.InputBinding(0, 1, 0, wire.DeviceHandle(1, 5))], [], {}, True)
    core.handle(Send(good), 0.0)
    (ev,) = delivered(core.handle(Send(wire.ExecuteStep(9, 3, [], [], {}, True)), 0.0))
    assert ev.reason == pb.STEP_FAILURE_ROLE_UNAVAILABLE  # one step at a time
    core.handle(FromWorker(1, wire.StepCompleted(9, 2)), 0.0)
    assert core.step_in_flight is None
    core.handle(FromWorker(1, wire.DeviceObjectReleased(wire.DeviceHandle(1, 5))), 0.0)
    assert core.handles == set()
    core.handle(FromWorker(1, wire.RingQuiesced(7)), 0.0)
    assert 7 not in core.rings


def test_graceful_stop_and_stop_timeout() -> None:
    core = running()
    install(core, 7)
    actions = core.handle(Send(wire.ShutdownWorker("Graceful")), 1.0)
    assert actions == [WriteCommand(wire.ShutdownWorker("Graceful"))] and core.state is CtlState.STOPPING
    (ev,) = delivered(core.handle(Send(wire.ExecuteStep(9, 1, [], [], {}, True)), 1.0))
    assert ev.reason == pb.STEP_FAILURE_WORKER_SHUTTING_DOWN
    assert delivered(core.handle(FromWorker(1, wire.WorkerStopped(pb.WORKER_STOPPED_GRACEFUL)), 1.0)) == [
        wire.WorkerStopped(pb.WORKER_STOPPED_GRACEFUL)]
    events = delivered(core.handle(ProcessExited(1, 0), 1.0))
    assert [e.reason for e in events] == [pb.RING_FAULT_WORKER_SHUTTING_DOWN] and core.state is CtlState.STOPPED
    core = running()
    core.handle(Send(wire.ShutdownWorker("Graceful")), 1.0)
    assert core.handle(Tick(), 2.5) == []
    assert core.handle(Tick(), 3.0) == [KillProcess(1)] and core.state is CtlState.KILLING
    core.handle(ProcessExited(1, -9), 3.0)
    assert core.state is CtlState.STOPPED


def test_commands_when_not_running_are_answered_locally() -> None:
    core = CtlCore(1 << 20, 1)
    (ev,) = delivered(core.handle(Send(wire.ConfigureRole(1, {})), 0.0))
    assert isinstance(ev, wire.RoleFailed) and ev.reason == pb.ROLE_FAILURE_WORKER_UNAVAILABLE
    core.handle(Start(), 0.0)
    assert core.handle(Send(wire.ShutdownWorker("Graceful")), 0.0) == [KillProcess(1)]
    assert core.state is CtlState.KILLING


def test_a_ring_not_quiesced_in_time_kills_the_process_which_is_the_proof() -> None:
    """A frozen compute process: the stage's UninstallRing is never answered; after stop_timeout_s
    the ctl kills it and answers RingQuiesced itself, so the stage can release its rings."""
    core = running()
    install(core, 7)
    install(core, 8)
    uninstall = wire.UninstallRing(7, pb.UNINSTALL_RING_FAULTED)
    assert core.handle(Send(uninstall), 10.0) == [WriteCommand(uninstall)]
    assert core.deadline == 12.0
    assert core.handle(Tick(), 11.9) == []
    actions = core.handle(Tick(), 12.0)
    assert actions[0] == KillProcess(1)
    events = delivered(actions)
    assert isinstance(events[0], WorkerCrashed) and "[7] not quiesced" in events[0].detail
    assert events[-1] == wire.RingQuiesced(7)
    assert core.state is CtlState.FAILED and 7 not in core.rings and 8 in core.rings


def test_quiesced_in_time_clears_the_deadline() -> None:
    core = running()
    install(core, 7)
    core.handle(Send(wire.UninstallRing(7, pb.UNINSTALL_RING_FAULTED)), 10.0)
    assert delivered(core.handle(FromWorker(1, wire.RingQuiesced(7)), 10.0)) == [wire.RingQuiesced(7)]
    assert core.deadline is None and core.handle(Tick(), 20.0) == [] and core.state is CtlState.RUNNING


def test_a_dead_generations_exit_and_lines_do_not_touch_the_next_one() -> None:
    """The process of generation 1 is killed (frozen); its exit and its last stdout lines arrive
    while generation 2 is spawning: they are not generation 2's, which starts normally."""
    core = running()
    install(core, 7)
    core.handle(Send(wire.UninstallRing(7, pb.UNINSTALL_RING_FAULTED)), 10.0)
    core.handle(Tick(), 12.0)
    assert core.state is CtlState.FAILED
    assert core.handle(Start(), 12.0) == [SpawnProcess(2)]
    assert core.handle(FromWorker(1, wire.RingQuiesced(7)), 12.1) == []
    assert core.handle(StdoutMalformed(1, "cut short"), 12.1) == []
    assert core.handle(ProcessExited(1, -9), 12.1) == [] and core.state is CtlState.SPAWNING
    (write,) = core.handle(Spawned(2, 43), 12.2)
    assert write == WriteCommand(wire.InitializeWorker(2, 1 << 20, 1, {}))
    assert delivered(core.handle(FromWorker(2, wire.WorkerReady(43, 2, 1, {})), 12.3))
    assert core.state is CtlState.RUNNING and core.pid == 43


def test_a_spawn_that_returns_after_its_generation_gave_up_is_killed() -> None:
    """Generation 1 times out while its spawn is still running and generation 2 starts: when
    generation 1's process appears it is killed, never initialized, and generation 2's is the one
    commands go to."""
    core = CtlCore(1 << 20, 1, init_timeout_s=5)
    core.handle(Start(), 0.0)
    core.handle(Tick(), 5.0)
    assert core.state is CtlState.FAILED
    assert core.handle(Start(), 5.0) == [SpawnProcess(2)]
    assert core.handle(Spawned(1, 41), 5.1) == [KillProcess(1)]
    (write,) = core.handle(Spawned(2, 42), 5.2)
    assert write == WriteCommand(wire.InitializeWorker(2, 1 << 20, 1, {}))
    # a spawn returning in its own generation after it gave up (shut down before ready) is killed too
    core = CtlCore(1 << 20, 1)
    core.handle(Start(), 0.0)
    core.handle(Send(wire.ShutdownWorker("Graceful")), 0.0)
    assert core.handle(Spawned(1, 41), 0.1) == [KillProcess(1)]
    core.handle(ProcessExited(1, -9), 0.2)
    assert core.state is CtlState.STOPPED


def test_a_step_the_worker_started_under_a_grant_fails_with_the_process() -> None:
    core = running()
    install(core, 7)
    g = wire.GrantSteps(9, 80, 1, 7, 0, 16, wire.OutputBinding(1, 8, 0, 0, 16))
    assert core.handle(Send(g), 0.0) == [WriteCommand(g)]
    (ev,) = delivered(core.handle(Send(wire.GrantSteps(9, 90, 2, 7, 0, 16, g.output)), 0.0))
    assert ev == wire.GrantEnded(9, 2, 0, "grant 1 stands")  # one at a time, answered here
    core.handle(FromWorker(1, wire.ObjectLoaded(7, 3, 0, 1, 0, 16, wire.DeviceHandle(1, 5), 0, 80)), 0.0)
    assert core.step_in_flight == (9, 80) and core.handles == {5}
    events = delivered(core.handle(ProcessExited(1, -9), 0.0))
    assert wire.StepFailed(9, 80, pb.STEP_FAILURE_WORKER_PROCESS_EXITED, "worker process gone") in events
    assert core.grant is None
    (ev,) = delivered(core.handle(Send(g), 0.0))  # no process: the grant ends at once
    assert isinstance(ev, wire.GrantEnded) and ev.grant_id == 1
