"""`swactor-gateway`: the pool's OpenAI-compatible HTTP API (docs/operations.md "OpenAI API").

A client of the orchestrator over its Unix socket, serving HTTP with uvicorn on [gateway].address: loopback unless
the operator names another address, and then only over TLS. Every request but /health carries the bearer token
from [gateway].token_file. SIGTERM stops taking requests, stops the runs of the answers still open, and exits.

    swactor-gateway --init-token            # installer: make the token file if there is none
    swactor-gateway --init-tls --tls-name 10.0.0.2 --tls-name gw.example   # and a self-signed pair for TLS
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import uvicorn

from swactor.common.config import ConfigError, load_section, read_config
from swactor.common.events import configure_logging, get_logger
from swactor.common.systemd import notify_ready, notify_stopping, start_watchdog
from swactor.gateway.app import build_app
from swactor.gateway.config import GatewayConfig
from swactor.gateway.pool_client import PoolClient
from swactor.orchestrator.api.api_access import (
    ApiAccessError,
    create_key_pair,
    ensure_token,
    load_key_pair,
    read_token,
)

EXIT_USAGE = 2
# Seconds open streams get to finish at SIGTERM before they are cancelled (and their runs stopped).
GRACEFUL_STOP_S = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="swactor-gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="host config file (default /etc/swactor/swactor.toml if present)")
    p.add_argument("--address", help="HOST:PORT to serve HTTP on (default 127.0.0.1:8000)")
    p.add_argument("--orchestrator-socket", type=Path, help="the orchestrator's Unix socket")
    p.add_argument("--token-file", type=Path, help="the bearer token clients must send (0600)")
    p.add_argument("--init-token", action="store_true", help="make the token file if there is none, say so, exit")
    p.add_argument("--init-tls", action="store_true",
                   help="make [gateway].tls_cert and tls_key (self-signed, for --tls-name) if neither exists, exit")
    p.add_argument("--tls-name", action="append", default=[], metavar="IP_OR_DNS",
                   help="with --init-tls: a name clients dial (repeatable)")
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> GatewayConfig:
    overrides = {k: getattr(args, k) for k in ("address", "orchestrator_socket", "token_file")}
    overrides = {k: str(v) if isinstance(v, Path) else v for k, v in overrides.items()}
    cfg = load_section(read_config(args.config), "gateway", GatewayConfig, **overrides)
    cfg.check()
    return cfg


def uvicorn_config(cfg: GatewayConfig, app) -> uvicorn.Config:
    host, port = cfg.host_port()
    tls = {}
    if cfg.tls_cert is not None and cfg.tls_key is not None:
        load_key_pair(cfg.tls_cert, cfg.tls_key)  # names a bad pair; uvicorn would only fail inside ssl
        tls = {"ssl_certfile": str(cfg.tls_cert), "ssl_keyfile": str(cfg.tls_key)}
    return uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="off",
                          timeout_graceful_shutdown=GRACEFUL_STOP_S, server_header=False, **tls)


async def serve(cfg: GatewayConfig, token: bytes) -> int:
    log = get_logger()
    client = PoolClient(cfg.orchestrator_socket)
    server = uvicorn.Server(uvicorn_config(cfg, build_app(cfg, client, token)))
    serving = asyncio.ensure_future(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if serving.done():  # the port is taken, say (uvicorn logged why)
        await client.close()
        return 1
    port = server.servers[0].sockets[0].getsockname()[1] if server.servers else cfg.host_port()[1]
    scheme = "https" if cfg.tls_cert else "http"
    log.info("gateway_serving", address=cfg.address, port=port, tls=cfg.tls_cert is not None,
             orchestrator_socket=str(cfg.orchestrator_socket))
    notify_ready(f"OpenAI API on {scheme}://{cfg.host_port()[0]}:{port}/v1")
    start_watchdog()
    await serving
    notify_stopping("stopping")
    await client.close()
    log.info("gateway_stopped")
    return 0


def init_tls(cfg: GatewayConfig, names: list[str]) -> int:
    """A self-signed key pair where the config names one and neither file exists; an existing pair is checked."""
    if cfg.tls_cert is None or cfg.tls_key is None:
        raise ConfigError("--init-tls needs [gateway].tls_cert and tls_key set")
    if cfg.tls_cert.exists() or cfg.tls_key.exists():
        load_key_pair(cfg.tls_cert, cfg.tls_key)  # both there and matching, or named
        print(f"kept {cfg.tls_cert}")
        return 0
    fingerprint = create_key_pair(cfg.tls_cert, cfg.tls_key, names, common_name="swactor OpenAI API gateway")
    print(f"made {cfg.tls_cert} (SHA-256 {fingerprint})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("swactor-gateway")
    try:
        cfg = load_config(args)
        if args.init_token:
            made = ensure_token(cfg.token_file)
            print(f"{'made' if made else 'kept'} {cfg.token_file}")
            return 0
        if args.init_tls:
            return init_tls(cfg, args.tls_name)
        token = read_token(cfg.token_file)
    except (ConfigError, ApiAccessError) as e:
        print(f"swactor-gateway: {e}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(serve(cfg, token))


if __name__ == "__main__":
    sys.exit(main())
