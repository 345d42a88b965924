"""StageController (§14): every transition, with worker and edge events as plain values."""

from __future__ import annotations

from swactor.common.objflags import PROMPT_CONTINUES, VERIFY, with_rewind
from swactor.edgeend.establisher import EdgeProvision
from swactor.v1 import common_pb2
from swactor.worker import stage_fsm as s
from swactor.worker.process import wire

HID = 8  # hidden_dim: 8 float32 = 32 bytes per activation row


def plan(last: bool = False, trace: bool = True) -> s.StagePlan:
    act = wire.ObjSpec("Activations", 4096, "Float", 4, HID, 4)
    tok = wire.ObjSpec("Tokens", 64, "Int", 4, 1, 4)
    return s.StagePlan(run_id=1, stage_index=1, stage_count=2 if last else 3, role_id=9,
                       inbound=EdgeProvision(10, "Ingress", 50, 0, act, None),
                       outbound=EdgeProvision(11, "Egress", 60, 1, tok if last else act, None),
                       outbound_kind=common_pb2.EDGE_KIND_TOKEN_OUT if last else common_pb2.EDGE_KIND_ACTIVATION,
                       role_config={"kind": "llama_stage"}, in_row_bytes=4 * HID, out_row_bytes=4 if last else 4 * HID,
                       trace=trace)


def kinds(actions: list) -> list[str]:
    return [common_pb2.LifecycleEventKind.Name(a.event.kind) for a in actions if isinstance(a, s.Report)]


def loaded(seq: int, rows: int, hid: int = 3, flags: int = 0) -> wire.ObjectLoaded:
    return wire.ObjectLoaded(70, 10, 0, 500 + seq, seq, rows * 4 * HID, wire.DeviceHandle(1, hid), flags)


def ready(last: bool = False, trace: bool = True) -> s.StageController:
    c = s.StageController(node_id=4)
    actions = c.handle(s.Provision(plan(last, trace)))
    assert c.state is s.StageState.PREPARING
    assert [a for a in actions if not isinstance(a, s.Report)] == [
        s.ToWorker(wire.ConfigureRole(9, {"kind": "llama_stage"})),
        s.ProvisionEdge(plan(last, trace).inbound), s.ProvisionEdge(plan(last, trace).outbound)]
    assert kinds(actions) == ["STAGE_PROVISION_STARTED", "EDGE_PROVISION_STARTED", "EDGE_PROVISION_STARTED"]
    assert kinds(c.handle(wire.RoleProgress(9, 1, 2))) == ["WEIGHTS_LOAD_PROGRESS"]
    assert kinds(c.handle(wire.RoleConfigured(9, False))) == ["WEIGHTS_LOADED"]
    assert kinds(c.handle(s.EdgeReady(10, 70))) == ["EDGE_READY"]
    assert c.state is s.StageState.PREPARING  # outbound not ready yet
    assert kinds(c.handle(s.EdgeReady(11, 71))) == ["EDGE_READY", "STAGE_READY"]
    assert c.state is s.StageState.READY
    return c


def steps(actions: list) -> list[wire.ExecuteStep]:
    return [a.command for a in actions if isinstance(a, s.ToWorker) and isinstance(a.command, wire.ExecuteStep)]


def test_prefill_then_decode_positions_and_sequences() -> None:
    c = ready()
    (st,) = steps(c.handle(loaded(0, rows=5)))
    assert c.state is s.StageState.EXECUTING
    assert st.runtime == {"start_pos": 0} and st.release_inputs_after
    assert st.inputs[0].sequence == 0 and st.outputs[0] == wire.OutputBinding(1, 71, 500, 0, 5 * 4 * HID)
    assert kinds(c.handle(wire.ObjectProduced(71, 11, 1, 500, 0, 160))) == ["OBJECT_PRODUCED"]
    assert kinds(c.handle(wire.StepCompleted(9, st.step_id))) == ["STEP_COMPLETED"]
    assert c.state is s.StageState.READY
    (st,) = steps(c.handle(loaded(1, rows=1, hid=4)))
    assert st.runtime == {"start_pos": 5} and st.outputs[0].sequence == 1 and st.outputs[0].extent == 4 * HID


