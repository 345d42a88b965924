"""The failure report's event digest (postmortem.py) on logs written here: no pool needed."""

from __future__ import annotations

import json
from pathlib import Path

from swactor.localcluster.layout import HostLayout
from tests.faults import postmortem


def _log(path: Path, *events: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def test_only_what_was_logged_after_the_marks_in_time_order(tmp_path: Path) -> None:
    hosts = [HostLayout(i, f"10.0.0.{i + 1}", tmp_path / f"h{i}") for i in range(2)]
    _log(hosts[0].log_dir / "edge.log", {"event": "edge.connection_established", "timestamp": "2026-12-04T10:00:00.000Z"})
    _log(hosts[1].log_dir / "worker.log", {"event": "stage_state", "timestamp": "2026-12-04T10:00:00.500Z"})
    marks = postmortem.log_marks(hosts)
    _log(hosts[0].log_dir / "edge.log",
         {"event": "edge.connection_closed", "peer_node_id": 7, "node_id": 1, "timestamp": "2026-12-04T10:00:02.000Z"},
         {"event": "edge.pump_state", "timestamp": "2026-12-04T10:00:02.100Z"})
    _log(hosts[1].log_dir / "worker.log", {"event": "stage_state", "state": "Faulted",
                                           "timestamp": "2026-12-04T10:00:01.000Z"})
    _log(hosts[1].log_dir / "membership.log", {"event": "member_dead", "timestamp": "2026-12-04T10:00:03.000Z"})
    with (hosts[1].log_dir / "membership.log").open("a") as f:
        f.write("Traceback (most recent call last):\n")

    lines = postmortem.events_since(marks, hosts)

    assert lines == [
        "10:00:01.000 h1/worker stage_state state=Faulted",
        "10:00:02.000 h0/edge edge.connection_closed peer_node_id=7",
        "10:00:03.000 h1/membership member_dead",
        "10:00:03.000 h1/membership Traceback (most recent call last):",  # with the event before it
    ]
    assert postmortem.events_since(marks, hosts, max_lines=1) == lines[-1:]
    assert postmortem.events_since(marks, hosts, only=frozenset({"member_dead"})) == ["10:00:03.000 h1/membership member_dead"]
