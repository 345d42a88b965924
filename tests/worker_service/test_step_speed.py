"""A host's measured compute speed (worker/step_speed.py): one run's one-row steps over the stage's work in layers,
the median of the recent ones, said again only when it moved; the node feeds it and says it with a structured event;
the membership metadata carries it to the orchestrator."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from swactor.membership.metadata import decode_tags, encode_tags
from swactor.orchestrator.fleet.membership_client import node_info
from swactor.v1 import membership_pb2 as mpb
from swactor.worker.membership import MembershipClientPort
from swactor.worker.node import StageNode
from swactor.worker.process import wire
from swactor.worker.step_speed import StepSpeed
from tests.membership.test_service_loopback import Proc

from .node_fakes import FakeCtl
from .test_runs_in_flight_node import complete, loaded, out_edges, run_plan, steps
from .test_service import serve, settle, stub, updates

pytestmark = pytest.mark.timeout(60)


def test_nothing_is_said_before_min_samples_then_the_median_per_layer() -> None:
    s = StepSpeed(window=8, min_samples=3)
    assert s.decode_step(0.010, 10.0) is None and s.decode_step(0.012, 10.0) is None and s.us_per_layer == 0
    assert s.decode_step(0.500, 10.0) == 1200  # a slow first step (graph not jitted yet) is not the median
    assert s.us_per_layer == 1200


def test_a_new_figure_is_said_only_when_it_moved_by_more_than_the_share() -> None:
    s = StepSpeed(window=3, min_samples=1, change_share=0.1)
    assert s.decode_step(0.010, 10.0) == 1000
    assert s.decode_step(0.0105, 10.0) is None  # median 1025 µs: within 10 %
    assert s.decode_step(0.030, 10.0) is None  # median of (1000, 1050, 3000): 1050
    assert s.decode_step(0.030, 10.0) == 3000  # the window now mostly slow: the host slowed down
    assert s.said_us == 3000


def test_the_work_in_layers_normalises_a_stage_with_the_head() -> None:
    s = StepSpeed(min_samples=1)
    assert s.decode_step(0.022, 22.0) == 1000  # 10 blocks plus a head weighing 12: the same host speed


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="compute_layers must be positive, got 0"):
        StepSpeed().decode_step(0.01, 0)
    with pytest.raises(ValueError, match="min_samples <= window"):
        StepSpeed(window=2, min_samples=3)
    assert StepSpeed(min_samples=1).decode_step(0.0, 1.0) is None  # a clock that did not move measured nothing


def test_the_gossiped_metadata_carries_the_speed_to_the_orchestrator_s_node_view() -> None:
    md = mpb.NodeMetadata(node_id=7, state=mpb.NODE_STATE_AVAILABLE, step_us_per_layer=1250)
    tags = encode_tags(md)
    assert tags["spl"] == "1250" and decode_tags(tags).step_us_per_layer == 1250
    assert "spl" not in encode_tags(mpb.NodeMetadata(node_id=7))  # not measured: no tag
    assert decode_tags({**tags, "spl": "fast"}).step_us_per_layer == 0  # malformed: left empty, not trusted
    info = node_info(mpb.Member(metadata=decode_tags(tags), gossip_address="10.0.0.7:7946"))
    assert info.ms_per_layer == 1.25


@pytest.mark.parametrize("layers_us", [0, 4500])
def test_the_node_measures_one_row_steps_and_says_the_figure(layers_us: int) -> None:
    """Five decode steps of a stage of 15 blocks told its work is 2.5 layers (one sent as an ExecuteStep, four started
    under the run's grant): the node says a figure once it has five and logs it with the run's identities. Where the
    worker says each step's time in the blocks (layers_us), the figure is that over the 15 blocks, exactly; where it
    does not, the whole step's time (the real clock: only its presence is asserted) over the 2.5 layers of work."""
    ctl = FakeCtl()
    said: list[int] = []

    async def publish(us: int) -> None:
        said.append(us)

    async def body(port: int, node: StageNode, _membership: Any) -> None:
        node.publish_speed = publish
        await settle()
        ch, s = stub(port)
        async with ch:
            req = run_plan(71, stage_index=1)
            req.runtime.compute_layers = 2.5
            await s.ProvisionStage(req)
            await updates(s, 71, "ready")
            node._on_worker(loaded(node, 71, 0, 1))  # the first row as an ExecuteStep, then a standing grant
            complete(node, steps(ctl)[0], out_edges(node, 71), layers_us)
            (g,) = [c for c in ctl.sent if isinstance(c, wire.GrantSteps)]
            for k in range(4):  # the next rows the worker starts itself under the grant: timed from their load
                node._on_worker(dataclasses.replace(loaded(node, 71, 1 + k, 2 + k), granted_step=g.step_id + k))
                running = node.scheduler.in_flight
                assert running is not None
                complete(node, running.step, out_edges(node, 71), layers_us)
            await settle()

    with capture_logs() as logs:  # around the node's making: its logger is bound then
        asyncio.run(serve(body, ctl=ctl))
    measured = [e for e in logs if e["event"] == "step_speed_measured"]
    assert len(measured) == 1 and said == [measured[0]["us_per_layer"]] and said[0] >= 1
    facts = (measured[0]["run_id"], measured[0]["stage_index"], measured[0]["layers"], measured[0]["measured_on"])
    assert facts == ((71, 1, 15, "blocks") if layers_us else (71, 1, 2.5, "step"))
    assert measured[0]["samples"] == 5
    if layers_us:
        assert said == [300]  # 4.5 ms in 15 blocks, whatever the steps took around them


def test_the_membership_port_gossips_the_speed_with_the_state_said(tmp_path: Path) -> None:
    """Against a real membership process: a figure measured before any state waits for it; one measured later is said
    with the state as it stands (Available stays Available)."""
    proc = Proc(tmp_path, "m")

    async def main() -> None:
        async with MembershipClientPort(proc.socket) as port:
            await port.set_step_speed(900)  # nothing said yet: kept for the first state
            assert proc.get_self().self.metadata.step_us_per_layer == 0
            await port.set_available("10.0.0.9:7441", 1)
            md = proc.get_self().self.metadata
            assert (md.state, md.step_us_per_layer) == (mpb.NODE_STATE_AVAILABLE, 900)
            await port.set_step_speed(1250)
            md = proc.get_self().self.metadata
            assert (md.state, md.control_endpoint, md.step_us_per_layer) == (mpb.NODE_STATE_AVAILABLE,
                                                                              "10.0.0.9:7441", 1250)

    try:
        asyncio.run(main())
    finally:
        proc.close()
