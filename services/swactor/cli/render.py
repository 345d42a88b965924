"""Human-readable lines for runs, nodes and lifecycle events (the --json forms use protobuf JSON)."""

from __future__ import annotations

import datetime as dt

from google.protobuf.json_format import MessageToDict

from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb


def as_json(msg) -> dict:
    return MessageToDict(msg, preserving_proto_field_name=True)


def _short(enum_name: str, prefix: str) -> str:
    return enum_name.removeprefix(prefix).lower()


def when(us: int) -> str:
    if not us:
        return "-"
    return dt.datetime.fromtimestamp(us / 1e6, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def run_line(run: opb.Run) -> str:
    state = _short(opb.RunState.Name(run.state), "RUN_STATE_")
    outcome = _short(opb.RunOutcome.Name(run.outcome), "RUN_OUTCOME_") if run.outcome else "-"
    reason = f" ({run.reason})" if run.reason else ""
    return (f"{run.run_id:<20} {when(run.created_us)}  {run.model:<24} stages={run.stages} "
            f"tokens={len(run.token_ids)}/{run.max_tokens}  {state:<13} {outcome}{reason}")


def run_detail(run: opb.Run) -> str:
    lines = [run_line(run)]
    if run.detail:
        lines.append(f"  detail: {run.detail}")
    for p in run.placement:
        lines.append(f"  stage {p.stage_index}: node {p.node_id} layers {p.layer_start}..{p.layer_end_exclusive} "
                     f"edges {p.inbound_edge_id} -> {p.outbound_edge_id}")
    if run.text:
        lines.append(f"  text: {run.text!r}")
    return "\n".join(lines)


def node_line(n: opb.Node) -> str:
    gpus = ", ".join(f"{g.kind} {g.name} {g.memory_bytes / 2**30:.0f}GiB" for g in n.gpus) or "no GPU"
    state = _short(opb.NodeReadiness.Name(n.readiness), "NODE_READINESS_")
    mark = "ready" if n.provisionable else "-"
    reason = f" ({n.reason})" if n.reason else ""
    return f"{n.node_id:<20} {state:<10}{reason} {mark:<6} edge={n.edge_endpoint or '-'} control={n.control_endpoint or '-'} [{gpus}]"


def event_line(ev: pb.LifecycleEvent) -> str:
    parts = [when(ev.time_us), pb.LifecycleEventKind.Name(ev.kind).lower()]
    if ev.node_id:
        parts.append(f"node={ev.node_id}")
    if ev.HasField("stage_index"):
        parts.append(f"stage={ev.stage_index}")
    if ev.edge_id:
        parts.append(f"edge={ev.edge_id}")
    if ev.HasField("sequence"):
        parts.append(f"seq={ev.sequence}")
    if ev.reason:
        parts.append(f"reason={ev.reason} by={_short(pb.Component.Name(ev.component), 'COMPONENT_')}")
    parts.extend(f"{k}={v}" for k, v in sorted(ev.counters.items()))
    if ev.detail:
        parts.append(f"- {ev.detail}")
    return " ".join(parts)
