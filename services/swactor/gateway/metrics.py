"""The gateway's Prometheus metrics: `GET /metrics` in the text exposition format (docs/operations.md "Metrics").

Three sources:
- what this gateway saw, counted as it happens: every HTTP request by endpoint and status (RequestCounter, outside
  the bearer-token check so that refused tokens count too), and every answer when its request closes
  (GatewayMetrics.answer_closed): how it ended, its time to first token and per output token, its tokens;
- the pool as the orchestrator reports it, asked at scrape time (PoolCollector): members, run slots, the runs
  queued and in flight, the outcomes of the runs it retains, the models. Gauges all: they are the orchestrator's
  state now, not events this gateway counted, and a gateway restart does not reset them;
- each host's own figures, through the orchestrator (GetPoolMetrics, which asks every member's worker at once:
  StageControl.GetHostMetrics): the arena's occupancy, QUIC traffic and object transfers per peer, weights fetched,
  completed compute steps per stage index (host_families). Counters where the host counts (they restart from zero
  with the service that counts them), labelled by node_id and hostname; `swactor_host_up` is 0 for a member that did
  not answer.

The orchestrator is asked once per scrape (ListNodes, ListRuns, ListModels, the first and last kept a moment by the
PoolClient, and GetPoolMetrics); when it does not answer, `swactor_pool_up` is 0 and the other pool series are absent
for that scrape, and so are the host series.
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.process_collector import ProcessCollector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swactor.common.events import get_logger
from swactor.gateway.answers import Answer
from swactor.gateway.errors import ApiError
from swactor.gateway.pool_client import PoolClient
from swactor.v1 import edge_pb2
from swactor.v1 import orchestrator_pb2 as opb

# The `endpoint` label: the route, not the raw path (a model's name in it would make a series per name).
ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions")
MODEL_ENDPOINT = "/v1/models/{name}"
OTHER_ENDPOINT = "other"
# The status of a request whose client left before any answer was started (nginx's "client closed request").
CLIENT_LEFT = 499
# Answers' outcomes beside the error codes of those that failed (errors.py: run_faulted, run_stopped, ...).
COMPLETED = "completed"
CLIENT_GONE = "client_gone"
# Seconds. The first token waits in the run queue and for the prompt's prefill through every stage; later tokens
# take one trip round the pipeline's ring each (milliseconds on one host, RTTs across a WAN).
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TPOT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# The runs ListRuns is asked for at a scrape: its most (it also stops before 3 MiB of records), the orchestrator's
# default retention ([orchestrator].runs_max).
RETAINED_RUNS_LISTED = 1000
# The states the pool gauges always show (0 when none), so that a query or an alert never meets an absent series.
LIVE_STATES = tuple(s for s in opb.RunState.values() if s not in (opb.RUN_STATE_UNSPECIFIED, opb.RUN_STATE_DONE))
MODEL_STATES = ("unjudged", "judged", "preparing", "ready", "failed")

log = get_logger()


def endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return path
    if path.startswith("/v1/models/"):
        return MODEL_ENDPOINT
    return OTHER_ENDPOINT


def _enum_label(enum: EnumTypeWrapper, value: int, prefix: str) -> str:
    """A proto enum value as a label: RUN_STATE_WAITING_POOL -> "waiting_pool" (a value this build does not know
    keeps its number)."""
    try:
        return enum.Name(value).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def answer_outcome(answer: Answer, error: ApiError | None) -> str:
    """How an answer ended: completed (it has a finish_reason), the code of the error that ended it, or client_gone
    (the client left or was dropped as a slow reader, and its run was stopped)."""
    if answer.finish_reason is not None:
        return COMPLETED
    if error is not None:
        return error.code or f"http_{error.status}"
    return CLIENT_GONE


def time_per_output_token_s(answer: Answer) -> float | None:
    """Seconds per token after the first, over the answer's decode (first to last token): None under two tokens."""
    n = answer.usage.completion_tokens
    if n < 2 or answer.first_token_s is None or answer.last_token_s is None:
        return None
    return (answer.last_token_s - answer.first_token_s) / (n - 1)


# ---- the pool at scrape time ----


@dataclass(frozen=True)
class PoolView:
    nodes: opb.ListNodesResponse
    runs: list[opb.Run]
    models: list[opb.ServedModel]


async def read_pool(client: PoolClient) -> PoolView | None:
    """The orchestrator's view of the pool, or None (logged) when it does not answer."""
    try:
        return PoolView(await client.pool(), await client.runs(RETAINED_RUNS_LISTED), await client.models())
    except ApiError as e:
        log.warning("gateway_metrics_pool_unread", status=e.status, code=e.code, detail=e.message)
        return None


