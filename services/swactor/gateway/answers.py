"""One request's run, from its submission to its end as the client sees it: the text deltas (stop strings cut out),
then why it finished and its token counts, or an error.

The run belongs to its request: a stop string, a client gone or a cancelled request stops it at once (StopRun),
and the run is submitted `stop_when_unwatched`, so even a gateway that dies mid-answer leaves no run decoding.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from swactor.common.events import get_logger
from swactor.common.grpcio import response_stream
from swactor.gateway import errors
from swactor.gateway.errors import ApiError
from swactor.gateway.pool_client import PoolClient
from swactor.gateway.requests import OpenAiRequest
from swactor.gateway.stops import StopScanner
from swactor.v1 import common_pb2
from swactor.v1 import orchestrator_pb2 as opb

LENGTH_REASONS = ("max_tokens", "context_full")
# Faults that mean the pool could not take the run at all (nothing generated yet): the client may retry later.
POOL_FAULTS = (common_pb2.RUN_FAULT_NODE_UNAVAILABLE, common_pb2.RUN_FAULT_MEMBERSHIP_LOST)
STOP_STRING = "stop string"
CLIENT_GONE = "client gone"

log = get_logger()


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


@dataclass
class Answer:
    """A submitted run as one OpenAI answer. Iterate `deltas()` once; then `finish_reason` is "stop" or "length"
    (or `deltas()` raised an ApiError)."""

    client: PoolClient
    request: OpenAiRequest
    run_id: int
    model: str
    usage: Usage
    created: int = field(default_factory=lambda: int(time.time()))
    finish_reason: str | None = None
    first_token_s: float | None = None  # seconds from submission to the first token
    last_token_s: float | None = None  # seconds from submission to the latest token (metrics.py: time per token)
    _submitted_at: float = field(default_factory=time.monotonic)
    _ended: bool = False  # its run finished, or a StopRun went out
    _background: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def id(self) -> str:
        prefix = "chatcmpl" if self.request.endpoint.name == "CHAT" else "cmpl"
        return f"{prefix}-{self.run_id}"

    async def deltas(self) -> AsyncIterator[str]:
        scanner = StopScanner(self.request.stops)
        finished: opb.Run | None = None
        try:
            async with response_stream(self.client.watch(self.run_id)) as updates:
                async for u in updates:
                    if u.HasField("token"):
                        self.last_token_s = time.monotonic() - self._submitted_at
                        if self.first_token_s is None:
                            self.first_token_s = self.last_token_s
                        self.usage.completion_tokens += 1
                        text = scanner.feed(u.token.text)
                        if text:
                            yield text
                        if scanner.stopped:
                            self._stop(STOP_STRING)
                            self.finish_reason = "stop"
                            return
                    elif u.HasField("finished"):
                        finished = u.finished
                        self._ended = True
                        break
        except ApiError:
            raise
        except asyncio.CancelledError:
            self._stop(CLIENT_GONE)
            raise
        except Exception as e:  # the stream broke: the orchestrator went away mid-answer
            self._stop(CLIENT_GONE)
            raise errors.unavailable(f"the orchestrator's stream of run {self.run_id} broke: {e}",
                                     code="orchestrator_unavailable") from None
        if finished is None:
            self._stop(CLIENT_GONE)
            raise errors.unavailable(f"the stream of run {self.run_id} ended without an outcome",
                                     code="orchestrator_unavailable")
        if (tail := scanner.flush()):
            yield tail
        self.finish_reason = self._finish_reason(finished)

    def _finish_reason(self, run: opb.Run) -> str:
        if run.outcome == opb.RUN_OUTCOME_COMPLETED:
            return "length" if run.reason in LENGTH_REASONS else "stop"
        where = f"run {run.run_id} {opb.RunOutcome.Name(run.outcome).removeprefix('RUN_OUTCOME_').lower()}"
        why = f"{where}: {run.reason or 'no reason'}{f' ({run.detail})' if run.detail else ''}"
        if run.outcome == opb.RUN_OUTCOME_FAULTED and not run.token_ids and \
                run.reason in (common_pb2.RunFaultReason.Name(r) for r in POOL_FAULTS):
            raise errors.unavailable(why)
        code = "run_stopped" if run.outcome == opb.RUN_OUTCOME_STOPPED else "run_faulted"
        raise errors.server_error(why, code=code)

    def close(self) -> None:
        """The request is over: a run it did not see to its end is stopped (also one never watched at all)."""
        if not self._ended:
            self._stop(CLIENT_GONE)

    def _stop(self, detail: str) -> None:
        """StopRun without waiting for it: the request may be being cancelled, and the stop must still go out."""
        if self._ended:
            return
        self._ended = True
        log.info("gateway_run_stopping", run_id=self.run_id, detail=detail)
        task = asyncio.ensure_future(self.client.stop(self.run_id, detail))
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def submit(client: PoolClient, request: OpenAiRequest) -> Answer:
    """Checks what the orchestrator cannot (the model by name, the pool's readiness), fills in the defaults an
    OpenAI client expects, and submits the run."""
    model = await client.model(request.model)
    pool = await client.pool()
    if not pool.pool_ready:
        raise errors.unavailable(f"the pool is not ready: {pool.pool_detail}")
    submit = opb.SubmitRunRequest()
    submit.CopyFrom(request.submit)
    submit.model = model.name
    if not submit.max_tokens:  # OpenAI's default: as many as the context holds
        if not model.context_length:
            raise errors.unavailable(f"model {model.name} is not judged yet ({model.state}: {model.detail})",
                                     code="model_not_ready")
        submit.max_tokens = model.context_length
    resp = await client.submit(submit)
    log.info("gateway_run_submitted", run_id=resp.run_id, model=model.name, prompt_tokens=resp.prompt_tokens,
             queue_position=resp.queue_position, stream=request.stream, endpoint=request.endpoint.value)
    return Answer(client, request, resp.run_id, model.name, Usage(resp.prompt_tokens))
