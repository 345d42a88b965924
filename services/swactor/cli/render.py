"""Human-readable lines for runs, nodes and lifecycle events (the --json forms use protobuf JSON)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence

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
    if run.state == opb.RUN_STATE_QUEUED:
        state = f"queued #{run.queue_position}"
    outcome = _short(opb.RunOutcome.Name(run.outcome), "RUN_OUTCOME_") if run.outcome else "-"
    reason = f" ({run.reason})" if run.reason else ""
    return (f"{run.run_id:<20} {when(run.created_us)}  {run.model:<24} stages={run.stages} "
            f"tokens={len(run.token_ids)}/{run.max_tokens}  {state:<13} {outcome}{reason}")


def run_detail(run: opb.Run) -> str:
    lines = [run_line(run)]
    if run.state == opb.RUN_STATE_QUEUED:
        lines.append(f"  queue position: {run.queue_position} (1 = next)")
        if run.queue_wait:
            lines.append(f"  waiting for: {run.queue_wait}")
    if run.detail:
        lines.append(f"  detail: {run.detail}")
    if run.resumed_from:
        lines.append(f"  resumes run {run.resumed_from}: its request's {run.resumed_tokens} token(s) before this run "
                     "are the tail of its prompt")
    if run.resumed_by:
        lines.append(f"  resumed as run {run.resumed_by} (its request goes on there: swactor watch {run.run_id})")
    if run.max_context:
        lines.append(f"  context: {run.max_context} tokens, prompt included")
    placed = sorted(run.placement, key=lambda p: p.stage_index)
    for p, where in zip(placed, stage_wheres([(p.node_id, p.device_index) for p in placed]), strict=True):
        lines.append(f"  stage {p.stage_index}: {where} layers {p.layer_start}..{p.layer_end_exclusive} "
                     f"edges {p.inbound_edge_id} -> {p.outbound_edge_id}")
    if run.text:
        lines.append(f"  text: {run.text!r}")
    if seed := seed_line(run):
        lines.append(f"  {seed}")
    return "\n".join(lines)


def stage_wheres(units: Sequence[tuple[int, int]]) -> list[str]:
    """Each stage's (node id, device index) for people: the device named where it tells something, on a node that
    carries several of the stages or on a device other than its first."""
    many = Counter(n for n, _ in units)
    return [f"node {n} device {d}" if many[n] > 1 or d else f"node {n}" for n, d in units]


def seed_line(run: opb.Run) -> str | None:
    """How to replay a sampled run (greedy runs need no seed)."""
    s = run.sampling
    if s.temperature <= 0:
        return None
    cuts = (f" top-k {s.top_k}" if s.top_k else "") + (f" top-p {s.top_p:g}" if 0 < s.top_p < 1 else "")
    return f"sampling: temperature {s.temperature:g}{cuts} seed {s.seed} (replay with --seed {s.seed})"


def node_line(n: opb.Node) -> str:
    gpus = ", ".join(f"{g.kind} {g.name} {g.memory_bytes / 2**30:.0f}GiB" for g in n.gpus) or "no GPU"
    state = _short(opb.NodeReadiness.Name(n.readiness), "NODE_READINESS_")
    mark = "ready" if n.provisionable else "-"
    reason = f" ({n.reason})" if n.reason else ""
    memory = f"stage memory {gib(n.stage_memory_bytes)}" if n.stage_memory_bytes else "stage memory not advertised"
    if n.stage_devices > 1:  # it carries as many stages of one run, each on its own device with that memory
        each = f"{gib(n.stage_memory_bytes)} each" if n.stage_memory_bytes else "memory not advertised"
        memory = f"{n.stage_devices} stage devices, {each}"
    slots = f" slots {n.slots_in_use}/{n.run_slots} in use" if n.run_slots else ""  # runs in flight on it
    # placement gives a slower host fewer layers by this; a host measures itself on the first run placed on it
    speed = f"{n.ms_per_layer:.3f} ms/layer" if n.ms_per_layer else "speed not measured"
    return (f"{n.node_id:<20} {state:<10}{reason} {mark:<6} edge={n.edge_endpoint or '-'} control={n.control_endpoint or '-'} "
            f"[{gpus}] {memory}, {speed}{slots}")


def slots_line(nodes: list[opb.Node]) -> str | None:
    """Under `swactor runs`: the run slots in use on each stage node of the runs in flight (None when no run holds one)."""
    held = [f"node {n.node_id} {n.slots_in_use}/{n.run_slots}" for n in nodes if n.run_slots]
    return f"run slots in use per stage node: {', '.join(held)}" if held else None


SPLITS = {"memory": "blocks in proportion to the nodes' memory", "fitted": "blocks fitted to the nodes' memory",
          "balanced": "blocks balanced", "speed": "blocks in inverse proportion to the nodes' measured ms per layer",
          "kept": "the blocks the last run left on these nodes (no split is a fifth faster)",
          "joined": "the blocks of the runs in flight it joins"}


def compute_part(s: opb.PlannedStage) -> str:
    """A stage's measured speed and the decode step it predicts there (ms per layer x its work in layers)."""
    if not s.ms_per_layer:
        return "speed not measured"
    if not s.HasField("compute_ms"):
        return f"{s.ms_per_layer:.3f} ms/layer"
    return f"{s.ms_per_layer:.3f} ms/layer x {s.compute_layers:.1f} layers = {s.compute_ms:.1f} ms a decode step"


