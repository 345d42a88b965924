"""gRPC glue: Unix-socket and TCP listeners with reflection and health on every server; the channel of
a client of a local service; ending a response stream read only in part."""

from __future__ import annotations

import contextlib
import grp
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

SWACTOR_GROUP = "swactor"
T = TypeVar("T")


def unix_target(path: Path) -> str:
    return f"unix:{path}"


@contextlib.asynccontextmanager
async def response_stream(call: Any) -> AsyncIterator[AsyncIterator[Any]]:
    """The messages of a grpc.aio response-streaming `call`, which is cancelled and its iterator closed
    on leaving, also when the caller stopped reading before the end.

    Why: grpc.aio's iterator is an async generator that references its call, and the call it: left
    suspended (a `return` or `break` inside `async for`, an exception), the pair is freed only by a
    cyclic garbage collection, and until then the call pins its connection open, even after
    `channel.close()`. The orchestrator's per-run WatchStage streams leaked one TCP connection per
    stage and run that way (docs/faults.md, load)."""
    messages = call.__aiter__()
    try:
        yield messages
    finally:
        call.cancel()  # a no-op once the call is done
        await messages.aclose()


class LocalClient:
    """An asyncio client of a local service over its Unix socket: it owns the channel, and `async with`
    (or `close()`) closes it."""

    def __init__(self, socket_path: Path) -> None:
        self._channel = grpc.aio.insecure_channel(unix_target(socket_path))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def prepare_unix_socket(path: Path) -> None:
    """Make the socket's directory and remove a stale socket left by a previous process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_socket():
        path.unlink()
    elif path.exists():
        raise FileExistsError(f"{path} exists and is not a socket; refusing to replace it")


def restrict_unix_socket(path: Path) -> None:
    """Only root and the swactor group may talk to a local service socket."""
    try:
        gid = grp.getgrnam(SWACTOR_GROUP).gr_gid
    except KeyError:
        gid = -1
    # Under systemd (Group=swactor) the socket is born in the group: no chown, which the units'
    # syscall filter refuses (@chown is part of @privileged).
    if gid >= 0 and path.stat().st_gid != gid:
        os.chown(path, -1, gid)
    os.chmod(path, 0o660)


def create_server(
    unix_socket: Path | None = None,
    tcp_address: str | None = None,
    *,
    service_names: Iterable[str] = (),
    server_credentials: grpc.ServerCredentials | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    options: Sequence[tuple[str, int | str]] = (),
) -> tuple[grpc.aio.Server, int | None, health.aio.HealthServicer]:
    """A grpc.aio server with reflection and health, listening where asked.

    Returns (server, bound TCP port or None, health servicer). Servicers are added by the caller
    before `await server.start()`; `tcp_address` may use port 0 to let tests pick a free port.
    `interceptors` see every call, reflection and health included (the orchestrator's token check);
    `options` are channel arguments (e.g. control_tls.keepalive_options).
    """
    server = grpc.aio.server(interceptors=list(interceptors) or None, options=list(options) or None)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*service_names, reflection.SERVICE_NAME, health.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    if unix_socket is not None:
        prepare_unix_socket(unix_socket)
        server.add_insecure_port(unix_target(unix_socket))
    port: int | None = None
    if tcp_address is not None:
        if server_credentials is None:
            port = server.add_insecure_port(tcp_address)
        else:
            port = server.add_secure_port(tcp_address, server_credentials)
        if port == 0:
            raise OSError(f"could not bind gRPC listener on {tcp_address}")
    return server, port, health_servicer


async def set_serving(health_servicer: health.aio.HealthServicer, service_names: Iterable[str]) -> None:
    for name in ["", *service_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