def _gauge(name: str, doc: str, labels: Iterable[str], values: dict[tuple[str, ...], float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def _zeros(values: Iterable[str]) -> dict[tuple[str, ...], float]:
    return {(v,): 0 for v in values}


def pool_families(view: PoolView | None) -> list[Metric]:
    """The pool gauges from one view of it (only `swactor_pool_up` 0 when there is none)."""
    up = GaugeMetricFamily("swactor_pool_up", "1 if the orchestrator answered this scrape, else 0 (and the other "
                           "swactor_pool_ series are absent)", value=0 if view is None else 1)
    if view is None:
        return [up]
    nodes = view.nodes.nodes
    readiness = _zeros(_enum_label(opb.NodeReadiness, v, "NODE_READINESS_") for v in opb.NodeReadiness.values() if v)
    readiness |= Tally((_enum_label(opb.NodeReadiness, n.readiness, "NODE_READINESS_"),) for n in nodes)
    runs_live = _zeros(_enum_label(opb.RunState, s, "RUN_STATE_") for s in LIVE_STATES)
    runs_live |= {(_enum_label(opb.RunState, c.state, "RUN_STATE_"),): c.runs for c in view.nodes.live_runs}
    finished = Tally((_enum_label(opb.RunOutcome, r.outcome, "RUN_OUTCOME_"), r.reason or "")
                     for r in view.runs if r.outcome != opb.RUN_OUTCOME_UNSPECIFIED)
    models = _zeros(MODEL_STATES) | Tally((m.state,) for m in view.models)
    node_labels = ("node_id", "hostname")
    return [
        up,
        GaugeMetricFamily("swactor_pool_ready", "1 if the pool's readiness gate is open for a one-stage run, else 0",
                          value=int(view.nodes.pool_ready)),
        _gauge("swactor_pool_members", "Pool members by readiness", ("readiness",), readiness),
        GaugeMetricFamily("swactor_pool_provisionable_members", "Members a stage may be placed on now (Available, "
                          "with edge and control endpoints)", value=sum(n.provisionable for n in nodes)),
        _gauge("swactor_pool_node_run_slots", "Run slots (one KV cache each) a node's stage holds for the runs in "
               "flight; absent from nodes no run is active on", node_labels,
               {(str(n.node_id), n.hostname): n.run_slots for n in nodes if n.run_slots}),
        _gauge("swactor_pool_node_run_slots_in_use", "Runs in flight on a node, of its swactor_pool_node_run_slots",
               node_labels, {(str(n.node_id), n.hostname): n.slots_in_use for n in nodes if n.run_slots}),
        _gauge("swactor_pool_runs", "Runs the orchestrator holds now by state: queued (the queue's depth) and the "
               "states of the runs in flight", ("state",), runs_live),
        _gauge("swactor_pool_retained_runs", f"Finished runs among the newest the orchestrator retains (at most "
               f"{RETAINED_RUNS_LISTED}, fewer when their records pass ListRuns' 3 MiB), by outcome and reason; "
               "falls as retention deletes runs", ("outcome", "reason"), dict(finished)),
        _gauge("swactor_pool_models", "Served models by state", ("state",), models),
    ]


# ---- each host's own figures at scrape time ----


async def read_hosts(client: PoolClient) -> opb.GetPoolMetricsResponse | None:
    """Every member's figures as the orchestrator gathered them, or None (logged) when it does not answer."""
    try:
        return await client.host_metrics()
    except ApiError as e:
        log.warning("gateway_metrics_hosts_unread", status=e.status, code=e.code, detail=e.message)
        return None


def host_families(hosts: opb.GetPoolMetricsResponse | None) -> list[Metric]:
    """The per-host series from one GetPoolMetrics answer (none without one). A member that did not answer has
    `swactor_host_up` 0 and no other series; a local service of a host that did not answer its worker (arena,
    edge-driver) leaves that service's series out."""
    if hosts is None:
        return []
    node = ["node_id", "hostname"]
    up = GaugeMetricFamily("swactor_host_up", "1 if the member answered GetHostMetrics through the orchestrator at "
                           "this scrape, else 0 (and its other swactor_host_ series are absent)", labels=node)
    ceiling = GaugeMetricFamily("swactor_host_arena_ceiling_bytes", "Bytes of the host's arena (its memfd) rings "
                                "may be leased from", labels=node)
    leased = GaugeMetricFamily("swactor_host_arena_leased_bytes", "Bytes of the host's arena leased to rings now",
                               labels=node)
    leases = GaugeMetricFamily("swactor_host_arena_leases", "Ring leases the host's arena holds now", labels=node)
    peer = [*node, "peer_node_id"]
    quic_docs = {"sent_bytes": "bytes (UDP payload) sent", "received_bytes": "bytes (UDP payload) received",
                 "sent_datagrams": "UDP datagrams sent", "received_datagrams": "UDP datagrams received",
                 "lost_packets": "packets declared lost (RFC 9002 loss detection)"}  # PeerTraffic's fields
    quic = {name: CounterMetricFamily(f"swactor_host_quic_{name}", f"QUIC {doc} with one peer by the host's "
                                      "edge-driver since it started (closed connections included)", labels=peer)
            for name, doc in quic_docs.items()}
    fetched = CounterMetricFamily("swactor_host_weights_fetched_bytes", "Bytes of GGUF weights the host's worker "
                                  "received from the orchestrator's model server since it started", labels=node)
    steps = SummaryMetricFamily("swactor_stage_step_seconds", "Compute steps the host's stages completed since its "
                                "worker started, by stage index: count, and seconds from dispatch to completion "
                                "(a batched step of several runs counts once)", labels=[*node, "stage_index"])
    transfers = SummaryMetricFamily("swactor_host_edge_object_transfer_seconds", "Object records the host's "
                                    "edge-driver moved with one peer in one direction (role send or recv): count, and "
                                    "seconds from each record's first to last byte", labels=[*peer, "role"])
    for n in hosts.nodes:
        labels = [str(n.node_id), n.hostname]
        up.add_metric(labels, 0 if n.error else 1)
        if n.error:
            continue
        h = n.host
        if h.HasField("arena"):
            ceiling.add_metric(labels, h.arena.ceiling_bytes)
            leased.add_metric(labels, h.arena.leased_bytes)
            leases.add_metric(labels, h.arena.leases)
        for t in h.traffic:
            for name, family in quic.items():
                family.add_metric([*labels, str(t.peer_node_id)], getattr(t, name))
        for x in h.transfers:
            transfers.add_metric([*labels, str(x.peer_node_id), _enum_label(edge_pb2.EdgeRole, x.role, "EDGE_ROLE_")],
                                 count_value=x.objects, sum_value=x.seconds)
        fetched.add_metric(labels, h.weights_fetched_bytes)
        for st in h.steps:
            steps.add_metric([*labels, str(st.stage_index)], count_value=st.count, sum_value=st.seconds)
    return [up, ceiling, leased, leases, *quic.values(), transfers, fetched, steps]


class PoolCollector:
    """A prometheus_client collector of the pool as the orchestrator last reported it: `refresh()` asks it (the
    /metrics route awaits that before it renders), `collect()` yields what the last refresh found."""

    def __init__(self, client: PoolClient) -> None:
        self.client = client
        self.view: PoolView | None = None
        self.hosts: opb.GetPoolMetricsResponse | None = None

    async def refresh(self) -> None:
        self.view, self.hosts = await asyncio.gather(read_pool(self.client), read_hosts(self.client))

    def collect(self) -> Iterator[Metric]:
        yield from pool_families(self.view)
        yield from host_families(self.hosts)


# ---- what the gateway saw ----


class GatewayMetrics:
    """The gateway's registry: its own counters and histograms, the pool collector and the process's CPU and
    memory (process_*)."""

    def __init__(self, client: PoolClient, open_requests: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("swactor_gateway_requests_total", "HTTP requests answered, by endpoint and status "
                                f"({CLIENT_LEFT}: the client left before an answer started)", ("endpoint", "status"),
                                registry=r)
        self.runs = Counter("swactor_gateway_runs_total", "Answers closed, by outcome (completed, client_gone or "
                            "the error code that ended it) and finish_reason (completed ones only)",
                            ("outcome", "finish_reason"), registry=r)
        self.ttft = Histogram("swactor_gateway_time_to_first_token_seconds", "Seconds from a run's submission to "
                              "its first token (queue wait and prefill included)", buckets=TTFT_BUCKETS_S, registry=r)
        self.tpot = Histogram("swactor_gateway_time_per_output_token_seconds", "Seconds per token after the first, "
                              "over one answer's decode (answers of two tokens or more)", buckets=TPOT_BUCKETS_S,
                              registry=r)
        self.completion_tokens = Counter("swactor_gateway_completion_tokens_total", "Tokens generated for answers "
                                         "(counted when the answer closes, whatever its outcome)", registry=r)
        self.prompt_tokens = Counter("swactor_gateway_prompt_tokens_total", "Prompt tokens of submitted runs "
                                     "(counted when the answer closes)", registry=r)
        Gauge("swactor_gateway_open_requests", "Completion requests being answered now (queued in the pool or "
              "decoding)", registry=r).set_function(open_requests)
        self.pool = PoolCollector(client)
        r.register(self.pool)
        ProcessCollector(registry=r)
        self._failed: dict[int, ApiError] = {}  # run id -> the error an open answer ended with

    def run_failed(self, answer: Answer, error: ApiError) -> None:
        """The answer's run ended in `error` (told before the answer closes)."""
        self._failed[answer.run_id] = error

    def answer_closed(self, answer: Answer) -> None:
        outcome = answer_outcome(answer, self._failed.pop(answer.run_id, None))
        self.runs.labels(outcome, answer.finish_reason or "").inc()
        if answer.first_token_s is not None:
            self.ttft.observe(answer.first_token_s)
        if (tpot := time_per_output_token_s(answer)) is not None:
            self.tpot.observe(tpot)
        self.completion_tokens.inc(answer.usage.completion_tokens)
        self.prompt_tokens.inc(answer.usage.prompt_tokens)

    def request_answered(self, path: str, status: int) -> None:
        self.requests.labels(endpoint_label(path), str(status)).inc()

    async def scrape(self, request: Request) -> Response:
        await self.pool.refresh()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class RequestCounter:
    """ASGI middleware: each HTTP request counted once it is over, with the status its answer started with."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = CLIENT_LEFT

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            self.metrics.request_answered(scope["path"], status)
