"""Tx/Rx lifecycles of §27."""

from __future__ import annotations

import pytest

from swactor.worker.edge_actors import EdgeActor, EdgeLifecycle, InvalidEdgeEvent

L = EdgeLifecycle


def run(kind: str, events: list[str]) -> list[EdgeLifecycle]:
    a = EdgeActor(1, kind)
    return [a.on(ev) for ev in events]


def test_tx_and_rx_happy_paths() -> None:
    assert run("tx", ["EdgeReady", "StepStarted", "ObjectProduced", "StopEdge", "EdgeStopped"]) == [
        L.READY, L.PRODUCING, L.READY, L.STOPPING, L.STOPPED]
    assert run("rx", ["EdgeReady", "ObjectLoaded", "StepStarted", "StopEdge", "EdgeStopped"]) == [
        L.READY, L.OBJECT_READY, L.READY, L.STOPPING, L.STOPPED]


@pytest.mark.parametrize("kind", ["tx", "rx"])
def test_fault_then_stop(kind: str) -> None:
    assert run(kind, ["EdgeReady", "Fault", "Fault", "StopEdge", "EdgeStopped"]) == [
        L.READY, L.FAULTED, L.FAULTED, L.STOPPING, L.STOPPED]
    assert run(kind, ["Fault", "EdgeStopped"]) == [L.FAULTED, L.STOPPED]


@pytest.mark.parametrize(("kind", "events"), [
    ("tx", ["ObjectProduced"]),  # produced before ready
    ("tx", ["EdgeReady", "ObjectProduced"]),  # produced without a step
    ("rx", ["ObjectLoaded"]),  # loaded before ready
    ("rx", ["EdgeReady", "ObjectLoaded", "ObjectLoaded"]),  # a second object while one waits
])
def test_protocol_violations(kind: str, events: list[str]) -> None:
    a = EdgeActor(1, kind)
    with pytest.raises(InvalidEdgeEvent):
        for ev in events:
            a.on(ev)
