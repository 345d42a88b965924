"""The gateway's client of the orchestrator, over its Unix socket: submit, watch and stop runs, and the pool's and
the models' state (each kept a moment, so a burst of requests asks the orchestrator once)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Generic, TypeVar

import grpc

from swactor.common.grpcio import LocalClient
from swactor.gateway import errors
from swactor.gateway.errors import ApiError
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

T = TypeVar("T")
CALL_TIMEOUT_S = 10.0
QUEUE_RETRY_AFTER_S = 5
# SubmitRuns sent at once. The orchestrator tokenizes a few prompts at a time and refuses more as RESOURCE_EXHAUSTED
# (tokens/prompting.py MAX_PENDING, 8): a burst of clients waits its turn here, a moment each, instead of being told
# the queue is full while it is not.
SUBMITS_AT_ONCE = 4
# The SubmitRunRequest fields the orchestrator names in its refusals, and the OpenAI field each one came from.
PARAMS = {"max_tokens": "max_tokens", "max_context": "max_tokens", "prompt_ids": "prompt", "prompt": "prompt",
          "messages": "messages", "seed": "seed", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
          "sampling": "temperature"}
_FIELD = re.compile(r"\b(" + "|".join(sorted(PARAMS, key=len, reverse=True)) + r")\b")


def refusal(e: grpc.aio.AioRpcError, what: str) -> ApiError:
    """An orchestrator refusal as the OpenAI error a client library understands."""
    code, detail = e.code(), e.details() or e.code().name
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        m = _FIELD.search(detail)
        return ApiError.bad_param(PARAMS[m.group(1)] if m else None, detail)  # type: ignore[arg-type]
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.busy(f"the run queue is full: {detail}", QUEUE_RETRY_AFTER_S)
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        return errors.unavailable(detail, code="model_not_ready")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return errors.unavailable(f"the orchestrator did not answer {what}: {detail}", code="orchestrator_unavailable")
    return errors.server_error(f"{what}: {code.name}: {detail}", code="orchestrator_error")


class _Kept(Generic[T]):
    """A value fetched at most once per `ttl_s`; concurrent askers of a stale value share one fetch."""

    def __init__(self, fetch: Callable[[], Awaitable[T]], ttl_s: float) -> None:
        self._fetch, self._ttl_s = fetch, ttl_s
        self._value: T | None = None
        self._at = -float("inf")
        self._pending: asyncio.Future[T] | None = None

    async def get(self) -> T:
        if self._value is not None and time.monotonic() - self._at < self._ttl_s:
            return self._value
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._fetch())
        pending = self._pending
        try:
            value = await asyncio.shield(pending)
        finally:
            if self._pending is pending and pending.done():
                self._pending = None
        self._value, self._at = value, time.monotonic()
        return value


class PoolClient(LocalClient):
    def __init__(self, socket_path: Path, models_ttl_s: float = 10.0, pool_ttl_s: float = 1.0) -> None:
        super().__init__(socket_path)
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self._channel)
        self._models = _Kept(self._list_models, models_ttl_s)
        self._pool = _Kept(self._list_nodes, pool_ttl_s)
        self._submitting = asyncio.Semaphore(SUBMITS_AT_ONCE)

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except grpc.aio.AioRpcError as e:
            raise refusal(e, what) from None

    async def _list_models(self) -> list[opb.ServedModel]:
        resp = await self._call("ListModels", self.stub.ListModels(opb.ListModelsRequest(), timeout=CALL_TIMEOUT_S))
        return list(resp.models)

    async def _list_nodes(self) -> opb.ListNodesResponse:
        return await self._call("ListNodes", self.stub.ListNodes(opb.ListNodesRequest(), timeout=CALL_TIMEOUT_S))

    async def models(self) -> list[opb.ServedModel]:
        return await self._models.get()

    async def pool(self) -> opb.ListNodesResponse:
        return await self._pool.get()

    async def host_metrics(self) -> opb.GetPoolMetricsResponse:
        """Every member's own figures (GetPoolMetrics), asked anew each time: counters, for a scrape."""
        return await self._call("GetPoolMetrics", self.stub.GetPoolMetrics(opb.GetPoolMetricsRequest(),
                                                                           timeout=CALL_TIMEOUT_S))

    async def model(self, name: str) -> opb.ServedModel:
        """The served model a request names ("" = the default), or 404 naming the ones served."""
        served = await self.models()
        for m in served:
            if m.name == name or (not name and m.is_default):
                return m
        names = ", ".join(m.name for m in served) or "none"
        raise errors.not_found(f"the model {name!r} is not served here (served: {names})", param="model",
                               code="model_not_found")

    async def submit(self, req: opb.SubmitRunRequest) -> opb.SubmitRunResponse:
        async with self._submitting:
            return await self._call("SubmitRun", self.stub.SubmitRun(req, timeout=CALL_TIMEOUT_S))

    def watch(self, run_id: int) -> grpc.aio.UnaryStreamCall:
        return self.stub.WatchRun(opb.WatchRunRequest(run_id=run_id, omit_object_events=True))

    async def stop(self, run_id: int, detail: str) -> None:
        # Refused when the run is already over (NOT_FOUND / FAILED_PRECONDITION), or the orchestrator is gone with it.
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.stub.StopRun(opb.StopRunRequest(run_id=run_id, detail=detail), timeout=CALL_TIMEOUT_S)

    async def runs(self, limit: int = 50) -> list[opb.Run]:
        resp = await self._call("ListRuns", self.stub.ListRuns(opb.ListRunsRequest(limit=limit), timeout=CALL_TIMEOUT_S))
        return list(resp.runs)
