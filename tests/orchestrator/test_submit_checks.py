"""SubmitRun's bounds through the real gRPC API: the byte limit before parsing, UTF-8 named by field,
NaN/inf and out-of-range sampling values, max_tokens, raw; and tokenization off the event loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest

from swactor.common.grpcio import unix_target
from swactor.orchestrator.api.validation import utf8_error
from swactor.orchestrator.runs.manager import Limits
from swactor.orchestrator.tokens import prompting
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import serving
from .helpers import pool

pytestmark = pytest.mark.timeout(60)
NAN, INF = float("nan"), float("inf")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def refusal(call, req) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(req)
    return err.value.code(), err.value.details()


def raw_submit(sock: Path, method: str = "SubmitRun"):
    """SubmitRun (or Plan, which takes the same request) sending bytes as given (a client that does not check UTF-8)."""
    channel = grpc.aio.insecure_channel(unix_target(sock))
    return channel, channel.unary_unary(f"/swactor.v1.Orchestrator/{method}", request_serializer=None,
                                        response_deserializer=lambda data: data)


def with_bad_utf8(req: opb.SubmitRunRequest, marker: str) -> bytes:
    data = req.SerializeToString()
    assert data.count(marker.encode()) == 1
    return data.replace(marker.encode(), b"\xff" + marker.encode()[1:])


def test_values_no_run_could_use_are_refused_by_field(tmp_path: Path) -> None:
    chat = opb.ChatMessages(messages=[opb.ChatMessage(role="user", content="hi")])
    cases = [
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, sampling=opb.Sampling(temperature=NAN)),
         "sampling.temperature must be a finite number, got nan"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, sampling=opb.Sampling(temperature=INF)),
         "sampling.temperature must be a finite number, got inf"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, sampling=opb.Sampling(top_p=-INF)),
         "sampling.top_p must be a finite number, got -inf"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, sampling=opb.Sampling(top_p=NAN)),
         "sampling.top_p must be a finite number"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, sampling=opb.Sampling(top_p=1.5)),
         "sampling.top_p must be in [0, 1]"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, sampling=opb.Sampling(top_p=-0.1)),
         "sampling.top_p must be in [0, 1]"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, sampling=opb.Sampling(temperature=-0.5)),
         "sampling.temperature must be >= 0"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=2**31 - 1),
         "max_tokens 2147483647 is more than the context holds (4096 tokens"),
        (opb.SubmitRunRequest(messages=chat, raw=True, max_tokens=5), "raw applies to prompt only"),
        (opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=[1]), raw=True, max_tokens=5), "raw applies to prompt only"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, speculate=17), "speculate must be at most 16 drafted tokens"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, speculate=2, drafter=7),
         "drafter must be one of DRAFTER_AUTO, DRAFTER_PROMPT_LOOKUP, DRAFTER_DRAFT_MODEL, got 7"),
        (opb.SubmitRunRequest(prompt="hi", max_tokens=5, speculate=2, drafter=opb.DRAFTER_DRAFT_MODEL),
         "drafter DRAFTER_DRAFT_MODEL: this orchestrator has no draft model ([orchestrator] draft_model)"),
    ]

    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1)) as s:
            seen = [await refusal(s.stub.SubmitRun, req) for req, _ in cases]
            fine = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="hi", max_tokens=4096,
                                                               sampling=opb.Sampling(temperature=1e30, top_k=2**32 - 1)))
            return seen, fine

    seen, fine = run(main())
    for (req, needle), (code, details) in zip(cases, seen, strict=True):
        assert code == grpc.StatusCode.INVALID_ARGUMENT and needle in details, (req, details)
    assert fine.run_id  # a huge finite temperature and a top_k past the vocabulary are valid (no cut)


def test_invalid_utf8_is_named_by_field_and_an_oversized_request_refused_before_parsing(tmp_path: Path) -> None:
    messages = opb.ChatMessages(messages=[opb.ChatMessage(role="system", content="be brief"),
                                          opb.ChatMessage(role="user", content="Zcontent")])
    cases = [
        (with_bad_utf8(opb.SubmitRunRequest(prompt="Zprompt", max_tokens=5), "Zprompt"),
         "prompt is not valid UTF-8 (byte 0: invalid start byte)"),
        (with_bad_utf8(opb.SubmitRunRequest(messages=messages, max_tokens=5), "Zcontent"),
         "messages.messages[1].content is not valid UTF-8"),
        (with_bad_utf8(opb.SubmitRunRequest(prompt="hi", model="Zmodel", max_tokens=5), "Zmodel"),
         "model is not valid UTF-8"),
        (b"\x0a\xff\xff", "the request does not parse"),
        (opb.SubmitRunRequest(prompt="x" * 5000, raw=True, max_tokens=5).SerializeToString(),
         "the request is 5007 bytes; this orchestrator takes at most 4096 ([orchestrator].max_request_bytes)"),
    ]

    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1), limits=Limits(max_request_bytes=4096)) as s:
            seen = []
            for method in ("SubmitRun", "Plan"):  # the dry run reads its request as SubmitRun does
                channel, submit = raw_submit(s.socket, method)
                try:
                    seen += [await refusal(submit, data) for data, _ in cases]
                finally:
                    await channel.close()
            listed = await s.stub.ListRuns(opb.ListRunsRequest())
            return seen, listed

    seen, listed = run(main())
    for (_, needle), (code, details) in zip(cases * 2, seen, strict=True):
        assert code == grpc.StatusCode.INVALID_ARGUMENT and needle in details, details
    assert list(listed.runs) == []


def test_utf8_walker_finds_nested_and_repeated_fields() -> None:
    msgs = [opb.ChatMessage(role="user", content=f"Q{k}") for k in range(3)]
    data = opb.SubmitRunRequest(messages=opb.ChatMessages(messages=msgs), model="m", max_tokens=3).SerializeToString()
    assert utf8_error(data, opb.SubmitRunRequest.DESCRIPTOR) is None
    bad = data.replace(b"Q2", b"\xc3(")
    assert utf8_error(bad, opb.SubmitRunRequest.DESCRIPTOR).startswith("messages.messages[2].content is not valid")
    assert utf8_error(bad[:30], opb.SubmitRunRequest.DESCRIPTOR) is None  # cut inside: no field to name


def test_tokenizing_runs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a prompt is being tokenized (held here in the worker thread), other RPCs are answered."""
    entered, release = threading.Event(), threading.Event()
    real = prompting.prompt_ids

    def slow_prompt_ids(req, model, context):
        entered.set()
        assert release.wait(20)
        return real(req, model, context)

    monkeypatch.setattr(prompting, "prompt_ids", slow_prompt_ids)

    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1)) as s:
            submit = asyncio.ensure_future(s.stub.SubmitRun(opb.SubmitRunRequest(prompt="hi", max_tokens=3)))
            assert await asyncio.to_thread(entered.wait, 10)
            listed = await s.stub.ListRuns(opb.ListRunsRequest())
            nodes = await s.stub.ListNodes(opb.ListNodesRequest())
            pending = not submit.done()
            release.set()
            return listed, nodes, pending, await submit

    listed, nodes, pending, submitted = run(main())
    assert pending and list(listed.runs) == [] and [n.node_id for n in nodes.nodes] == [1]
    assert submitted.run_id and submitted.prompt_tokens > 0
