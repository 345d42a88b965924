"""GET /metrics driven as an ASGI app over a fake orchestrator client, read back with prometheus_client's own parser:
requests by endpoint and status, answers by outcome with their tokens and latencies, the open requests, and the
pool's gauges (or `swactor_pool_up` 0 when the orchestrator does not answer)."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from swactor.gateway import errors
from swactor.gateway.answers import Answer, Usage
from swactor.gateway.app import build_app
from swactor.gateway.config import GatewayConfig
from swactor.gateway.metrics import PoolView, endpoint_label, pool_families, time_per_output_token_s
from swactor.gateway.requests import Endpoint, parse
from swactor.v1 import edge_pb2, stage_pb2
from swactor.v1 import orchestrator_pb2 as opb
from tests.gateway.helpers import FakeCall

pytestmark = pytest.mark.timeout(30)
TOKEN = b"m" * 32
AUTH = {"authorization": "Bearer " + TOKEN.decode()}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def tokens(*texts: str, outcome: int = opb.RUN_OUTCOME_COMPLETED, reason: str = "eos") -> list[opb.RunUpdate]:
    out = [opb.RunUpdate(token=opb.TokenDelta(sequence=i, token_id=i, text=t)) for i, t in enumerate(texts)]
    out.append(opb.RunUpdate(finished=opb.Run(run_id=7, outcome=outcome, reason=reason, token_ids=range(len(texts)))))
    return out


def listed_nodes() -> opb.ListNodesResponse:
    A, S = opb.NODE_READINESS_AVAILABLE, opb.NODE_READINESS_SUSPECT
    return opb.ListNodesResponse(
        pool_ready=True,
        nodes=[opb.Node(node_id=11, hostname="h0", readiness=A, provisionable=True, slots_in_use=2, run_slots=3),
               opb.Node(node_id=12, hostname="h1", readiness=A, provisionable=True, slots_in_use=2, run_slots=3),
               opb.Node(node_id=13, hostname="h2", readiness=S)],
        live_runs=[opb.RunStateCount(state=opb.RUN_STATE_QUEUED, runs=4),
                   opb.RunStateCount(state=opb.RUN_STATE_RUNNING, runs=2)])


def retained_runs() -> list[opb.Run]:
    done, faulted = opb.RUN_OUTCOME_COMPLETED, opb.RUN_OUTCOME_FAULTED
    return [opb.Run(run_id=1, state=opb.RUN_STATE_DONE, outcome=done, reason="eos"),
            opb.Run(run_id=2, state=opb.RUN_STATE_DONE, outcome=done, reason="eos"),
            opb.Run(run_id=3, state=opb.RUN_STATE_DONE, outcome=done, reason="max_tokens"),
            opb.Run(run_id=4, state=opb.RUN_STATE_DONE, outcome=faulted, reason="RUN_FAULT_STEP_FAILED"),
            opb.Run(run_id=5, state=opb.RUN_STATE_RUNNING)]  # in flight: no outcome yet, not counted


def host_figures() -> opb.GetPoolMetricsResponse:
    """Node 11 answered with every figure, node 13 did not answer."""
    host = stage_pb2.HostMetrics(node_id=11, weights_fetched_bytes=5 << 20,
                                 arena=stage_pb2.ArenaFigures(ceiling_bytes=1 << 30, leased_bytes=3 << 20, leases=4),
                                 traffic=[edge_pb2.PeerTraffic(peer_node_id=12, sent_bytes=9000, sent_datagrams=7,
                                                               received_bytes=800, received_datagrams=6,
                                                               lost_packets=1)],
                                 steps=[stage_pb2.StageSteps(stage_index=0, count=40, seconds=2.5)],
                                 transfers=[edge_pb2.ObjectTransfers(peer_node_id=12, role=edge_pb2.EDGE_ROLE_SEND,
                                                                     objects=41, seconds=0.25)])
    return opb.GetPoolMetricsResponse(nodes=[opb.NodeMetrics(node_id=11, hostname="h0", host=host),
                                             opb.NodeMetrics(node_id=13, hostname="h2", error="UNAVAILABLE: gone")])


@dataclass
class FakePool:
    updates: list[opb.RunUpdate] = field(default_factory=lambda: tokens("Hel", "lo", "!"))
    hold: asyncio.Event | None = None
    down: bool = False  # the orchestrator does not answer the scrape's questions
    runs_asked: list[int] = field(default_factory=list)

    async def model(self, name: str) -> opb.ServedModel:
        return opb.ServedModel(name="m", is_default=True, context_length=64, state="ready")

    async def models(self) -> list[opb.ServedModel]:
        self._answer()
        return [await self.model("m"), opb.ServedModel(name="big", state="preparing")]

    async def pool(self) -> opb.ListNodesResponse:
        return listed_nodes()

    async def runs(self, limit: int = 50) -> list[opb.Run]:
        self._answer()
        self.runs_asked.append(limit)
        return retained_runs()

    async def host_metrics(self) -> opb.GetPoolMetricsResponse:
        self._answer()
        return host_figures()

    def _answer(self) -> None:
        if self.down:
            raise errors.unavailable("ListRuns: connection refused", code="orchestrator_unavailable")

    async def submit(self, req: opb.SubmitRunRequest) -> opb.SubmitRunResponse:
        return opb.SubmitRunResponse(run_id=7, prompt_tokens=5)

    def watch(self, run_id: int) -> FakeCall:
        return FakeCall(self.updates, self.hold)

    async def stop(self, run_id: int, detail: str) -> None:
        pass


async def call(app, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
               leave: bool = False) -> tuple[int, bytes]:
    """One request; `leave`: the client disconnects once the body is read."""
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if incoming:
            return incoming.pop(0)
        if leave:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: dict) -> None:
        sent.append(message)

    hdrs = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    hdrs.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "path": path, "raw_path": path.encode(), "query_string": b"", "headers": hdrs,
             "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000), "root_path": ""}
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def gateway(pool: FakePool):
    return build_app(GatewayConfig(), pool, TOKEN)  # type: ignore[arg-type]


async def chat(app, **body) -> tuple[int, bytes]:
    return await call(app, "POST", "/v1/chat/completions", json.dumps({**CHAT, **body}).encode(), AUTH)


async def scrape(app) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exposition as {(sample name, sorted labels): value}, parsed by prometheus_client."""
    status, body = await call(app, "GET", "/metrics", headers=AUTH)
    assert status == 200, body
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_metrics_need_the_token_and_the_refusal_is_counted() -> None:
    async def main():
        app = gateway(FakePool())
        refused = await call(app, "GET", "/metrics")
        return refused, await scrape(app)

    (status, _), samples = asyncio.run(main())
    assert status == 401
    assert value(samples, "swactor_gateway_requests_total", endpoint="/metrics", status="401") == 1
    # the scrape that reads them is counted once it is over, not in its own body
    assert value(samples, "swactor_gateway_requests_total", endpoint="/metrics", status="200") is None


