"""Hosts by predicted time per token (issue 22 item 4): a local pool of 2 hosts in network namespaces whose
orchestrator's host h0 is slow (its worker service and compute process held to --share of one CPU by a cgroup quota
while a run decodes on it; loads and compiles run at full speed). A 2-stage run measures both hosts' ms per layer;
then a run that leaves its stage count open, placed on those figures, beside the same run pinned to h0 (where the ring
alone, without speeds, puts a one-stage run: the orchestrator's own host). Each with the dry run's prediction (the
stages' compute one after another plus the hops one way) and the measured ms per token (median gap between tokens, on
a second run of the placement: the first loads it).

  .venv/bin/python bench/placement_speed.py [--share 0.15] [--max-tokens 32] [--link-delay-ms 0]

Root only (namespaces, a cgroup CPU quota).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from wan import PROMPT, decode_ms  # bench/ is this script's directory: one prompt, one decode measure

from swactor.cli.render import plan_lines
from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.ready import NotReady, wait_for
from swactor.localcluster.run import RunResult, follow
from swactor.v1 import common_pb2, orchestrator_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.cpu_quota import CpuQuota, unavailable  # noqa: E402
from tests.harness.procs import group_members  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--share", type=float, default=0.15, help="of one CPU, for h0's worker and compute process")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--link-delay-ms", type=float, default=0.0, help="one way, between the hosts")
    a = ap.parse_args()
    if (why := unavailable() if os.geteuid() == 0 else "needs root") is not None:
        print(f"no CPU quota here: {why}", file=sys.stderr)
        return 2
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; h0 (the orchestrator's host) held to "
          f"{a.share} of one CPU while it decodes; {a.link_delay_ms} ms one way between hosts; {a.max_tokens} tokens "
          "per run, ignore_eos", flush=True)
    spec = ClusterSpec(hosts=2, netns=True, links=LinkConditions(delay_ms=a.link_delay_ms))
    with LocalCluster(spec, progress=lambda s: print(f"  {s}", file=sys.stderr, flush=True)) as c, c.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        h0, h1 = c.node_ids
        name = {h0: "h0", h1: "h1"}

        def run(req: opb.SubmitRunRequest) -> RunResult:
            """One run, h0's worker under the quota from its stage's STAGE_READY (its load at full speed)."""
            with CpuQuota(f"swactor-bench-slow-{os.getpid()}", a.share) as quota:
                def slow_down(u: opb.RunUpdate, _res: RunResult) -> None:
                    if u.HasField("event") and u.event.kind == common_pb2.STAGE_READY and u.event.node_id == h0:
                        for pid in group_members(c.service("h0/worker").pid):
                            quota.add(pid)

                res = follow(stub, req, slow_down, timeout_s=900)
            assert res.finished is not None and res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, res.finished
            return res

        def request(**how: object) -> opb.SubmitRunRequest:
            return opb.SubmitRunRequest(prompt=PROMPT, max_tokens=a.max_tokens, ignore_eos=True, **how)  # type: ignore[arg-type]

        run(request(stages=2))

        def measured() -> dict[int, float]:
            speeds = {n.node_id: n.ms_per_layer for n in stub.ListNodes(opb.ListNodesRequest(), timeout=5).nodes}
            if not all(speeds.get(h) for h in (h0, h1)):
                raise NotReady(f"ms per layer: {speeds}")
            return speeds

        speeds = wait_for("both hosts' speed gossiped", measured, 60)
        print(f"\nmeasured: h0 {speeds[h0]:.3f} ms/layer (under the quota), h1 {speeds[h1]:.3f}")
        rows: list[tuple[str, str, float, float]] = []
        placements: dict[str, Callable[[], opb.SubmitRunRequest]] = {
            "stage count open (the planner's)": lambda: request(),
            "pinned to h0 (the ring without speeds)": lambda: request(node_ids=[h0]),
        }
        for label, make in placements.items():
            plan = stub.Plan(make(), timeout=30)
            print(f"\n{label}:\n" + "\n".join(f"  {line}" for line in plan_lines(plan)), flush=True)
            predicted = plan.predicted_ms_per_token
            run(make())  # load it
            res = run(make())
            assert res.finished is not None
            order = " ".join(name[p.node_id] for p in res.finished.placement)
            rows.append((label, order, predicted, decode_ms(res)))
        print("\nplacement                                  stages' hosts  predicted ms/token  measured ms/token  "
              "measured/predicted")
        for label, order, predicted, got in rows:
            print(f"{label:42s} {order:14s} {predicted:18.1f} {got:18.1f} {got / predicted:19.2f}")
        print(f"\nthe planner's placement against the pinned one: {rows[1][3] / rows[0][3]:.2f}x faster per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
