"""GET /metrics of the gateway in front of a real 2-host local pool: two chat completions through the official
`openai` client (one whole, one streamed) move its counters by what their answers reported, and the pool gauges
show the pool as the orchestrator sees it, and each host's own figures come through: its arena leased while the
streamed answer decodes, QUIC bytes sent to the other host, object records received, compute steps of its
stage. Parsed with prometheus_client's own parser."""

from __future__ import annotations

import urllib.error
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc
from tests.e2e.conftest import needs_model
from tests.gateway.helpers import gateway_pool, token_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), needs_model]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 6


def get(url: str, token: str | None) -> tuple[int, str, str]:
    """(status, content type, body) of a GET."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
            return resp.status, resp.headers["content-type"], resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["content-type"], e.read().decode()


def scrape(url: str, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, content_type, text = get(url, token)
    assert status == 200 and content_type.startswith("text/plain"), text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum over the series of `name` that carry `labels` (0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def scrape_while_decoding(c, metrics_url: str, token: str) -> dict:
    """A scrape while a run surely decodes (it ignores EOS, and is stopped after): its rings are leased on both
    hosts. Not counted in the gateway's figures: it is submitted to the orchestrator directly."""
    with c.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        run_id = stub.SubmitRun(opb.SubmitRunRequest(prompt="Once upon a time", raw=True, max_tokens=2000,
                                                     max_context=2048, ignore_eos=True,
                                                     sampling=opb.Sampling(temperature=0)), timeout=10).run_id
        try:
            updates = stub.WatchRun(opb.WatchRunRequest(run_id=run_id, omit_object_events=True))
            next(u for u in updates if u.HasField("token"))
            updates.cancel()
            return scrape(metrics_url, token)
        finally:
            stub.StopRun(opb.StopRunRequest(run_id=run_id, detail="test over"), timeout=10)


def test_two_answers_move_the_counters_and_the_pool_shows() -> None:
    with gateway_pool() as c:  # a stage on each host
        assert c.openai_url is not None
        token = token_of(c)
        metrics_url = c.openai_url.removesuffix("/v1") + "/metrics"
        before = scrape(metrics_url, token)
        refused, _, _ = get(metrics_url, None)
        client = openai.OpenAI(base_url=c.openai_url, api_key=token, max_retries=0, timeout=120)
        whole = client.chat.completions.create(model="", messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0)
        chunks = list(client.chat.completions.create(model="", messages=QUESTION, max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        after = scrape(metrics_url, token)
        during = scrape_while_decoding(c, metrics_url, token)
        nodes = [str(n) for n in c.node_ids]

    assert refused == 401  # behind the bearer token like every path but /health
    [streamed] = [ch.usage for ch in chunks if ch.usage is not None]
    usages = [whole.usage, streamed]
    assert all(u is not None and u.completion_tokens >= 2 for u in usages)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert moved("swactor_gateway_runs_total", outcome="completed") == 2
    assert moved("swactor_gateway_completion_tokens_total") == sum(u.completion_tokens for u in usages)
    assert moved("swactor_gateway_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert moved("swactor_gateway_time_to_first_token_seconds_count") == 2
    assert moved("swactor_gateway_time_per_output_token_seconds_count") == 2
    assert moved("swactor_gateway_requests_total", endpoint="/v1/chat/completions", status="200") == 2
    assert moved("swactor_gateway_requests_total", endpoint="/metrics", status="401") == 1
    assert total(after, "swactor_gateway_open_requests") == 0
    assert total(after, "swactor_pool_up") == 1 and total(after, "swactor_pool_ready") == 1
    assert total(after, "swactor_pool_members", readiness="available") == 2
    assert total(after, "swactor_pool_runs", state="queued") == 0
    assert moved("swactor_pool_retained_runs", outcome="completed") == 2
    assert total(after, "swactor_pool_models", state="ready") == 1

    # each host's own figures, through the orchestrator
    for node in nodes:
        assert total(after, "swactor_host_up", node_id=node) == 1
        assert total(during, "swactor_host_arena_leased_bytes", node_id=node) > 0
        assert total(after, "swactor_host_arena_ceiling_bytes", node_id=node) > 0
        assert total(after, "swactor_host_quic_sent_bytes_total", node_id=node) > 0
        assert total(after, "swactor_host_quic_received_datagrams_total", node_id=node) > 0
        assert total(after, "swactor_host_edge_object_transfer_seconds_count", node_id=node, role="recv") > 0
        assert total(after, "swactor_stage_step_seconds_count", node_id=node) > 0
        assert total(after, "swactor_stage_step_seconds_sum", node_id=node) > 0
    stages = sorted(dict(ls)["stage_index"] for (n, ls) in after if n == "swactor_stage_step_seconds_count")
    assert stages == ["0", "1"]  # one stage on each host
