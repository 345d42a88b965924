"""A scripted in-memory StageFleet for unit tests (never used outside tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from swactor.orchestrator.fleet.fleet import FleetError, Report
from swactor.orchestrator.planning.planner import RunPlan, StagePlan
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb


class FakeEndpoints:
    def __init__(self, fleet: FakeFleet, report: Report) -> None:
        self.fleet = fleet
        self.report = report

    async def inject(self, sequence: int, token_ids: Sequence[int], flags: int = 0) -> None:
        f = self.fleet
        f.injected.append((sequence, tuple(token_ids)))
        if f.fault_at_sequence == sequence:
            self.report(F.StageFault(len(f.plans[-1].stages) - 1, pb.RUN_FAULT_STEP_FAILED, pb.COMPONENT_WORKER,
                                     "scripted step failure"))
            return
        if f.hold_after is not None and sequence >= f.hold_after:
            await f.release.wait()
        token = f.script[sequence] if sequence < len(f.script) else f.eos
        asyncio.get_running_loop().call_later(f.delay_s, self.report, F.TokenReceived(sequence, token))

    async def close(self) -> None:
        self.fleet.closed += 1


class FakeFleet:
    def __init__(self, script: Sequence[int], *, eos: int = 2, fail_stage: int | None = None,
                 fault_at_sequence: int | None = None, hold_after: int | None = None, never_stop: bool = False,
                 delay_s: float = 0.0) -> None:
        self.script = list(script)
        self.eos = eos
        self.fail_stage = fail_stage
        self.fault_at_sequence = fault_at_sequence
        self.hold_after = hold_after
        self.never_stop = never_stop
        self.delay_s = delay_s
        self.release = asyncio.Event()
        self.plans: list[RunPlan] = []
        self.provisioned: list[int] = []
        self.stopped: list[int] = []
        self.injected: list[tuple[int, tuple[int, ...]]] = []
        self.closed = 0
        self._reports: dict[int, Report] = {}

    async def provision(self, plan: RunPlan, stage: StagePlan, report: Report) -> None:
        if not self.plans or self.plans[-1] is not plan:
            self.plans.append(plan)
        self.provisioned.append(stage.stage_index)
        if stage.stage_index == self.fail_stage:
            raise FleetError(pb.RUN_FAULT_PROVISIONING_REJECTED, "scripted rejection")
        self._reports[stage.stage_index] = report
        report(F.Relay(pb.LifecycleEvent(kind=pb.WEIGHTS_LOADED, node_id=stage.node_id, stage_index=stage.stage_index)))
        asyncio.get_running_loop().call_soon(report, F.StageReady(stage.stage_index))

    async def stop_stage(self, plan: RunPlan, stage: StagePlan) -> None:
        self.stopped.append(stage.stage_index)
        if not self.never_stop:
            self._reports[stage.stage_index](F.StageStopped(stage.stage_index))

    async def open_endpoints(self, plan: RunPlan, report: Report) -> FakeEndpoints:
        asyncio.get_running_loop().call_soon(report, F.EndpointsReady())
        return FakeEndpoints(self, report)