def test_closed_answers_move_the_counters() -> None:
    async def main():
        app = gateway(FakePool())
        before = await scrape(app)
        whole = await chat(app)
        streamed = await chat(app, stream=True)
        length = FakePool(updates=tokens("a", "b", reason="max_tokens"))
        app_length = gateway(length)
        await chat(app_length)
        return before, whole, streamed, await scrape(app), await scrape(app_length)

    before, whole, streamed, after, after_length = asyncio.run(main())
    assert whole[0] == 200 and streamed[0] == 200 and b"[DONE]" in streamed[1]
    assert value(before, "swactor_gateway_runs_total", outcome="completed", finish_reason="stop") is None
    assert value(before, "swactor_gateway_completion_tokens_total") == 0
    assert value(after, "swactor_gateway_runs_total", outcome="completed", finish_reason="stop") == 2
    assert value(after, "swactor_gateway_completion_tokens_total") == 6
    assert value(after, "swactor_gateway_prompt_tokens_total") == 10
    assert value(after, "swactor_gateway_requests_total", endpoint="/v1/chat/completions", status="200") == 2
    assert value(after, "swactor_gateway_time_to_first_token_seconds_count") == 2
    assert value(after, "swactor_gateway_time_per_output_token_seconds_count") == 2
    assert value(after, "swactor_gateway_time_to_first_token_seconds_bucket", le="+Inf") == 2
    assert value(after, "swactor_gateway_open_requests") == 0
    assert value(after_length, "swactor_gateway_runs_total", outcome="completed", finish_reason="length") == 1


