"""The OpenAI-compatible gateway against a real 2-host local pool, driven by the official `openai` client and curl:
answers equal `swactor submit`'s for the same prompt and settings, stop strings, the refusals (401, 400, 404, 429),
and a client that leaves mid-answer stops its run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import openai
import pytest

from swactor.localcluster import LocalCluster
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc
from tests.e2e.conftest import needs_model
from tests.gateway.helpers import MODEL, gateway_pool, token_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400), needs_model]

QUESTION = "What is the capital of France?"
STORY = "Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalCluster]:
    with gateway_pool(queue_depth=1, pool_timeout_s=8.0) as c:  # a queue of one: a third run is refused (429)
        yield c


@pytest.fixture(scope="module")
def token(pool: LocalCluster) -> str:
    return token_of(pool)


@pytest.fixture(scope="module")
def client(pool: LocalCluster, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=pool.openai_url, api_key=token, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def stub(pool: LocalCluster) -> Iterator[orchestrator_pb2_grpc.OrchestratorStub]:
    with pool.channel() as ch:
        yield orchestrator_pb2_grpc.OrchestratorStub(ch)


def swactor_submit(pool: LocalCluster, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "swactor.cli.main", "--address", pool.orchestrator_address,
                           "submit", "--watch", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n")
    return done.stdout[:-1]


def run_of(answer_id: str) -> int:
    return int(answer_id.rsplit("-", 1)[1])


def wait_done(stub, run_id: int, within_s: float = 20.0) -> opb.Run:
    deadline = time.monotonic() + within_s
    while True:
        run = stub.GetRun(opb.GetRunRequest(run_id=run_id), timeout=5)
        if run.state == opb.RUN_STATE_DONE or time.monotonic() > deadline:
            return run
        time.sleep(0.05)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_equals_swactor_submit_streaming_or_not(pool: LocalCluster, client: openai.OpenAI) -> None:
    want = swactor_submit(pool, "--prompt", QUESTION, "--max-tokens", "24")
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=24, temperature=0)
    assert whole.choices[0].message.content == want
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                 max_tokens=24, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_completion_equals_swactor_submit_raw_and_seeded(pool: LocalCluster, client: openai.OpenAI) -> None:
    want = swactor_submit(pool, "--prompt", STORY, "--raw", "--max-tokens", "16", "--temperature", "0.8",
                          "--seed", "7")
    got = client.completions.create(model=MODEL, prompt=STORY, max_tokens=16, temperature=0.8, seed=7)
    assert got.choices[0].text == want
    streamed = client.completions.create(model=MODEL, prompt=STORY, max_tokens=16, temperature=0.8, seed=7,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want
    if got.usage.completion_tokens == 16:
        assert got.choices[0].finish_reason == "length"


def test_a_stop_string_ends_the_answer_before_it(pool: LocalCluster, client: openai.OpenAI, stub) -> None:
    full = swactor_submit(pool, "--prompt", STORY, "--raw", "--max-tokens", "24", "--ignore-eos")
    words = full.split(" ")
    assert len(words) > 4, full
    stop = " " + words[3][:3]  # a space and a piece of the fourth word: likely split over two tokens
    cut = full[:full.index(stop)]
    whole = client.completions.create(model=MODEL, prompt=STORY, max_tokens=24, temperature=0, stop=[stop, "zzzz"])
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (cut, "stop")
    streamed = list(client.completions.create(model=MODEL, prompt=STORY, max_tokens=24, temperature=0, stop=stop,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == cut
    assert streamed[-1].choices[0].finish_reason == "stop"
    run = wait_done(stub, run_of(whole.id))  # the run was stopped there, not decoded to its end
    assert run.outcome == opb.RUN_OUTCOME_STOPPED and len(run.token_ids) < 24


def test_curl_sees_server_sent_events_ending_in_done(pool: LocalCluster, token: str) -> None:
    body = json.dumps({"model": MODEL, "prompt": STORY, "max_tokens": 4, "temperature": 0, "stream": True})
    done = subprocess.run(["curl", "-sN", "--fail-with-body", "-H", f"Authorization: Bearer {token}",
                           "-H", "Content-Type: application/json", "-d", body, f"{pool.openai_url}/completions"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    events = done.stdout.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert len(payloads) == 4 + 1  # four tokens, then the finish


def test_refusals(pool: LocalCluster, client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=pool.openai_url, api_key="not-the-token", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=messages)
    assert e.value.body["code"] == "model_not_found"


def test_a_full_queue_answers_429_with_retry_after(pool: LocalCluster, client: openai.OpenAI, stub) -> None:
    long = dict(prompt=STORY, raw=True, max_tokens=2000, ignore_eos=True, max_context=2048,
                sampling=opb.Sampling(temperature=0))
    running = stub.SubmitRun(opb.SubmitRunRequest(**long), timeout=10).run_id
    queued = stub.SubmitRun(opb.SubmitRunRequest(**long), timeout=10).run_id
    try:
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert e.value.response.headers["retry-after"].isdigit()
        assert e.value.body["code"] == "queue_full"
    finally:
        for run_id in (queued, running):
            stub.StopRun(opb.StopRunRequest(run_id=run_id, detail="test over"), timeout=10)
    assert wait_done(stub, running).state == opb.RUN_STATE_DONE


def test_a_client_gone_mid_stream_stops_its_run(client: openai.OpenAI, stub) -> None:
    stream = client.completions.create(model=MODEL, prompt=STORY, max_tokens=400, temperature=0, stream=True)
    first = [next(iter(stream)) for _ in range(3)]
    stream.close()
    run = wait_done(stub, run_of(first[0].id))
    assert run.state == opb.RUN_STATE_DONE and run.outcome == opb.RUN_OUTCOME_STOPPED, run
    assert len(run.token_ids) < 400


def test_bad_json_and_oversized_bodies_are_refused_by_name(pool: LocalCluster, token: str) -> None:
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(pool.openai_url)

    def post(data: bytes, length: int | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        try:
            conn.putrequest("POST", f"{url.path}/chat/completions")
            conn.putheader("Authorization", f"Bearer {token}")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(data) if length is None else length))
            conn.endheaders(data)
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    status, body = post(b"{not json")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    # Refused on its declared length, before a byte of it is read.
    status, body = post(b"", length=2 << 20)
    assert status == 413 and body["error"]["code"] == "request_too_large"
