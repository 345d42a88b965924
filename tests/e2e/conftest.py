"""One real 3-host local cluster (network namespaces when root, else loopback addresses) shared by
the end-to-end tests of a module; its teardown is checked: no process, namespace or dir left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.cluster import DEFAULT_MODEL
from tests.harness.procs import pid_alive, processes_mentioning

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp_greedy.json"
# Small enough that the fixture prompts (30-40 tokens) flow through the stages as several chunk objects.
PREFILL_CHUNK = 16
needs_model = pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="run `make model` (default GGUF missing)")


def assert_torn_down(cluster: LocalCluster, pids: list[int], root: Path | None, netns: list[str]) -> None:
    left = [p for p in pids if pid_alive(p)]
    assert not left, f"processes left after teardown: {left}"
    if root is not None:
        stray = processes_mentioning(str(root))
        assert not stray, f"processes of {root} left after teardown: {stray}"
    assert root is None or not root.exists(), f"cluster dir {root} left after teardown"
    if cluster.netns is None and netns:
        from swactor.localcluster.netns import namespaces

        assert not [n for n in namespaces() if n in netns], f"namespaces left: {netns}"


@pytest.fixture(scope="module")
def cluster3() -> Iterator[LocalCluster]:
    # Short pool timeout so a run that cannot be placed is refused in seconds, not a minute.
    # The model drafts for itself (test_speculative_decoding...): the drafter's mechanics, with every greedy draft right.
    # The orchestrator compiles it before it serves: seconds more to start (more on a loaded box).
    spec = ClusterSpec(hosts=3, orchestrator={"pool_timeout_s": 8.0, "teardown_timeout_s": 20.0,
                                              "prefill_chunk": PREFILL_CHUNK,
                                              "draft_model": str(DEFAULT_MODEL.resolve()), "draft_slots": 1},
                       start_timeout_s=120.0)
    cluster = LocalCluster(spec, progress=lambda line: print(line, flush=True))
    with cluster:
        pids = [s.pid for s in cluster.services]
        root = cluster.root
        netns = list(cluster.netns.created) if cluster.netns else []
        yield cluster
    assert_torn_down(cluster, pids, root, netns)
