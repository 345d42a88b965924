"""`swactor-edge`: the host's QUIC edge driver service (spec §23-25).

    swactor-edge --init-identity [--state-dir DIR]     # at install: key + certificate, prints fingerprint
    swactor-edge [--config F] [--socket S] [--bind host:port] [--peers-file F] ...

Readiness (sd_notify READY=1) once the QUIC endpoint is bound and the gRPC socket listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path

from swactor.common.config import ConfigError, load_section, read_config
from swactor.common.events import configure_logging, get_logger
from swactor.common.grpcio import create_server, restrict_unix_socket, set_serving
from swactor.common.ids import load_or_create_node_id
from swactor.common.systemd import notify_ready, notify_stopping, start_watchdog
from swactor.edge.config import EdgeConfig
from swactor.edge.identity import IdentityError, create_identity, default_paths, load_identity


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="swactor-edge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="TOML file (default /etc/swactor/swactor.toml if present)")
    p.add_argument("--socket", type=Path, help="gRPC Unix socket (default /run/swactor/edge.sock)")
    p.add_argument("--state-dir", type=Path, help="state directory (node id, edge identity)")
    p.add_argument("--bind", help="UDP host:port of the QUIC endpoint (default 0.0.0.0:7400)")
    p.add_argument("--advertise", help="host:port peers dial, when it differs from --bind")
    p.add_argument("--cert", type=Path, help="certificate PEM (default <state-dir>/edge/cert.pem)")
    p.add_argument("--key", type=Path, help="private key PEM (default <state-dir>/edge/key.pem)")
    p.add_argument("--peers-file", type=Path, help="static peer directory (TOML) instead of membership")
    p.add_argument("--membership-socket", type=Path)
    p.add_argument("--arena-socket", type=Path)
    p.add_argument("--arena-fd-socket", type=Path)
    p.add_argument("--wake-socket", type=Path)
    p.add_argument("--max-datagram-size", type=int, help="QUIC payload bytes per datagram (0 = path MTU)")
    p.add_argument("--uvloop", action="store_true", default=None, help="run on uvloop (optional package)")
    p.add_argument("--profile-out", type=Path, help="run under cProfile and write the stats here at exit")
    p.add_argument("--init-identity", action="store_true", help="create the node's edge key and certificate, then exit")
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> EdgeConfig:
    overrides = dict(
        socket=args.socket,
        state_dir=args.state_dir,
        bind=args.bind,
        advertise=args.advertise,
        cert=args.cert,
        key=args.key,
        peers_file=args.peers_file,
        membership_socket=args.membership_socket,
        arena_socket=args.arena_socket,
        arena_fd_socket=args.arena_fd_socket,
        wake_socket=args.wake_socket,
        max_datagram_size=args.max_datagram_size,
        use_uvloop=args.uvloop,
    )
    # Paths as the config file would spell them (load_section coerces strings).
    flags = {k: str(v) if isinstance(v, Path) else v for k, v in overrides.items()}
    return load_section(read_config(args.config), "edge", EdgeConfig, **flags)


def identity_paths(cfg: EdgeConfig) -> tuple[Path, Path]:
    cert, key = default_paths(cfg.state_dir)
    return cfg.cert or cert, cfg.key or key


def init_identity(cfg: EdgeConfig) -> int:
    node_id = load_or_create_node_id(cfg.state_dir)
    cert, key = identity_paths(cfg)
    if cert.exists() and key.exists():
        ident = load_identity(cert, key)
        created = False
    else:
        ident = create_identity(cert, key, node_id)
        created = True
    print(json.dumps({"node_id": node_id, "cert": str(cert), "fingerprint": ident.fingerprint, "created": created}))
    return 0


async def serve(cfg: EdgeConfig, stop: asyncio.Event) -> int:
    node_id = load_or_create_node_id(cfg.state_dir)
    # Before importing the driver modules: their module-level loggers bind the config at import.
    configure_logging("swactor-edge", node_id=node_id)
    from swactor.arena.client import EXIT_ARENA_LOST, ArenaHandoutError, AsyncArenaClient, connect_holder
    from swactor.edge.driver import Driver
    from swactor.edge.peers import MembershipPeerDirectory, PeerDirectory, StaticPeerDirectory
    from swactor.edge.ring_source import ArenaRingSource
    from swactor.edge.service import SERVICE_NAME, EdgeDriverServicer
    from swactor.edge.wakefd import WakeFdServer
    from swactor.v1 import edge_pb2_grpc

    log = get_logger()
    identity = load_identity(*identity_paths(cfg))
    directory: PeerDirectory = (
        StaticPeerDirectory(cfg.peers_file) if cfg.peers_file else MembershipPeerDirectory(cfg.membership_socket)
    )
    try:
        hold = connect_holder(cfg.arena_fd_socket)
    except ArenaHandoutError as e:
        log.error("edge.arena_unavailable", detail=str(e))
        print(f"swactor-edge: cannot get the arena from {cfg.arena_fd_socket}: {e}", file=sys.stderr)
        return 1
    rings = ArenaRingSource(hold, AsyncArenaClient(hold, cfg.arena_socket))
    driver = Driver(node_id=node_id, config=cfg, identity=identity, directory=directory, rings=rings)
    host, port = driver.start()
    hold.on_end(driver.arena_lost)  # the arena-manager died: retire once the owners stopped their edges
    advertise = cfg.advertise or f"{host}:{port}"
    wake = WakeFdServer(cfg.wake_socket, rings.wake)
    wake.start()
    server, _, health = create_server(cfg.socket, service_names=[SERVICE_NAME])
    edge_pb2_grpc.add_EdgeDriverServicer_to_server(EdgeDriverServicer(driver), server)
    await server.start()
    restrict_unix_socket(cfg.socket)
    await set_serving(health, [SERVICE_NAME])
    await directory.start(self_endpoint=advertise, self_fingerprint=identity.fingerprint)
    log.info(
        "edge.ready",
        endpoint=f"{host}:{port}",
        advertise=advertise,
        socket=str(cfg.socket),
        fingerprint=identity.fingerprint,
    )
    notify_ready(f"endpoint {host}:{port}; {driver.status_line()}")
    start_watchdog()
    retired = asyncio.ensure_future(driver.retired.wait())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([retired, stopping], return_when=asyncio.FIRST_COMPLETED)
    retired.cancel()
    stopping.cancel()
    # Retired: our rings belong to a dead arena's memfd; the service manager restarts us on the new one.
    rc = EXIT_ARENA_LOST if driver.retired.is_set() else 0
    notify_stopping("arena-manager gone" if rc else "stopping")
    log.info("edge.stopping", exit_status=rc, detail=driver.arena_gone or "")
    await server.stop(1.0)
    await driver.close()
    wake.close()
    await directory.close()
    await rings.close()
    hold.close()
    return rc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args)
        if args.init_identity:
            return init_identity(cfg)
        if cfg.use_uvloop:
            import uvloop  # optional; not a dependency (see docs/edge.md)

            uvloop.install()

        async def run() -> int:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            return await serve(cfg, stop)

        if args.profile_out is None:
            return asyncio.run(run())
        import cProfile

        profiler = cProfile.Profile()
        try:
            return profiler.runcall(asyncio.run, run())
        finally:
            profiler.dump_stats(str(args.profile_out))
    except (ConfigError, IdentityError, ValueError, OSError) as e:
        print(f"swactor-edge: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