def test_loaded_and_produced_events_carry_the_compute_process_s_stamps() -> None:
    """The controller hears of a load after the fact (a granted step may have produced the output by then): the
    events take the time the compute process stamped, so a trace stays in order along the pipeline."""
    c = ready()
    ev = wire.ObjectLoaded(70, 10, 0, 500, 0, 5 * 4 * HID, wire.DeviceHandle(1, 3), at_us=1_000_123)
    actions = c.handle(ev)
    assert ev == loaded(0, rows=5)  # a stamp is not part of what the message says
    rep = next(a for a in actions if isinstance(a, s.Report) and a.event.kind == common_pb2.OBJECT_LOADED)
    assert rep.event.time_us == 1_000_123
    [rep] = c.handle(wire.ObjectProduced(71, 11, 1, 500, 0, 160, at_us=1_000_456))
    assert rep.event.time_us == 1_000_456
    assert wire.decode_event(wire.encode(ev)).at_us == 1_000_123


def test_a_granted_step_started_when_its_input_loaded() -> None:
    """A step the worker started under a grant began as its input loaded: EXECUTE_STEP_STARTED takes the load's stamp
    (the line's lag is not dispatch); a step the controller sends starts when it sends it."""
    c = ready()
    (st,) = steps(c.handle(loaded(0, rows=5)))
    c.handle(wire.ObjectProduced(71, 11, 1, 500, 0, 160))
    c.handle(wire.StepCompleted(9, st.step_id))
    ev = wire.ObjectLoaded(70, 10, 0, 501, 1, 4 * HID, wire.DeviceHandle(1, 4), granted_step=st.step_id + 1,
                           at_us=2_000_777)
    [rep] = [a for a in c.handle(ev) if isinstance(a, s.Report) and a.event.kind == common_pb2.EXECUTE_STEP_STARTED]
    assert rep.event.time_us == 2_000_777 and rep.event.counters["granted"] == 1
    sent = wire.ObjectLoaded(70, 10, 0, 502, 2, 4 * HID, wire.DeviceHandle(1, 5), at_us=3_000_000)
    c.handle(wire.ObjectProduced(71, 11, 1, 501, 1, 4 * HID))
    c.handle(wire.StepCompleted(9, st.step_id + 1))
    [rep] = [a for a in c.handle(sent) if isinstance(a, s.Report) and a.event.kind == common_pb2.EXECUTE_STEP_STARTED]
    assert rep.event.time_us == 0  # stamped as it is reported

def test_untraced_steps_report_no_per_object_events() -> None:
    c = ready(trace=False)
    actions = c.handle(loaded(0, rows=5))
    (st,) = steps(actions)
    assert kinds(actions) == []
    assert kinds(c.handle(wire.ObjectProduced(71, 11, 1, 500, 0, 160))) == []
    assert kinds(c.handle(wire.StepCompleted(9, st.step_id))) == [] and c.state is s.StageState.READY
    assert kinds(c.handle(wire.RoleProgress(9, 3, 10, "compile"))) == ["COMPILE_PROGRESS"]


def test_prompt_chunks_queue_in_order_and_carry_their_flags() -> None:
    """A pipelined prompt: chunks 0..2 (0 and 1 flagged PROMPT_CONTINUES) load while chunk 0 runs; they run one at a
    time in sequence order, positions advance by each chunk's rows, flags reach the output, no sampling before the
    last chunk."""
    c = ready(last=True)
    (st0,) = steps(c.handle(loaded(0, rows=4, hid=10, flags=PROMPT_CONTINUES)))
    assert steps(c.handle(loaded(1, rows=4, hid=11, flags=PROMPT_CONTINUES))) == []
    assert steps(c.handle(loaded(2, rows=3, hid=12))) == []
    assert st0.runtime == {"start_pos": 0, "sample": False} and st0.outputs[0].flags == PROMPT_CONTINUES
    c.handle(wire.ObjectProduced(71, 11, 1, 500, 0, 4))
    (st1,) = steps(c.handle(wire.StepCompleted(9, st0.step_id)))
    assert st1.inputs[0].sequence == 1 and st1.runtime == {"start_pos": 4, "sample": False}
    c.handle(wire.ObjectProduced(71, 11, 1, 501, 1, 4))
    (st2,) = steps(c.handle(wire.StepCompleted(9, st1.step_id)))
    assert st2.inputs[0].sequence == 2 and st2.runtime == {"start_pos": 8} and st2.outputs[0].flags == 0
    c.handle(wire.ObjectProduced(71, 11, 1, 502, 2, 4))
    c.handle(wire.StepCompleted(9, st2.step_id))
    (st3,) = steps(c.handle(loaded(3, rows=1, hid=13)))
    assert st3.runtime == {"start_pos": 11}


