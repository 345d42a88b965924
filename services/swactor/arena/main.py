"""`swactor-arena`: boot the arena, serve gRPC and the fd hand-out, stop on SIGTERM.

    swactor-arena [--config PATH] [--socket PATH] [--fd-socket PATH] [--state-dir DIR]
                  [--ceiling-bytes N]

READY=1 goes to systemd only after the memfd is created, truncated and mapped and both sockets
listen; outside systemd the same happens without the notifications.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from swactor.arena.config import ArenaConfig
from swactor.arena.journal import log
from swactor.arena.memory import ArenaBootError
from swactor.arena.node import ArenaNode
from swactor.arena.service import SERVICE_NAME, add_to_server
from swactor.common import systemd
from swactor.common.config import ConfigError, load_section, read_config
from swactor.common.events import configure_logging
from swactor.common.grpcio import create_server, restrict_unix_socket, set_serving


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="swactor-arena", description="The host's memfd arena and its ring leases."
    )
    p.add_argument("--config", type=Path, help="TOML file (default /etc/swactor/swactor.toml if present)")
    p.add_argument("--socket", help="gRPC Unix socket (default /run/swactor/arena.sock)")
    p.add_argument("--fd-socket", help="fd hand-out socket (default /run/swactor/arena-fd.sock)")
    p.add_argument("--state-dir", help="state directory (default /var/lib/swactor)")
    p.add_argument("--ceiling-bytes", type=int, help="sparse arena size in bytes (default 64 GiB)")
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> ArenaConfig:
    # Path flags stay strings here: load_section coerces them exactly like TOML values.
    return load_section(
        read_config(args.config),
        "arena",
        ArenaConfig,
        socket=args.socket,
        fd_socket=args.fd_socket,
        state_dir=args.state_dir,
        ceiling_bytes=args.ceiling_bytes,
    )


async def serve(cfg: ArenaConfig, stop: asyncio.Event) -> int:
    node = ArenaNode(cfg)
    try:
        node.boot()
    except ArenaBootError as e:
        log().error("arena_boot_failed", reason="RUN_FAULT_ARENA_BOOT_FAILED", detail=str(e))
        systemd.notify_status(f"failed: {e}")
        return 1
    server, _, health = create_server(cfg.socket, service_names=[SERVICE_NAME])
    add_to_server(server, node)
    try:
        await server.start()
        restrict_unix_socket(cfg.socket)
        await node.start_handout()
    except (OSError, RuntimeError) as e:
        log().error("arena_boot_failed", reason="RUN_FAULT_ARENA_BOOT_FAILED", detail=f"listen: {e}")
        systemd.notify_status(f"failed: cannot listen: {e}")
        await server.stop(None)
        await node.close()
        return 1
    await set_serving(health, [SERVICE_NAME])
    log().info(
        "arena_ready",
        socket=str(cfg.socket),
        fd_socket=str(cfg.fd_socket),
        ceiling_bytes=cfg.ceiling_bytes,
        state_dir=str(cfg.state_dir),
    )
    systemd.notify_ready(node.status_line())
    systemd.start_watchdog()
    await stop.wait()
    node.shutdown("stop signal")
    systemd.notify_stopping(node.status_line())
    await server.stop(cfg.shutdown_grace_s)
    await node.close()
    log().info("arena_stopped")
    return 0


async def _run(cfg: ArenaConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return await serve(cfg, stop)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args)
    except ConfigError as e:
        print(f"swactor-arena: {e}", file=sys.stderr)
        return 2
    configure_logging("swactor-arena")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_run(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