def test_failed_and_abandoned_answers_are_counted_by_how_they_ended() -> None:
    faulted = tokens("x", outcome=opb.RUN_OUTCOME_FAULTED, reason="RUN_FAULT_STEP_FAILED")

    async def main():
        app = gateway(FakePool(updates=faulted))
        whole = await chat(app)
        streamed = await chat(app, stream=True)
        held = gateway(FakePool(updates=tokens("a")[:1], hold=asyncio.Event()))
        left = await call(held, "POST", "/v1/chat/completions", json.dumps(CHAT).encode(), AUTH, leave=True)
        return whole, streamed, left, await scrape(app), await scrape(held)

    whole, streamed, left, samples, held = asyncio.run(main())
    assert whole[0] == 500 and streamed[0] == 200 and b"run_faulted" in streamed[1]
    assert value(samples, "swactor_gateway_runs_total", outcome="run_faulted", finish_reason="") == 2
    assert value(samples, "swactor_gateway_requests_total", endpoint="/v1/chat/completions", status="500") == 1
    assert value(samples, "swactor_gateway_time_per_output_token_seconds_count") == 0  # one token each: no decode
    assert left[0] == 499
    assert value(held, "swactor_gateway_runs_total", outcome="client_gone", finish_reason="") == 1
    assert value(held, "swactor_gateway_completion_tokens_total") == 1
    assert value(held, "swactor_gateway_time_to_first_token_seconds_count") == 1


def test_open_requests_while_an_answer_is_decoding() -> None:
    async def main():
        release = asyncio.Event()
        app = gateway(FakePool(updates=tokens("a", "b")[:2], hold=release))
        answering = asyncio.ensure_future(chat(app))
        while (await scrape(app))[("swactor_gateway_open_requests", ())] == 0:
            await asyncio.sleep(0)
        during = await scrape(app)
        answering.cancel()
        await asyncio.gather(answering, return_exceptions=True)
        return during, await scrape(app)

    during, after = asyncio.run(main())
    assert value(during, "swactor_gateway_open_requests") == 1
    assert value(during, "swactor_gateway_runs_total", outcome="client_gone", finish_reason="") is None
    assert value(after, "swactor_gateway_open_requests") == 0
    assert value(after, "swactor_gateway_runs_total", outcome="client_gone", finish_reason="") == 1


def test_pool_gauges_at_scrape_time() -> None:
    pool = FakePool()
    samples = asyncio.run(scrape(gateway(pool)))
    assert value(samples, "swactor_pool_up") == 1 and value(samples, "swactor_pool_ready") == 1
    assert value(samples, "swactor_pool_members", readiness="available") == 2
    assert value(samples, "swactor_pool_members", readiness="suspect") == 1
    assert value(samples, "swactor_pool_members", readiness="faulted") == 0  # every readiness shown, 0 included
    assert value(samples, "swactor_pool_provisionable_members") == 2
    assert value(samples, "swactor_pool_node_run_slots", node_id="11", hostname="h0") == 3
    assert value(samples, "swactor_pool_node_run_slots_in_use", node_id="12", hostname="h1") == 2
    assert value(samples, "swactor_pool_node_run_slots", node_id="13", hostname="h2") is None  # holds no slot
    assert value(samples, "swactor_pool_runs", state="queued") == 4
    assert value(samples, "swactor_pool_runs", state="running") == 2
    assert value(samples, "swactor_pool_runs", state="provisioning") == 0
    assert value(samples, "swactor_pool_retained_runs", outcome="completed", reason="eos") == 2
    assert value(samples, "swactor_pool_retained_runs", outcome="completed", reason="max_tokens") == 1
    assert value(samples, "swactor_pool_retained_runs", outcome="faulted", reason="RUN_FAULT_STEP_FAILED") == 1
    assert sum(v for (name, _), v in samples.items() if name == "swactor_pool_retained_runs") == 4
    assert value(samples, "swactor_pool_models", state="ready") == 1
    assert value(samples, "swactor_pool_models", state="preparing") == 1
    assert value(samples, "swactor_pool_models", state="failed") == 0
    assert pool.runs_asked == [1000]


