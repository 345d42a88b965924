"""The gateway's HTTP surface driven as an ASGI app over a fake orchestrator client: the token, the body bounds, the
concurrency bound, the pool's readiness, the error shapes, and how a run's end becomes finish_reason or an error."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import grpc
import pytest

from swactor.gateway import errors
from swactor.gateway.app import build_app
from swactor.gateway.config import GatewayConfig
from swactor.gateway.pool_client import refusal
from swactor.v1 import orchestrator_pb2 as opb
from tests.gateway.helpers import FakeCall

TOKEN = b"t" * 32
AUTH = {"authorization": "Bearer " + TOKEN.decode()}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def tokens(*texts: str, outcome: int = opb.RUN_OUTCOME_COMPLETED, reason: str = "eos") -> list[opb.RunUpdate]:
    out = [opb.RunUpdate(token=opb.TokenDelta(sequence=i, token_id=i, text=t)) for i, t in enumerate(texts)]
    out.append(opb.RunUpdate(finished=opb.Run(run_id=7, outcome=outcome, reason=reason,
                                              token_ids=range(len(texts)))))
    return out


@dataclass
class FakePool:
    updates: list[opb.RunUpdate] = field(default_factory=lambda: tokens("Hel", "lo"))
    ready: bool = True
    submit_error: Exception | None = None
    hold: asyncio.Event | None = None
    submitted: list[opb.SubmitRunRequest] = field(default_factory=list)
    stopped: list[tuple[int, str]] = field(default_factory=list)

    async def model(self, name: str) -> opb.ServedModel:
        if name not in ("", "m"):
            raise errors.not_found(f"no {name}", param="model", code="model_not_found")
        return opb.ServedModel(name="m", is_default=True, context_length=64)

    async def models(self) -> list[opb.ServedModel]:
        return [await self.model("m")]

    async def pool(self) -> opb.ListNodesResponse:
        return opb.ListNodesResponse(pool_ready=self.ready, pool_detail="" if self.ready else "no nodes")

    async def submit(self, req: opb.SubmitRunRequest) -> opb.SubmitRunResponse:
        if self.submit_error is not None:
            raise self.submit_error
        self.submitted.append(req)
        return opb.SubmitRunResponse(run_id=7, prompt_tokens=5)

    def watch(self, run_id: int) -> FakeCall:
        return FakeCall(self.updates, self.hold)

    async def stop(self, run_id: int, detail: str) -> None:
        self.stopped.append((run_id, detail))


async def call(app, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
               chunks: list[bytes] | None = None) -> tuple[int, dict[str, str], bytes]:
    parts = chunks if chunks is not None else [body]
    incoming = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    sent: list[dict] = []

    async def receive() -> dict:
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: dict) -> None:
        sent.append(message)

    hdrs = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if chunks is None:
        hdrs.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "path": path, "raw_path": path.encode(), "query_string": b"", "headers": hdrs,
             "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000), "root_path": ""}
    await app(scope, receive, send)
    start = sent[0]
    return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


def gateway(pool: FakePool, **cfg) -> object:
    return build_app(GatewayConfig(**cfg), pool, TOKEN)  # type: ignore[arg-type]


def post(app, path: str, body: dict, **kw) -> tuple[int, dict[str, str], bytes]:
    return asyncio.run(call(app, "POST", path, json.dumps(body).encode(), {**AUTH, **kw.pop("headers", {})}, **kw))


def test_every_route_but_health_needs_the_token() -> None:
    app = gateway(FakePool())
    status, _, body = asyncio.run(call(app, "GET", "/v1/models"))
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    status, _, _ = asyncio.run(call(app, "GET", "/v1/models", headers={"authorization": "Bearer wrong"}))
    assert status == 401
    status, _, body = asyncio.run(call(app, "GET", "/v1/models", headers=AUTH))
    assert status == 200 and json.loads(body)["data"][0]["id"] == "m"
    assert asyncio.run(call(app, "GET", "/health"))[0] == 200


def test_whole_answer_and_usage() -> None:
    pool = FakePool()
    status, _, body = post(gateway(pool), "/v1/chat/completions", CHAT)
    answer = json.loads(body)
    assert status == 200 and answer["choices"][0]["message"]["content"] == "Hello"
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["id"] == "chatcmpl-7"
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert pool.submitted[0].max_tokens == 64  # no max_tokens: the model's context
    assert pool.stopped == []  # the run ended by itself


def test_length_and_faults_become_finish_reason_or_errors() -> None:
    pool = FakePool(updates=tokens("a", reason="max_tokens"))
    assert json.loads(post(gateway(pool), "/v1/completions", {"prompt": "x"})[2])["choices"][0]["finish_reason"] \
        == "length"
    pool = FakePool(updates=tokens(outcome=opb.RUN_OUTCOME_FAULTED, reason="RUN_FAULT_NODE_UNAVAILABLE"))
    status, headers, body = post(gateway(pool), "/v1/completions", {"prompt": "x"})
    assert status == 503 and "retry-after" in headers and json.loads(body)["error"]["code"] == "pool_not_ready"
    pool = FakePool(updates=tokens("a", outcome=opb.RUN_OUTCOME_FAULTED, reason="RUN_FAULT_STEP_TIMEOUT"))
    status, _, body = post(gateway(pool), "/v1/completions", {"prompt": "x"})
    assert status == 500 and "RUN_FAULT_STEP_TIMEOUT" in json.loads(body)["error"]["message"]


def test_stream_carries_an_error_that_comes_after_the_headers() -> None:
    pool = FakePool(updates=tokens("a", outcome=opb.RUN_OUTCOME_FAULTED, reason="RUN_FAULT_WORKER_CRASHED"))
    status, headers, body = post(gateway(pool), "/v1/completions", {"prompt": "x", "stream": True})
    events = body.decode().split("\n\n")
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert json.loads(events[0].removeprefix("data: "))["choices"][0]["text"] == "a"
    assert json.loads(events[1].removeprefix("data: "))["error"]["code"] == "run_faulted"
    assert "data: [DONE]" not in events


def test_a_stop_string_stops_the_run() -> None:
    pool = FakePool(updates=tokens("one", " two", " three"))
    body = json.loads(post(gateway(pool), "/v1/completions", {"prompt": "x", "stop": " tw"})[2])
    assert body["choices"][0]["text"] == "one" and body["choices"][0]["finish_reason"] == "stop"
    assert pool.stopped == [(7, "stop string")]


def test_bounds_on_bodies_and_requests_at_once() -> None:
    pool = FakePool()
    app = gateway(pool, max_request_bytes=100)
    status, _, body = asyncio.run(call(app, "POST", "/v1/completions", headers=AUTH, chunks=[b"{" + b" " * 60] * 2))
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert pool.submitted == []

    async def two_at_once() -> int:
        pool.hold = asyncio.Event()
        pool.updates = tokens("a")[:1]  # a token, then the run goes on
        app = gateway(pool, max_concurrent=1)
        first = asyncio.ensure_future(call(app, "POST", "/v1/completions", b'{"prompt": "x"}', AUTH))
        await asyncio.sleep(0.05)
        status, headers, _ = await call(app, "POST", "/v1/completions", b'{"prompt": "x"}', AUTH)
        first.cancel()  # the first client leaves: its run is stopped
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.sleep(0)
        assert headers["retry-after"] == "1"
        return status

    assert asyncio.run(two_at_once()) == 429
    assert pool.stopped == [(7, "client gone")]


def test_pool_not_ready_is_503_and_unknown_model_404() -> None:
    status, headers, body = post(gateway(FakePool(ready=False)), "/v1/chat/completions", CHAT)
    assert status == 503 and headers["retry-after"] and "no nodes" in json.loads(body)["error"]["message"]
    status, _, body = post(gateway(FakePool()), "/v1/chat/completions", {**CHAT, "model": "other"})
    assert status == 404 and json.loads(body)["error"]["param"] == "model"


class RpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(("code", "details", "status", "param"), [
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "run queue full (16)", 429, None),
    (grpc.StatusCode.INVALID_ARGUMENT, "max_tokens 9000 is more than the context holds", 400, "max_tokens"),
    (grpc.StatusCode.INVALID_ARGUMENT, "prompt_ids: id 99999 is not below the vocab size", 400, "prompt"),
    (grpc.StatusCode.UNAVAILABLE, "connection refused", 503, None),
    (grpc.StatusCode.INTERNAL, "boom", 500, None),
])
def test_orchestrator_refusals_map_to_openai_errors(code, details, status, param) -> None:
    e = refusal(RpcError(code, details), "SubmitRun")
    assert (e.status, e.param) == (status, param)
    assert details in e.message
    if status == 429:
        assert e.headers()["Retry-After"].isdigit()