def test_last_stage_outputs_one_token() -> None:
    c = ready(last=True)
    (st,) = steps(c.handle(loaded(0, rows=7)))
    assert st.outputs[0].extent == 4


def test_next_object_during_a_step_waits_for_it() -> None:
    c = ready()
    (st0,) = steps(c.handle(loaded(0, rows=2)))
    assert steps(c.handle(loaded(1, rows=1, hid=4))) == []  # one step at a time
    c.handle(wire.ObjectProduced(71, 11, 1, 500, 0, 64))
    (st1,) = steps(c.handle(wire.StepCompleted(9, st0.step_id)))
    assert st1.inputs[0].sequence == 1 and c.state is s.StageState.EXECUTING


def test_sequence_violation_faults_and_releases_the_object() -> None:
    c = ready()
    actions = c.handle(loaded(3, rows=1))
    assert s.ToWorker(wire.ReleaseDeviceObject(wire.DeviceHandle(1, 3))) in actions
    assert kinds(actions) == ["OBJECT_LOADED", "STAGE_FAULTED"]
    fault = [a for a in actions if isinstance(a, s.Report)][-1].event
    assert fault.reason == "RUN_FAULT_SEQUENCE_VIOLATION" and fault.component == common_pb2.COMPONENT_STAGE_CONTROLLER
    assert c.state is s.StageState.FAULTED
    # Faulted rejects new run work (§14)
    later = c.handle(loaded(0, rows=1, hid=9))
    assert steps(later) == [] and s.ToWorker(wire.ReleaseDeviceObject(wire.DeviceHandle(1, 9))) in later


def fault_of(actions: list) -> s.Report:
    (r,) = [a for a in actions if isinstance(a, s.Report) and a.event.kind == common_pb2.STAGE_FAULTED]
    return r


def test_faults_from_every_source() -> None:
    cases = [
        (lambda c: c.handle(wire.RoleFailed(9, common_pb2.ROLE_FAILURE_WEIGHTS_NOT_FOUND, "no file")),
         "RUN_FAULT_WEIGHTS_LOAD_FAILED", common_pb2.COMPONENT_WORKER, "ROLE_FAILURE_WEIGHTS_NOT_FOUND"),
        (lambda c: c.handle(wire.RoleFailed(9, common_pb2.ROLE_FAILURE_DEVICE_OUT_OF_MEMORY, "MemoryError")),
         "RUN_FAULT_DEVICE_OUT_OF_MEMORY", common_pb2.COMPONENT_WORKER, "ROLE_FAILURE_DEVICE_OUT_OF_MEMORY"),
        (lambda c: c.handle(s.EdgeFailed(10, common_pb2.RUN_FAULT_RING_REQUEST_OVERSIZED, common_pb2.COMPONENT_ARENA, "too big")),
         "RUN_FAULT_RING_REQUEST_OVERSIZED", common_pb2.COMPONENT_ARENA, ""),
        (lambda c: c.handle(s.WorkerGone(common_pb2.RUN_FAULT_WORKER_CRASHED, "exit -9")), "RUN_FAULT_WORKER_CRASHED",
         common_pb2.COMPONENT_WORKER_CTL, ""),
        (lambda c: c.handle(wire.ObjectFailed(70, 10, 0, None, None, common_pb2.OBJECT_FAILURE_HEADER_MALFORMED, "magic")),
         "RUN_FAULT_OBJECT_FAILED", common_pb2.COMPONENT_WORKER, "OBJECT_FAILURE_HEADER_MALFORMED"),
        (lambda c: c.handle(wire.ObjectFailed(70, 10, 0, 1, 4, common_pb2.OBJECT_FAILURE_SEQUENCE_VIOLATION, "4 != 0")),
         "RUN_FAULT_SEQUENCE_VIOLATION", common_pb2.COMPONENT_WORKER, "OBJECT_FAILURE_SEQUENCE_VIOLATION"),
    ]
    for make, reason, component, cause in cases:
        for prepared in (False, True):
            c = ready() if prepared else s.StageController(4)
            if not prepared:
                c.handle(s.Provision(plan()))
            r = fault_of(make(c))
            assert (r.event.reason, r.event.component, r.cause) == (reason, component, cause)
            assert c.state is s.StageState.FAULTED


