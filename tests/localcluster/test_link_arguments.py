"""The --link-* flags of `python -m swactor.localcluster` and `swactor demo`: a bad value is refused in one line
naming the flag, exit 2, before anything is built (the demo's table is in tests/cli/test_bad_arguments.py); good
values reach the cluster's spec unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pytest
import structlog

from swactor.cli.args import EXIT_FAILED, EXIT_USAGE
from swactor.localcluster.cluster import DEFAULT_MODEL, ClusterError, ClusterSpec
from swactor.localcluster.linkconditions import LinkConditions

pytestmark = pytest.mark.timeout(120)

LOCALCLUSTER_CASES: list[tuple[list[str], str]] = [
    (["--link-delay-ms", "-1"], "argument --link-delay-ms: must be in 0..10000, got -1"),
    (["--link-delay-ms", "10001"], "argument --link-delay-ms: must be in 0..10000, got 10001"),
    (["--link-delay-ms", "4.5"], "argument --link-delay-ms: '4.5' is not an integer"),
    (["--link-delay-ms", "40", "--link-jitter-ms", "41"],
     "argument --link-jitter-ms: must be in 0..40 (at most --link-delay-ms), got 41"),
    (["--link-loss-pct", "100.5"], "argument --link-loss-pct: must be in [0, 100], got 100.5"),
    (["--link-loss-pct", "nan"], "argument --link-loss-pct: must be a finite number"),
    (["--link-rate-mbit", "0"], "argument --link-rate-mbit: must be in (0, 100000], got 0"),
    (["--link-delay-ms", "40", "--loopback"], "the --link-* conditions need network namespaces: not with --loopback"),
    (["--far-host", "2"], "argument --far-host: expected HOST=RTT_MS (e.g. 2=40), got '2'"),
    (["--far-host", "2=0"], "argument --far-host: must be in 1..10000, got 0"),
    (["--far-host", "3=40"], "argument --far-host: host 3 is not one of the 3 host(s) 0..2"),
    (["--far-host", "1=40", "--loopback"], "--far-host needs network namespaces: not with --loopback"),
    (["--nat", "--loopback"], "--nat needs network namespaces: not with --loopback"),
]


def localcluster(argv: list[str], tmp: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "swactor.localcluster", *argv], capture_output=True, timeout=60,
                          env={**os.environ, "TMPDIR": tmp}, stdin=subprocess.DEVNULL)


def test_bad_link_values_are_refused_naming_the_flag(tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda case: localcluster(case[0], str(tmp_path)), LOCALCLUSTER_CASES))
    wrong = []
    for (argv, needle), proc in zip(LOCALCLUSTER_CASES, done, strict=True):
        err = proc.stderr.decode(errors="backslashreplace")
        if proc.returncode != EXIT_USAGE or err.count("\n") != 1 or needle not in err or proc.stdout:
            wrong.append(f"{argv!r}: exit {proc.returncode}, stderr {err!r}, stdout {proc.stdout!r}")
    assert not wrong, "\n".join(wrong)
    assert list(tmp_path.iterdir()) == []  # nothing was built


class Refused:
    """Stands in for LocalCluster: keeps the spec it was given and refuses, so nothing is built."""

    specs: ClassVar[list[ClusterSpec]] = []

    def __init__(self, spec: ClusterSpec, **_: Any) -> None:
        Refused.specs.append(spec)
        raise ClusterError("not building in this test")


@pytest.fixture
def process_logging() -> Iterator[None]:
    """Both programs configure this process's logging (the demo's at WARNING): put the test session's back, or the
    events later tests capture (structlog.testing.capture_logs) are filtered out before they are seen."""
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)
        structlog.contextvars.clear_contextvars()


@pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="run `make model` (default GGUF missing)")
@pytest.mark.usefixtures("process_logging")
def test_the_flags_reach_the_cluster_spec_from_both_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    import swactor.cli.demo as demo
    import swactor.localcluster.__main__ as localcluster_main
    from swactor.cli.main import parser

    flags = ["--link-delay-ms", "40", "--link-jitter-ms", "5", "--link-loss-pct", "1.5", "--link-rate-mbit", "8"]
    want = LinkConditions(delay_ms=40, jitter_ms=5, loss_pct=1.5, rate_mbit=8.0)
    monkeypatch.setattr(localcluster_main, "LocalCluster", Refused)
    monkeypatch.setattr(demo, "LocalCluster", Refused)
    Refused.specs = []
    assert localcluster_main.main(["--hosts", "2", *flags]) == EXIT_USAGE
    args = parser().parse_args(["demo", "--hosts", "2", *flags])
    assert demo.run_demo(args, demo.preflight(args)) == EXIT_FAILED
    assert [s.links for s in Refused.specs] == [want, want]
    assert [s.netns for s in Refused.specs] == [None, None]  # namespaces whenever they are available


@pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="run `make model` (default GGUF missing)")
@pytest.mark.usefixtures("process_logging")
def test_far_hosts_and_nat_reach_the_cluster_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    import swactor.localcluster.__main__ as localcluster_main

    monkeypatch.setattr(localcluster_main, "LocalCluster", Refused)
    Refused.specs = []
    argv = ["--hosts", "4", "--link-delay-ms", "5", "--far-host", "3=60", "--far-host", "1=30", "--nat"]
    assert localcluster_main.main(argv) == EXIT_USAGE
    [spec] = Refused.specs
    assert spec.links == LinkConditions(delay_ms=5) and spec.nat is True
    assert spec.host_links == {3: LinkConditions(delay_ms=60), 1: LinkConditions(delay_ms=30)} and spec.shaped
