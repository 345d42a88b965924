"""Fixtures for the membership tests; netns tests skip with the reason when they cannot run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `tests.harness` must import however pytest was started
    sys.path.insert(0, str(ROOT))

from tests.harness import NetnsCluster, netns_unavailable_reason  # noqa: E402
from tests.membership.cluster import MembershipCluster  # noqa: E402

_reason: list[str | None] = []


def _netns_reason() -> str | None:
    if not _reason:
        _reason.append(netns_unavailable_reason())
    return _reason[0]


@pytest.fixture
def membership_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MembershipCluster]:
    """`@pytest.mark.parametrize("membership_cluster", [n], indirect=True)`: n hosts, no node started."""
    reason = _netns_reason()
    if reason is not None:
        pytest.skip(reason)
    n = getattr(request, "param", 5)
    with NetnsCluster(n, prefix="memb") as net:
        cluster = MembershipCluster(net, tmp_path)
        try:
            yield cluster
        finally:
            cluster.stop_all()
            if request.node.rep_call_failed if hasattr(request.node, "rep_call_failed") else False:
                for i, node in cluster.nodes.items():
                    print(f"--- h{i} log tail ---\n{node.log_tail()}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    rep = yield
    if rep.when == "call":
        item.rep_call_failed = rep.failed  # type: ignore[attr-defined]
    return rep