def run_slots(p: opb.PlanResponse, s: opb.PlannedStage) -> str:
    """How many runs the stage holds at once, and whether the cap rather than the node's memory set it."""
    if not s.HasField("run_slots"):
        return "run slots ?"
    if s.run_slots == 0:
        return "holds no run slot"
    capped = f" (max_slots_per_stage {p.max_slots_per_stage})" if s.run_slots == p.max_slots_per_stage else ""
    return f"holds {s.run_slots} run slot{'s' if s.run_slots > 1 else ''}{capped}"


def plan_lines(p: opb.PlanResponse) -> list[str]:
    """`swactor submit --dry-run`: the placement with per-stage bytes and run slots, the refusal SubmitRun would give,
    the gate."""
    # the KV bytes below depend on the dtype they were counted in (float16: half), so the dry run names it
    kv = f", KV cache {p.kv_dtype or 'float32'}" if p.memory_known else ""
    fitted = " (the planner's: the fewest that fit, or more predicted 3x quicker)" if p.stages_fitted else ""
    lines = [f"model {p.model}: {p.stages} stage(s){fitted}, {p.prompt_tokens} prompt tokens, context {p.max_seq_len}{kv}"
             + (f"; {SPLITS.get(p.split, p.split)}" if p.split else "")]
    measured = any(s.ms_per_layer for s in p.placement)  # no host measured yet: the speeds are left out

    def speed(s: opb.PlannedStage) -> str:
        return f"; {compute_part(s)}" if measured else ""

    for s, where in zip(p.placement, stage_wheres([(s.node_id, s.device_index) for s in p.placement]), strict=True):
        offer = gib(s.node_memory_bytes) if s.node_memory_bytes else "memory not advertised"
        need = (f"needs {gib(s.total_bytes)} with one run slot (weights {gib(s.weights_bytes)}, KV cache "
                f"{gib(s.kv_cache_bytes)} per run slot, scratch {gib(s.scratch_bytes)}, runtime {gib(s.runtime_bytes)})"
                if p.memory_known else "needs ?")
        lines.append(f"  stage {s.stage_index}: {where} blocks {s.layer_start}..{s.layer_end_exclusive} "
                     f"{need} of {offer}; {run_slots(p, s)}{speed(s)}{'' if s.fits else '  DOES NOT FIT'}")
    if p.placement_detail:
        lines.append(f"  no placement: {p.placement_detail}")
    elif p.hop_rtt_ms:
        lines.append(ring_line(p))
    if p.HasField("compute_ms_per_token"):  # beside the ring's hops: what a token costs, in its two parts
        total = (f"; with the hops, {p.predicted_ms_per_token:.1f} ms predicted a token"
                 if p.HasField("predicted_ms_per_token") and p.HasField("network_ms_per_token") else "")
        lines.append(f"  compute: the stages add {p.compute_ms_per_token:.1f} ms to each token (one after another){total}")
    lines.append(f"pool {'ready' if p.pool_ready else 'not ready'}: {p.pool_detail}")
    lines.append(f"would be refused: {p.refusal}" if p.refusal else "SubmitRun would accept it"
                 + (f"; the run {p.admission}" if p.admission else ""))
    return lines