def test_step_failures_while_executing() -> None:
    for reason, run_reason in [(common_pb2.STEP_FAILURE_TINYGRAD_ERROR, "RUN_FAULT_STEP_FAILED"),
                               (common_pb2.STEP_FAILURE_DEVICE_OUT_OF_MEMORY, "RUN_FAULT_DEVICE_OUT_OF_MEMORY"),
                               (common_pb2.STEP_FAILURE_WORKER_PROCESS_EXITED, "RUN_FAULT_WORKER_CRASHED")]:
        c = ready()
        (st,) = steps(c.handle(loaded(0, rows=1)))
        assert c.handle(wire.StepFailed(9, st.step_id + 1, reason, "other step")) == []
        r = fault_of(c.handle(wire.StepFailed(9, st.step_id, reason, "boom")))
        assert r.event.reason == run_reason and r.event.step_id == st.step_id


def test_stop_run_tears_down_edges_then_stops() -> None:
    c = ready()
    steps(c.handle(loaded(0, rows=1)))
    c.handle(loaded(1, rows=1, hid=8))  # waiting input gets released on stop
    actions = c.handle(s.StopRun())
    assert c.state is s.StageState.STOPPING
    assert s.ToWorker(wire.ReleaseDeviceObject(wire.DeviceHandle(1, 8))) in actions
    assert [a for a in actions if isinstance(a, s.StopEdge)] == [s.StopEdge(10), s.StopEdge(11)]
    assert not [a for a in actions if isinstance(a, s.ToWorker) and isinstance(a.command, wire.CancelRole)]
    assert c.handle(s.EdgeStopped(10)) == []
    assert kinds(c.handle(s.EdgeStopped(11))) == ["STAGE_STOPPED"]
    assert c.state is s.StageState.STOPPED
    assert c.handle(s.StopRun()) == [] and c.handle(loaded(2, rows=1)) == []


