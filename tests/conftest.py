"""How the suite shares this machine when tests/run.sh runs it in two pytest-xdist workers (`-n 2`).

Most of the suite waits: on subprocesses, sockets, a peer's timeout. Two workers fill that time, on three rules:
- A module's tests run on one worker (its module-scoped fixtures are built once, and some modules' tests build on
  what an earlier test of the module left).
- Every test that brings up a pool of hosts (network namespaces, nspawn containers, a local cluster) is in one group,
  `pools`: two pools at once would share two cores between a dozen services and their compute processes. The group
  is scheduled first, since it is the longest.
- A test marked `serial` measures timing that another busy worker would distort (membership under a CPU hog, link
  shaping, an idle timeout against a client's pace): tests/run.sh runs those alone, after the others.

Without xdist (`pytest tests/...` as a developer types it) none of this changes anything."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, settings

# Two workers on two cores can stretch one example past Hypothesis' default 200 ms deadline: no property here is
# about speed.
settings.register_profile("swactor", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("swactor")

POOLS = "pools"
# The modules that bring up pools of hosts (the netns and system ones among them): the controller groups by node id
# alone, it never sees an item's markers.
_POOL_PATHS = ("tests/e2e/", "tests/faults/", "tests/system/test_install_host.py", "tests/system/test_supervised_host.py",
               "tests/gateway/test_gateway_e2e.py", "tests/gateway/test_status_page_e2e.py",
               "tests/gateway/test_metrics_e2e.py", "tests/gateway/test_demo_serve.py", "tests/edge/test_edge_netns.py",
               "tests/edge/test_edge_membership.py", "tests/localcluster/test_reaper.py")
_STARTED = pytest.StashKey[float]()


def group_of(nodeid: str) -> str:
    """The work unit a test runs in: `pools`, or its module."""
    return POOLS if nodeid.startswith(_POOL_PATHS) else nodeid.split("::")[0]


class _Groups:
    """xdist's hook: work units by group_of. (Its own `--dist loadgroup` reads xdist_group marks but cannot put a
    group into the node ids pytest 9.2 reports, so it is not used.)"""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
        from xdist.scheduler import LoadScopeScheduling

        class ByGroup(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return group_of(nodeid)

        config.option.loadscopereorder = False  # the collection's order: the pools first (below)
        return ByGroup(config, log)  # type: ignore[arg-type]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: measures timing another busy test would distort; runs alone")
    config.stash[_STARTED] = time.time()
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Groups(), "swactor-test-groups")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):
        # the longest group first: the other worker takes every other group meanwhile (a stable sort keeps each
        # group's own order)
        items.sort(key=lambda item: group_of(item.nodeid) != POOLS)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The fault table, which the process that ran tests/faults wrote (an xdist worker has no terminal)."""
    from tests.faults import checks

    path = checks.REPORT_PATH
    if not path.exists() or path.stat().st_mtime < config.stash[_STARTED]:
        return
    rows = [checks.Row(**r) for r in json.loads(path.read_text())]
    terminalreporter.write_sep("=", "fault table (tests/faults)")
    terminalreporter.write_line(checks.table(rows))
