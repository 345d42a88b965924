"""The gateway's HTTP routes (Starlette, served by uvicorn): the OpenAI API, /health, /metrics (metrics.py), and the
bearer-token check.

Back-pressure: a stream's next chunk is produced only once the last one was handed to the socket (uvicorn pauses
`send` while the transport's buffer is full), and WatchRun is read only as fast as that; so a slow reader holds at
most a socket buffer and one gRPC window of its answer, and one that takes nothing for `send_timeout_s` is dropped
(its run stopped).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from swactor.common.events import get_logger
from swactor.gateway import answers, errors, shapes, status_page
from swactor.gateway.answers import Answer
from swactor.gateway.config import GatewayConfig
from swactor.gateway.errors import ApiError
from swactor.gateway.metrics import GatewayMetrics, RequestCounter
from swactor.gateway.pool_client import PoolClient
from swactor.gateway.requests import Endpoint, parse

OPEN_PATHS = ("/health", status_page.LOGIN_PATH)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
STARTED = int(time.time())

log = get_logger()


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers())


class BearerToken:
    """ASGI middleware: every request but OPEN_PATHS carries `Authorization: Bearer <token>`, compared in constant
    time (as SHA-256 digests, so not even its length leaks); else 401 before the route or the body is touched.
    A browser cannot send the header: the status pages (status_page.is_page) also take the cookie /login sets,
    compared the same way, and send a browser with neither to /login."""

    def __init__(self, app: ASGIApp, token: bytes) -> None:
        self.app = app
        self._want = hashlib.sha256(b"Bearer " + token).digest()
        self._want_cookie = hashlib.sha256(status_page.cookie_value(token)).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = dict(scope["headers"])
            presented = headers.get(b"authorization")
            if presented is None and status_page.is_page(scope["path"]):
                cookie = status_page.presented_cookie(headers)
                if cookie is None or not hmac.compare_digest(hashlib.sha256(cookie).digest(), self._want_cookie):
                    await status_page.to_login(scope["path"], scope["query_string"].decode("latin-1"))(
                        scope, receive, send)
                    return
                why = None
            elif presented is None:
                why = "missing bearer token: send the header 'Authorization: Bearer <token>'"
            elif not hmac.compare_digest(hashlib.sha256(presented).digest(), self._want):
                why = "wrong bearer token"
            else:
                why = None
            if why is not None:
                await error_response(errors.unauthorized(why))(scope, receive, send)
                return
        await self.app(scope, receive, send)


class EventStream(StreamingResponse):
    """Server-sent events that end when the client goes (whatever ASGI version the server speaks: the body is
    cancelled, and so its run stopped) or takes no chunk for `send_timeout_s`."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], send_timeout_s: float, on_close: Callable[[], None]) -> None:
        super().__init__(content, headers=SSE_HEADERS)
        self.send_timeout_s = send_timeout_s
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        sending_since: float | None = None

        async def timed_send(message: Any) -> None:  # no timer per chunk: one watcher looks now and then
            nonlocal sending_since
            sending_since = loop.time()
            await send(message)
            sending_since = None

        async def watch_sends() -> None:
            while sending_since is None or loop.time() - sending_since < self.send_timeout_s:
                await asyncio.sleep(self.send_timeout_s / 8)
            log.warning("gateway_slow_reader_dropped", send_timeout_s=self.send_timeout_s)

        tasks = [asyncio.ensure_future(c) for c in (self.stream_response(timed_send),
                                                    self.listen_for_disconnect(receive), watch_sends())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.on_close()


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


class Gateway:
    def __init__(self, cfg: GatewayConfig, client: PoolClient) -> None:
        self.cfg = cfg
        self.client = client
        self.open_requests = 0
        self.metrics = GatewayMetrics(client, lambda: self.open_requests)

    # ---- the request's envelope: size, concurrency, JSON ----

    async def _body(self, request: Request) -> Any:
        limit = self.cfg.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the request body is {declared} bytes, more than the {limit} accepted",
                           code="request_too_large")
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > limit:
                raise ApiError(413, f"the request body is more than the {limit} bytes accepted",
                               code="request_too_large")
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"the request body is not JSON: {e}", code="invalid_json") from None

    def _admit(self) -> None:
        if self.open_requests >= self.cfg.max_concurrent:
            raise errors.busy(f"the gateway is answering its most requests at once ({self.cfg.max_concurrent})", 1)

    # ---- routes ----

    async def health(self, request: Request) -> Response:
        try:
            pool = await self.client.pool()
        except ApiError as e:
            return JSONResponse({"status": "unavailable", "detail": e.message}, status_code=503)
        status = 200 if pool.pool_ready else 503
        return JSONResponse({"status": "ok" if pool.pool_ready else "unavailable", "pool_ready": pool.pool_ready,
                             "detail": pool.pool_detail}, status_code=status)

    async def models(self, request: Request) -> Response:
        return JSONResponse(shapes.model_list(await self.client.models(), STARTED))

    async def model(self, request: Request) -> Response:
        m = await self.client.model(request.path_params["name"])
        return JSONResponse({"id": m.name, "object": "model", "created": STARTED, "owned_by": shapes.OWNER})

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, Endpoint.CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, Endpoint.COMPLETION)

    async def _complete(self, request: Request, endpoint: Endpoint) -> Response:
        self._admit()
        self.open_requests += 1
        try:
            req = parse(endpoint, await self._body(request))
            answer = await answers.submit(self.client, req)
        except BaseException:
            self.open_requests -= 1
            raise
        if req.stream:
            return EventStream(self._stream(answer), self.cfg.send_timeout_s, on_close=lambda: self._close(answer))
        try:
            return await self._whole(answer, request)
        except ApiError as e:
            self.metrics.run_failed(answer, e)
            raise
        finally:
            self._close(answer)

    def _close(self, answer: Answer) -> None:
        self.open_requests -= 1
        answer.close()
        self.metrics.answer_closed(answer)

    async def _whole(self, answer: Answer, request: Request) -> Response:
        async def collect() -> str:
            return "".join([text async for text in answer.deltas()])

        collecting = asyncio.ensure_future(collect())
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait({collecting, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collecting.done():  # the client left: cancelling the answer stops its run
                collecting.cancel()
        try:
            text = await collecting
        except asyncio.CancelledError:
            return Response(status_code=499)  # nobody reads it
        return JSONResponse(shapes.whole(answer, text))

    async def _stream(self, answer: Answer) -> AsyncIterator[str]:
        if answer.request.endpoint is Endpoint.CHAT:
            yield sse(shapes.chunk(answer, first=True))
        try:
            async for text in answer.deltas():
                yield sse(shapes.chunk(answer, text))
        except ApiError as e:  # headers are gone: the error travels as an event, as OpenAI's API sends them
            log.warning("gateway_run_error", run_id=answer.run_id, status=e.status, code=e.code, detail=e.message)
            self.metrics.run_failed(answer, e)
            yield sse(e.body())
            return
        yield sse(shapes.chunk(answer, finish=True))
        if answer.request.include_usage:
            yield sse(shapes.usage_chunk(answer))
        yield sse("[DONE]")


async def _disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def build_app(cfg: GatewayConfig, client: PoolClient, token: bytes) -> ASGIApp:
    g = Gateway(cfg, client)

    async def api_error(request: Request, e: Exception) -> Response:
        assert isinstance(e, ApiError)
        return error_response(e)

    async def not_found(request: Request, e: Exception) -> Response:
        return error_response(errors.not_found(f"no route {request.method} {request.url.path}", code="unknown_url"))

    routes = [
        Route("/health", g.health, methods=["GET"]),
        Route("/v1/models", g.models, methods=["GET"]),
        Route("/v1/models/{name:path}", g.model, methods=["GET"]),
        Route("/v1/chat/completions", g.chat, methods=["POST"]),
        Route("/v1/completions", g.completions, methods=["POST"]),
        *status_page.routes(client, token),
        Route("/metrics", g.metrics.scrape, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error, 404: not_found})
    app.state.gateway = g
    return RequestCounter(BearerToken(app, token), g.metrics)
