"""OpenAI request bodies: what is accepted becomes the SubmitRunRequest it means; what is refused names its field."""

from __future__ import annotations

import pytest

from swactor.gateway.errors import ApiError
from swactor.gateway.requests import Endpoint, parse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refused(endpoint: Endpoint, body: object) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(endpoint, body)
    assert e.value.status == 400
    return e.value


def test_chat_request_becomes_messages_and_sampling() -> None:
    r = parse(Endpoint.CHAT, {**CHAT, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "seed": -1,
                              "stop": "x", "stream": True, "stream_options": {"include_usage": True}, "user": "u",
                              "speculate": 5})
    s = r.submit
    assert s.speculate == 5
    assert [(m.role, m.content) for m in s.messages.messages] == [("user", "hi")]
    assert s.max_tokens == 7 and s.sampling.temperature == 0 and s.sampling.top_p == 0.5
    assert s.sampling.seed == 2**64 - 1  # the same 64 bits
    assert s.stop_when_unwatched and s.resume and r.stops == ("x",) and r.stream and r.include_usage


def test_defaults_follow_openai() -> None:
    s = parse(Endpoint.CHAT, CHAT).submit
    assert s.sampling.temperature == 1.0 and s.sampling.top_p == 1.0
    assert s.max_tokens == 0  # filled in from the model's context by answers.submit
    assert not s.sampling.HasField("seed")


def test_text_parts_are_joined_and_developer_is_system() -> None:
    r = parse(Endpoint.CHAT, {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                           {"type": "text", "text": "b"}]}]})
    assert [(m.role, m.content) for m in r.submit.messages.messages] == [("system", "ab")]


def test_completion_prompt_is_raw_and_token_ids_go_as_ids() -> None:
    r = parse(Endpoint.COMPLETION, {"prompt": "Once", "max_tokens": 3})
    assert r.submit.prompt == "Once" and r.submit.raw
    r = parse(Endpoint.COMPLETION, {"prompt": [1, 2, 3]})
    assert list(r.submit.prompt_ids.ids) == [1, 2, 3]
    assert parse(Endpoint.COMPLETION, {"prompt": ["one"]}).submit.prompt == "one"


@pytest.mark.parametrize(("endpoint", "body", "param"), [
    (Endpoint.CHAT, {**CHAT, "n": 2}, "n"),
    (Endpoint.CHAT, {**CHAT, "temperature": 2.5}, "temperature"),
    (Endpoint.CHAT, {**CHAT, "temperature": "hot"}, "temperature"),
    (Endpoint.CHAT, {**CHAT, "top_p": -0.1}, "top_p"),
    (Endpoint.CHAT, {**CHAT, "max_tokens": 0}, "max_tokens"),
    (Endpoint.CHAT, {**CHAT, "max_completion_tokens": True}, "max_completion_tokens"),
    (Endpoint.CHAT, {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (Endpoint.CHAT, {**CHAT, "stop": [""]}, "stop"),
    (Endpoint.CHAT, {**CHAT, "logprobs": True}, "logprobs"),
    (Endpoint.CHAT, {**CHAT, "tools": [{"type": "function"}]}, "tools"),
    (Endpoint.CHAT, {**CHAT, "presence_penalty": 0.5}, "presence_penalty"),
    (Endpoint.CHAT, {**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    (Endpoint.CHAT, {**CHAT, "seed": 2**64}, "seed"),
    (Endpoint.CHAT, {**CHAT, "speculate": 17}, "speculate"),
    (Endpoint.CHAT, {"messages": []}, "messages"),
    (Endpoint.CHAT, {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    (Endpoint.CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    (Endpoint.CHAT, {**CHAT, "model": 3}, "model"),
    (Endpoint.COMPLETION, {"prompt": ""}, "prompt"),
    (Endpoint.COMPLETION, {"prompt": ["a", "b"]}, "prompt"),
    (Endpoint.COMPLETION, {"prompt": [1, -2]}, "prompt"),
    (Endpoint.COMPLETION, {"prompt": "x", "echo": True}, "echo"),
    (Endpoint.COMPLETION, {"prompt": "x", "best_of": 3}, "best_of"),
])
def test_refusals_name_the_field(endpoint: Endpoint, body: dict, param: str) -> None:
    e = refused(endpoint, body)
    assert e.param == param
    assert e.body()["error"]["param"] == param and e.body()["error"]["type"] == "invalid_request_error"


def test_a_body_that_is_not_an_object_is_refused() -> None:
    assert refused(Endpoint.CHAT, [1, 2]).code == "invalid_json"