def test_stop_from_faulted_and_from_preparing() -> None:
    c = ready()
    c.handle(s.WorkerGone(common_pb2.RUN_FAULT_WORKER_FATAL, "x"))
    assert not [a for a in c.handle(s.StopRun()) if isinstance(a, s.ToWorker)]  # the weights loaded: nothing to cancel
    c.handle(s.EdgeStopped(10))
    c.handle(s.EdgeStopped(11))
    assert c.state is s.StageState.STOPPED
    c = s.StageController(4)
    c.handle(s.Provision(plan()))
    # the weights are still loading: the stop abandons the load instead of waiting for it
    assert s.ToWorker(wire.CancelRole(9)) in c.handle(s.StopRun())
    assert c.state is s.StageState.STOPPING
    assert c.handle(wire.RoleFailed(9, common_pb2.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole")) == []  # no fault while stopping
    c.handle(s.EdgeStopped(11))
    c.handle(s.EdgeStopped(10))
    assert c.state is s.StageState.STOPPED
    assert s.StageController(4).handle(s.StopRun()) == []  # nothing provisioned: nothing to stop


def test_unknown_edge_object_is_released_not_executed() -> None:
    c = ready()
    stray = wire.ObjectLoaded(80, 99, 0, 1, 0, 32, wire.DeviceHandle(1, 6))
    assert c.handle(stray) == [s.ToWorker(wire.ReleaseDeviceObject(wire.DeviceHandle(1, 6)))]
    assert c.state is s.StageState.READY


def fetching_plan() -> s.StagePlan:
    import dataclasses

    from swactor.distribution.request import FetchRequest

    req = FetchRequest("https://10.0.0.1:7442/v1/files/" + "a" * 64, "a" * 64, 1000, "b" * 64, 0, 15, 30, "o")
    return dataclasses.replace(plan(), role_config={"kind": "llama_stage", "gguf_path": ""}, fetch=req)


def test_weights_are_fetched_before_the_role_is_configured() -> None:
    c = s.StageController(4)
    p = fetching_plan()
    actions = c.handle(s.Provision(p))
    assert s.FetchWeights(p.fetch) in actions and c.weights is s.Weights.FETCHING
    assert not [a for a in actions if isinstance(a, s.ToWorker)]
    assert kinds(c.handle(s.FetchStarted(900, 100))) == ["WEIGHTS_DOWNLOAD_STARTED"]
    [ev] = c.handle(s.FetchProgress(500, 900, 4000, 0.1))
    assert ev.event.kind == common_pb2.WEIGHTS_DOWNLOAD_PROGRESS and dict(ev.event.counters) == {
        "bytes_done": 500, "bytes_total": 900, "rate_bps": 4000, "eta_ms": 100}
    actions = c.handle(s.WeightsFetched("/cache/a.gguf", 900, 800, 1.5))
    assert kinds(actions) == ["WEIGHTS_DOWNLOADED"]
    assert s.ToWorker(wire.ConfigureRole(9, {"kind": "llama_stage", "gguf_path": "/cache/a.gguf"})) in actions
    assert c.weights is s.Weights.LOADING
    assert c.handle(s.FetchProgress(900, 900, 1, 0.0)) == []  # late progress of a finished fetch
    assert kinds(c.handle(wire.RoleConfigured(9, False))) == ["WEIGHTS_LOADED"] and c.weights is s.Weights.LOADED


def test_a_failed_fetch_faults_naming_it_and_a_stop_cancels_the_fetch() -> None:
    c = s.StageController(4)
    c.handle(s.Provision(fetching_plan()))
    [fault] = c.handle(s.WeightsFetchFailed("ChecksumMismatch", "tensor 'blk.3.ffn_up.weight': ..."))
    assert fault.event.reason == "RUN_FAULT_WEIGHTS_LOAD_FAILED" and fault.cause == "WeightsFetch.ChecksumMismatch"
    assert "blk.3.ffn_up.weight" in fault.event.detail and c.state is s.StageState.FAULTED
    c = s.StageController(4)
    c.handle(s.Provision(fetching_plan()))
    actions = c.handle(s.StopRun())
    assert s.CancelFetch() in actions
    assert not [a for a in actions if isinstance(a, s.ToWorker)]  # no role was asked for: none to cancel
    assert c.handle(s.WeightsFetchFailed("Cancelled", "")) == [] and c.weights is s.Weights.NOT_ASKED


def test_drafts_sample_every_row_and_the_next_object_rewinds_the_rejected_ones() -> None:
    """objflags.VERIFY: the last stage's step samples after every row (one token per row out); the next object's rewind
    moves the run's position back over the rejected drafts before its rows, and tells the role to drop them."""
    c = ready(last=True)

    def done(st: wire.ExecuteStep) -> None:
        c.handle(wire.ObjectProduced(71, 11, 1, st.outputs[0].object_id, st.outputs[0].sequence, st.outputs[0].extent))
        c.handle(wire.StepCompleted(9, st.step_id))

    (st,) = steps(c.handle(loaded(0, rows=5)))
    done(st)
    (st,) = steps(c.handle(loaded(1, rows=4, hid=4, flags=VERIFY)))  # the last token and 3 drafts, positions 5..8
    assert st.runtime == {"start_pos": 5, "every_row": True} and st.outputs[0].extent == 4 * 4
    assert st.outputs[0].flags == VERIFY
    done(st)
    (st,) = steps(c.handle(loaded(2, rows=1, hid=5, flags=with_rewind(0, 2))))  # 1 draft kept: position 7, not 9
    assert st.runtime == {"start_pos": 7, "rewind": 2} and st.outputs[0].extent == 4
    done(st)
    (st,) = steps(c.handle(loaded(3, rows=1, hid=6)))
    assert st.runtime == {"start_pos": 8}


def test_a_rewind_past_the_step_before_faults_the_stage() -> None:
    c = ready()
    (st,) = steps(c.handle(loaded(0, rows=3)))
    c.handle(wire.ObjectProduced(71, 11, 1, 500, 0, 3 * 4 * HID))
    c.handle(wire.StepCompleted(9, st.step_id))
    actions = c.handle(loaded(1, rows=1, hid=4, flags=with_rewind(0, 3)))  # the step before ran 3 rows: at most 2
    assert steps(actions) == [] and s.ToWorker(wire.ReleaseDeviceObject(wire.DeviceHandle(1, 4))) in actions
    (report,) = [a for a in actions if isinstance(a, s.Report) and a.event.kind == common_pb2.STAGE_FAULTED]
    assert c.state is s.StageState.FAULTED and report.event.reason == "RUN_FAULT_OBJECT_FAILED"
    assert "object sequence 1 rewinds 3 rows; the step before ran 3" in report.event.detail