def test_host_figures_at_scrape_time() -> None:
    samples = asyncio.run(scrape(gateway(FakePool())))
    h0, h2 = {"node_id": "11", "hostname": "h0"}, {"node_id": "13", "hostname": "h2"}
    assert value(samples, "swactor_host_up", **h0) == 1 and value(samples, "swactor_host_up", **h2) == 0
    assert value(samples, "swactor_host_arena_ceiling_bytes", **h0) == 1 << 30
    assert value(samples, "swactor_host_arena_leased_bytes", **h0) == 3 << 20
    assert value(samples, "swactor_host_arena_leases", **h0) == 4
    peer = {**h0, "peer_node_id": "12"}
    assert value(samples, "swactor_host_quic_sent_bytes_total", **peer) == 9000
    assert value(samples, "swactor_host_quic_received_bytes_total", **peer) == 800
    assert value(samples, "swactor_host_quic_sent_datagrams_total", **peer) == 7
    assert value(samples, "swactor_host_quic_received_datagrams_total", **peer) == 6
    assert value(samples, "swactor_host_quic_lost_packets_total", **peer) == 1
    assert value(samples, "swactor_host_edge_object_transfer_seconds_count", **peer, role="send") == 41
    assert value(samples, "swactor_host_edge_object_transfer_seconds_sum", **peer, role="send") == 0.25
    assert value(samples, "swactor_host_weights_fetched_bytes_total", **h0) == 5 << 20
    assert value(samples, "swactor_stage_step_seconds_count", **h0, stage_index="0") == 40
    assert value(samples, "swactor_stage_step_seconds_sum", **h0, stage_index="0") == 2.5
    # the member that did not answer has nothing but its up
    assert [name for name, labels in samples if ("node_id", "13") in labels] == ["swactor_host_up"]


def test_an_orchestrator_that_does_not_answer_shows_as_pool_down() -> None:
    samples = asyncio.run(scrape(gateway(FakePool(down=True))))
    assert value(samples, "swactor_pool_up") == 0
    assert not [name for name, _ in samples if name.startswith("swactor_pool_") and name != "swactor_pool_up"]
    assert not [name for name, _ in samples if name.startswith("swactor_host_")]
    assert value(samples, "swactor_gateway_open_requests") == 0  # the gateway's own series are still there


def test_pool_families_without_a_view_are_only_up() -> None:
    [up] = pool_families(None)
    assert up.name == "swactor_pool_up" and [s.value for s in up.samples] == [0]
    names = {f.name for f in pool_families(PoolView(listed_nodes(), retained_runs(), []))}
    assert {"swactor_pool_up", "swactor_pool_runs", "swactor_pool_retained_runs", "swactor_pool_models"} <= names


@pytest.mark.parametrize(("first", "last", "n", "want"), [
    (1.0, 3.0, 5, 0.5),     # 4 tokens after the first in 2 s
    (0.2, 0.2, 1, None),    # one token: no decode to measure
    (None, None, 0, None),  # no token at all
])
def test_time_per_output_token(first: float | None, last: float | None, n: int, want: float | None) -> None:
    answer = Answer(FakePool(), parse(Endpoint.CHAT, CHAT), 7, "m", Usage(5, n))  # type: ignore[arg-type]
    answer.first_token_s, answer.last_token_s = first, last
    assert time_per_output_token_s(answer) == want


@pytest.mark.parametrize(("path", "label"), [
    ("/v1/chat/completions", "/v1/chat/completions"), ("/metrics", "/metrics"),
    ("/v1/models/some/model.gguf", "/v1/models/{name}"), ("/v2/anything", "other"),
])
def test_endpoint_label_is_the_route(path: str, label: str) -> None:
    assert endpoint_label(path) == label


def test_the_dashboard_asks_only_for_series_the_gateway_exposes() -> None:
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    asked = {name for e in exprs for name in re.findall(r"\bswactor_[a-z_]+", e)}

    async def main():
        app = gateway(FakePool())
        await chat(app)  # a labelled counter has series once something was counted
        return await scrape(app)

    exposed = {name for name, _ in asyncio.run(main())}
    assert asked and asked <= exposed, asked - exposed
