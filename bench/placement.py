"""Placement by measured RTT (issue 22 item 4): a local pool of 4 hosts in network namespaces whose host 3 is far (every
packet arriving at it held --far-rtt-ms), the RTT matrix its members measured, and decode ms per token of a 3-stage run
on the planner's ring beside pinned rings that cross the far host or leave the orchestrator's host out.

  .venv/bin/python bench/placement.py [--far-rtt-ms 40] [--max-tokens 32]

Latency model: a token's time = what the hops add (each one way: half the ring's RTT, `network_ms_per_token` of the
dry run) + what the rest costs (the stages' compute, the orchestrator, the drivers). The rest is taken from the
planner's own run (its hops are near: a few ms), so each other ring is predicted as
    measured(planned) - network(planned) + network(ring)
and the table prints measured / predicted. Root only (namespaces, NFQUEUE).
"""

from __future__ import annotations

import argparse
import os
import sys

from wan import PROMPT, decode_ms  # bench/ is this script's directory: one prompt, one decode measure

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.ready import NotReady, wait_for
from swactor.localcluster.run import follow
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--far-rtt-ms", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; host 3 {a.far_rtt_ms} ms from the others; "
          f"{a.max_tokens} tokens per run, ignore_eos", flush=True)
    spec = ClusterSpec(hosts=4, netns=True, host_links={3: LinkConditions(delay_ms=float(a.far_rtt_ms))})
    with LocalCluster(spec, progress=lambda s: print(f"  {s}", file=sys.stderr, flush=True)) as c, c.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        h0, h1, h2, far = c.node_ids
        name = {h0: "h0", h1: "h1", h2: "h2", far: "h3"}

        def matrix() -> opb.ListNodesResponse:
            resp = stub.ListNodes(opb.ListNodesRequest(), timeout=5)
            if len(resp.rtts) < 12:
                raise NotReady(f"{len(resp.rtts)} of 12 pairs measured")
            return resp

        resp = wait_for("every pair's RTT", matrix, 60)
        got = {(r.from_node_id, r.to_node_id): r.rtt_ms for r in resp.rtts}
        print("\nRTT ms as the members measured it (row pinged column):")
        print("      " + "".join(f"{name[n]:>8}" for n in c.node_ids))
        for x in c.node_ids:
            print(f"{name[x]:>6}" + "".join(f"{'-' if x == y else f'{got[x, y]:.2f}':>8}" for y in c.node_ids))

        rings = {"planned": (), "h1 h0 h2 (orchestrator's host in the middle)": (h1, h0, h2),
                 "h0 h3 h1 (through the far host)": (h0, far, h1), "h3 h1 h2 (far host first)": (far, h1, h2)}
        rows = []
        for label, pins in rings.items():
            req = opb.SubmitRunRequest(prompt=PROMPT, max_tokens=a.max_tokens, ignore_eos=True,
                                       **({"node_ids": list(pins)} if pins else {"stages": 3}))
            plan = stub.Plan(req, timeout=30)
            follow(stub, req, timeout_s=600)  # warm: weights and graphs of this placement
            res = follow(stub, req, timeout_s=600)
            assert res.finished is not None and res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, res.finished
            order = " ".join(name[p.node_id] for p in res.finished.placement)
            rows.append((label, order, list(plan.hop_rtt_ms), plan.network_ms_per_token, decode_ms(res)))
        base = rows[0][4] - rows[0][3]
        print("\nring (stages' hosts)                               hops' RTT ms              network ms/token  "
              "measured ms/token  predicted  measured/predicted")
        for label, order, hops, net, measured in rows:
            predicted = base + net
            print(f"{label[:44]:44s} [{order}] {' '.join(f'{h:.1f}' for h in hops):24s} {net:10.1f} {measured:14.1f} "
                  f"{predicted:14.1f} {measured / predicted:12.2f}")
        print(f"\n(the rest of a token, from the planned ring: {base:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
