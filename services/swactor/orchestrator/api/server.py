"""The API's gRPC servers: the Unix socket's, and the TCP one with TLS and the bearer-token check when
the API is served on TCP (api_access.py). Each serves the Orchestrator servicer with reflection and health;
`serve()` in main.py starts and stops them."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health

from swactor.common.grpcio import create_server
from swactor.orchestrator.api.api_access import ApiAccess, BearerTokenInterceptor
from swactor.orchestrator.api.service import SERVICE_NAME, OrchestratorServicer, add_to_server
from swactor.orchestrator.config import OrchestratorConfig


def listeners(cfg: OrchestratorConfig, access: ApiAccess | None, servicer: OrchestratorServicer,
              ) -> tuple[list[tuple[grpc.aio.Server, health.aio.HealthServicer]], int | None]:
    """The Unix-socket server, plus (when `access` is given) the TCP one with TLS and the token
    check: two servers, because an interceptor sees every call of its server and the Unix socket's
    callers are authenticated by the socket's permissions instead. Returns them and the TCP port."""
    unix, _, unix_health = create_server(cfg.socket, service_names=[SERVICE_NAME])
    servers = [(unix, unix_health)]
    port = None
    if access is not None:
        tcp, port, tcp_health = create_server(None, cfg.tcp_address, service_names=[SERVICE_NAME],
                                              server_credentials=access.server_credentials(),
                                              interceptors=[BearerTokenInterceptor(access.token)])
        servers.append((tcp, tcp_health))
    for server, _ in servers:
        add_to_server(servicer, server)
    return servers, port
