"""One fault pool for the whole fault suite (bring-up and the compute processes' first compile cost
tens of seconds on the 2-core box): a real 3-host local cluster in network namespaces. After every
test the pool is healed (what the test left stopped, dead or held is restarted or released, then a
probe run must complete), so a test that breaks the pool, e.g. an expected failure, does not break
the next one. The fault table (tests/faults/checks.py) is written to bench/out/faults.json and
printed at the end (tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from swactor.localcluster.cluster import DEFAULT_MODEL
from tests.faults import checks, postmortem
from tests.faults.pool import FaultPool, fault_pool
from tests.harness.netns import netns_unavailable_reason

_WHY_NOT = netns_unavailable_reason() if os.geteuid() == 0 else "the fault suite needs root (netns, nft, tmpfs)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/faults/"):
            item.add_marker(pytest.mark.slow)
            if _WHY_NOT:
                item.add_marker(pytest.mark.skip(reason=_WHY_NOT))
            elif not DEFAULT_MODEL.exists():
                item.add_marker(pytest.mark.skip(reason="run `make model` (default GGUF missing)"))


@pytest.fixture(scope="session")
def pool_holder() -> Iterator[list[FaultPool]]:
    with fault_pool(progress=lambda line: print(line, flush=True)) as pool:
        pool.run(max_tokens=2, timeout_s=300)  # warm: every compute process compiles its graphs once
        yield [pool]


@pytest.fixture
def pool(pool_holder: list[FaultPool], request: pytest.FixtureRequest) -> Iterator[FaultPool]:
    p = pool_holder[0]
    marks = postmortem.log_marks(p.hosts)
    yield p
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:  # the CI log is all that is left of the pool after a failure
        print(f"\n[events logged during {request.node.name}]")
        print("\n".join(postmortem.events_since(marks, p.hosts)))
    if lost := postmortem.events_since(marks, p.hosts, only=postmortem.LOST_WAKEUPS):  # in the table, pass or fail
        for row in checks.REPORT:
            if row.test == request.node.nodeid:
                row.next_run += f" [lost wake-ups: {len(lost)}: {lost[0][:160]}]"
    did = p.heal()
    if did:
        print(f"\n[heal after {request.node.name}] " + "; ".join(did))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)  # the pool fixture's teardown reads whether the call failed
    if report.when == "call" or (report.when == "setup" and report.skipped):
        result = "xfailed" if hasattr(report, "wasxfail") and report.skipped else (
            "xpassed" if hasattr(report, "wasxfail") else report.outcome)
        for row in checks.REPORT:
            if row.test == item.nodeid and not row.result:
                row.result = result


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the table where the session ran the faults (under xdist, a worker: tests/conftest.py prints it)."""
    rows = [r for r in checks.REPORT if r.result]
    if rows:
        checks.write_report(rows)