def _rtt(ms: float) -> str:
    return "not measured" if ms < 0 else "same host" if ms == 0 else f"{ms:.1f} ms"


def ring_line(p: opb.PlanResponse) -> str:
    """A token's ring over the placement, each hop with its measured round trip, and what the hops add per token."""
    stops = [f"orchestrator (node {p.orchestrator_node_id})", *(f"stage {s.stage_index}" for s in p.placement),
             "orchestrator"]
    hops = " ".join(f"-[{_rtt(ms)}]-> {stop}" for ms, stop in zip(p.hop_rtt_ms, stops[1:], strict=True))
    per_token = (f"; the hops add {p.network_ms_per_token:.1f} ms to each token (one way each)"
                 if p.HasField("network_ms_per_token") else "; not every hop measured yet")
    return f"  ring (RTT): {stops[0]} {hops}{per_token}"


def rtt_lines(resp: opb.ListNodesResponse) -> list[str]:
    """Under `swactor nodes`: the RTT matrix the members measured (ms; row: the measuring node)."""
    if not resp.rtts:
        return ["RTT between nodes: none measured yet"]
    ids = sorted({n.node_id for n in resp.nodes} | {r.from_node_id for r in resp.rtts} | {r.to_node_id for r in resp.rtts})
    got = {(r.from_node_id, r.to_node_id): r.rtt_ms for r in resp.rtts}
    width = max(9, *(len(str(i)) for i in ids)) + 1
    lines = [f"RTT ms (row pinged column; * the orchestrator's node {resp.orchestrator_node_id}):",
             " " * width + "".join(f"{i:>{width}}" for i in ids)]
    for a in ids:
        cells = "".join(f"{'-' if a == b else f'{got[a, b]:.2f}' if (a, b) in got else '?':>{width}}" for b in ids)
        lines.append(f"{('*' if a == resp.orchestrator_node_id else '') + str(a):>{width}}{cells}")
    return lines


# The identities an event line shows (when the event has them), as field -> label.
_EVENT_IDS = (("node_id", "node"), ("stage_index", "stage"), ("edge_id", "edge"), ("worker_generation", "gen"),
              ("sequence", "seq"))


def event_line(ev: pb.LifecycleEvent) -> str:
    parts = [when(ev.time_us), pb.LifecycleEventKind.Name(ev.kind).lower()]
    present = {f.name for f, _ in ev.ListFields()}  # set optionals, non-zero scalars
    parts += [f"{label}={getattr(ev, name)}" for name, label in _EVENT_IDS if name in present]
    if ev.reason:
        parts.append(f"reason={ev.reason} by={_short(pb.Component.Name(ev.component), 'COMPONENT_')}")
    parts.extend(f"{k}={v}" for k, v in sorted(ev.counters.items()))
    if ev.detail:
        parts.append(f"- {ev.detail}")
    return " ".join(parts)


def queue_line(ev: pb.LifecycleEvent) -> str | None:
    """One line for a run queue event (the run's position while it waits), else None."""
    c = ev.counters
    if ev.kind in (pb.RUN_QUEUED, pb.RUN_QUEUE_MOVED):
        verb = "queued" if ev.kind == pb.RUN_QUEUED else "moved up"
        return f"{verb}: position {c.get('position', 0)} of {c.get('queued', 0)} waiting"
    if ev.kind == pb.RUN_QUEUE_WAITING:
        return f"next, waiting for {ev.detail}"
    if ev.kind == pb.RUN_DEQUEUED:
        return f"starting after {c.get('waited_ms', 0) / 1000:.1f} s in the queue"
    return None


DOWNLOAD_KINDS = frozenset({pb.WEIGHTS_DOWNLOAD_STARTED, pb.WEIGHTS_DOWNLOAD_PROGRESS, pb.WEIGHTS_DOWNLOADED})


def size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def gib(n: int) -> str:
    """Memory sizes as the orchestrator's placement refusals give them (orchestrator/planning/placement.py's gib)."""
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def download_line(ev: pb.LifecycleEvent) -> str | None:
    """One progress line for a weights download event (per stage, or the orchestrator's own source fetch)."""
    if ev.kind not in DOWNLOAD_KINDS:
        return None
    who = f"stage {ev.stage_index}" if ev.HasField("stage_index") else "orchestrator"
    c = ev.counters
    total = c.get("bytes_total", 0)
    if ev.kind == pb.WEIGHTS_DOWNLOAD_STARTED:
        cached = c.get("bytes_cached", 0)
        if total and cached >= total:
            return None  # nothing to download: the WEIGHTS_DOWNLOADED line says it was all cached
        held = f", {size(cached)} already cached" if cached else ""
        return f"{who}: weights download started: {size(total)}{held}" if total else f"{who}: {ev.detail}"
    if ev.kind == pb.WEIGHTS_DOWNLOAD_PROGRESS:
        done, rate, eta = c.get("bytes_done", 0), c.get("rate_bps", 0), c.get("eta_ms", -1)
        if rate <= 0:
            return None  # nothing moved since the last update (all cached, or not started): no "0 B/s" line
        pct = f" ({100 * done / total:.0f}%)" if total else ""
        eta_text = f", ETA {eta / 1000:.1f} s" if eta >= 0 else ""
        return f"{who}: weights {size(done)}/{size(total)}{pct}, {size(rate)}/s{eta_text}"
    fetched, ms = c.get("bytes_fetched", total), c.get("duration_ms", 0)
    if fetched == 0:
        return f"{who}: weights already cached: {size(total)}, nothing fetched"
    rate = f" ({size(fetched / (ms / 1000))}/s)" if ms > 0 else ""
    return f"{who}: weights downloaded: {size(fetched)} fetched of {size(total)} in {ms / 1000:.1f} s{rate}"


def models_lines(resp: opb.ListModelsResponse) -> list[str]:
    lines = []
    names = {}
    for m in resp.models:
        mark = " (default)" if m.is_default else ""
        facts = f" {m.architecture} {m.num_layers} layers" if m.architecture else ""
        ident = f" sha256 {m.sha256[:12]}… {size(m.size)}" if m.sha256 else ""
        lines.append(f"model {m.name}{mark}: {m.state}{facts}{ident} <- {m.source}")
        if m.detail:
            lines.append(f"  detail: {m.detail}")
        if m.sha256:
            names[m.sha256] = m.name
    for n in resp.nodes:
        if n.error:
            lines.append(f"node {n.node_id}: cannot ask: {n.error}")
            continue
        limit = size(n.limit_bytes) if n.limit_bytes else "no limit"
        lines.append(f"node {n.node_id}: cache {size(n.used_bytes)} used, {limit}")
        for f in n.files:
            state = "in use" if f.in_use else f"last used {when(f.last_used_us)}"
            fetching = f", fetching {size(f.bytes_fetching)}" if f.bytes_fetching else ""
            lines.append(f"  {f.model or f.sha256[:12] + '…'}: {size(f.bytes_held)} of {size(f.size)} held "
                         f"({f.pieces_held}/{f.pieces_total} pieces), {state}{fetching}")
        if not n.files:
            lines.append("  (empty)")
    return lines
