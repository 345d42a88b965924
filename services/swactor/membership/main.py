"""`swactor-membership`: the SWIM membership service of one host (spec §8-9).

Binds the gRPC Unix socket and the gossip socket, joins the seeds (retrying while alone), tells
systemd it is ready, keeps STATUS= showing member counts, and on SIGTERM leaves gracefully so
peers see "left", not "dead".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import sys
from pathlib import Path

import grpc

from swactor import __version__
from swactor.common.config import ConfigError, load_section, read_config
from swactor.common.events import configure_logging, get_logger
from swactor.common.grpcio import create_server, restrict_unix_socket, set_serving
from swactor.common.ids import load_or_create_node_id
from swactor.common.secret import SecretError, gossip_key, read_secret
from swactor.common.systemd import notify_ready, notify_status, notify_stopping, start_watchdog
from swactor.membership.config import MembershipConfig
from swactor.membership.gpus import detect_nvidia, parse_gpu
from swactor.membership.kinship_backend import KinshipBackend, route_engine_logs
from swactor.membership.metadata import MetadataError, check_endpoint, check_fingerprint, encode_tags
from swactor.membership.node import MembershipNode, NodeTimings
from swactor.membership.probe_timing import (
    ADVICE_FILE,
    ProbeTiming,
    load_advice,
    save_advice,
    starting_timing,
)
from swactor.membership.seed_rtt import seed_round_trips
from swactor.membership.service import SERVICE_NAME, MembershipServicer
from swactor.membership.swim import SwimSettings, SwimStartError
from swactor.membership.view import Counts
from swactor.v1 import membership_pb2 as pb
from swactor.v1 import membership_pb2_grpc as pb_grpc

EXIT_USAGE = 2
EXIT_INTERNAL = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="swactor-membership", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="host config file (default /etc/swactor/swactor.toml if present)")
    p.add_argument("--socket", type=Path, help="gRPC Unix socket (default /run/swactor/membership.sock)")
    p.add_argument("--state-dir", type=Path, help="where node_id is kept (default /var/lib/swactor)")
    p.add_argument("--bind", help="gossip host:port (default 0.0.0.0:7946)")
    p.add_argument("--advertise", help="gossip host:port peers should use")
    p.add_argument("--seed", action="append", dest="seeds", metavar="HOST:PORT", help="seed member (repeatable)")
    p.add_argument("--secret-file", type=Path, help="file holding the cluster secret")
    p.add_argument("--cluster", help="cluster label gossip is bound to (default swactor)")
    p.add_argument("--probe-interval", type=float, dest="probe_interval_s", help="seconds between probes")
    p.add_argument("--edge-endpoint", help="host:port of this node's QUIC edge endpoint")
    p.add_argument("--edge-cert", type=Path, help="edge TLS certificate (PEM or DER) to fingerprint")
    p.add_argument("--edge-cert-fingerprint", help="SHA-256 hex of the edge certificate's DER")
    p.add_argument("--control-endpoint", help="host:port of this node's control endpoint")
    p.add_argument("--gpu", action="append", dest="gpus", metavar="KIND:NAME:BYTES", help="GPU (repeatable)")
    p.add_argument("--no-gpu-autodetect", action="store_const", const=False, dest="gpu_autodetect",
                   help="do not ask nvidia-smi for the GPU inventory")
    p.add_argument("--software-version", help="gossiped software version (default: the package's)")
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> MembershipConfig:
    overrides = {k: getattr(args, k) for k in (
        "socket", "state_dir", "bind", "advertise", "seeds", "secret_file", "cluster", "probe_interval_s",
        "edge_endpoint", "edge_cert", "edge_cert_fingerprint", "control_endpoint", "gpus", "gpu_autodetect",
        "software_version",
    )}
    # load_section coerces overrides like file values, and a file gives paths as strings.
    overrides = {k: str(v) if isinstance(v, Path) else v for k, v in overrides.items()}
    return load_section(read_config(args.config), "membership", MembershipConfig, **overrides)


def _check_hostport(what: str, value: str, *, allow_wildcard: bool) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
        port_n = int(port)
    except ValueError:
        raise ConfigError(f"{what} must be IP:PORT, got {value!r}") from None
    if not sep or not 0 <= port_n < 65536:
        raise ConfigError(f"{what} must be IP:PORT with a port 0..65535, got {value!r}")
    if ip.is_unspecified and not allow_wildcard:
        raise ConfigError(f"{what} may not be a wildcard address: {value!r}")
    return host, port_n


def certificate_fingerprint(path: Path) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"edge certificate {path}: {e.strerror}") from None
    try:
        cert = x509.load_pem_x509_certificate(data) if b"-----BEGIN" in data else x509.load_der_x509_certificate(data)
    except ValueError as e:
        raise ConfigError(f"edge certificate {path} is not a PEM or DER X.509 certificate: {e}") from None
    return cert.fingerprint(hashes.SHA256()).hex()


def build_metadata(cfg: MembershipConfig, node_id: int) -> pb.NodeMetadata:
    fingerprint = cfg.edge_cert_fingerprint
    if cfg.edge_cert is not None:
        fingerprint = certificate_fingerprint(cfg.edge_cert)
    gpus = [parse_gpu(g) for g in cfg.gpus]
    if not gpus and cfg.gpu_autodetect:
        gpus = detect_nvidia()
    md = pb.NodeMetadata(
        node_id=node_id,
        software_version=cfg.software_version or __version__,
        edge_endpoint=check_endpoint("edge_endpoint", cfg.edge_endpoint),
        edge_cert_fingerprint=check_fingerprint(fingerprint),
        control_endpoint=check_endpoint("control_endpoint", cfg.control_endpoint),
        gpus=gpus,
        state=pb.NODE_STATE_BOOTING,
    )
    encode_tags(md)  # fails early, by name, if it cannot be gossiped
    return md


def swim_settings(cfg: MembershipConfig, node_id: int, key: bytes, md: pb.NodeMetadata,
                  timing: ProbeTiming | None = None) -> SwimSettings:
    """The engine's settings; its probe timings are `timing` (starting_probe_timing's) or else the configured ones."""
    timing = timing or ProbeTiming(cfg.probe_timeout_s, cfg.probe_interval_s)
    host, port = _check_hostport("bind", cfg.bind, allow_wildcard=True)
    advertise = cfg.advertise
    if advertise is not None:
        _check_hostport("advertise", advertise, allow_wildcard=False)
    elif port != 0 and not ipaddress.ip_address(host).is_unspecified:
        advertise = cfg.bind  # with port 0 the engine advertises the port the OS picked
    for seed in cfg.seeds:
        check_endpoint("seed", seed)
    return SwimSettings(
        name=str(node_id), bind=cfg.bind, advertise=advertise, seeds=list(cfg.seeds), cluster=cfg.cluster,
        key=key, meta=encode_tags(md),
        probe_interval_s=timing.probe_interval_s, probe_timeout_s=timing.probe_timeout_s,
        indirect_checks=cfg.indirect_checks, suspicion_mult=cfg.suspicion_mult,
        suspicion_max_mult=cfg.suspicion_max_mult, expected_confirmations=cfg.expected_confirmations,
        awareness_max=cfg.awareness_max, gossip_interval_s=cfg.gossip_interval_s, gossip_nodes=cfg.gossip_nodes,
        retransmit_mult=cfg.retransmit_mult, push_pull_interval_s=cfg.push_pull_interval_s,
    )


def starting_probe_timing(cfg: MembershipConfig, configured: ProbeTiming, seed_rtts: dict[str, float]) -> ProbeTiming:
    """The probe timings the engine starts with: the configured ones, or the longer ones that the round trip to the
    farthest of `seed_rtts` (seed_rtt.py) or this node's last run (the kept advice) calls for (probe_timing.py),
    said as membership_probe_timing_applied."""
    log = get_logger(component="membership")
    try:
        saved = load_advice(cfg.state_dir)
    except ValueError as e:  # a damaged file: start as configured, say so; the next advice replaces it
        log.warning("membership_probe_advice_unreadable", detail=str(e))
        saved = None
    farthest, seed_ms = max(seed_rtts.items(), key=lambda kv: kv[1], default=("", 0.0))
    running = starting_timing(configured, saved, seed_ms)
    if running != configured:
        from_seed = running == starting_timing(configured, None, seed_ms)
        log.warning("membership_probe_timing_applied", probe_timeout_s=round(running.probe_timeout_s, 3),
                    probe_interval_s=round(running.probe_interval_s, 3), configured_probe_timeout_s=configured.probe_timeout_s,
                    configured_probe_interval_s=configured.probe_interval_s,
                    reason="seed_rtt" if from_seed else "kept_advice",
                    source=farthest if from_seed else str(cfg.state_dir / ADVICE_FILE),
                    **({"seed_rtt_ms": round(seed_ms, 1)} if from_seed else {}))
    return running


async def measure_seeds(cfg: MembershipConfig) -> dict[str, float]:
    """The seeds' round trips before the engine starts (none with RTT sampling off), said as membership_seed_rtt."""
    if not cfg.seeds or cfg.rtt_interval_s == 0:
        return {}
    measured = await seed_round_trips(cfg.seeds)
    get_logger(component="membership").info(
        "membership_seed_rtt", rtt_ms={s: round(ms, 2) for s, ms in measured.items()},
        unanswered=[s for s in cfg.seeds if s not in measured])
    return measured


def status_line(c: Counts) -> str:
    return f"members: {c.alive} alive, {c.suspect} suspect, {c.dead} dead, {c.left} left"


async def serve(cfg: MembershipConfig, node_id: int) -> int:
    log = get_logger(component="membership")
    if cfg.rtt_interval_s < 0:
        raise ConfigError(f"[membership].rtt_interval_s must be >= 0 (0 turns RTT sampling off), got {cfg.rtt_interval_s:g}")
    md = build_metadata(cfg, node_id)
    key = gossip_key(read_secret(cfg.secret_file), cfg.cluster)
    configured = ProbeTiming(cfg.probe_timeout_s, cfg.probe_interval_s)
    running = starting_probe_timing(cfg, configured, await measure_seeds(cfg))
    settings = swim_settings(cfg, node_id, key, md, running)
    route_engine_logs()
    node = MembershipNode(
        KinshipBackend(settings), md, cfg.seeds,
        NodeTimings(cfg.join_retry_interval_s, cfg.departed_retention_s, cfg.leave_timeout_s, cfg.rtt_interval_s,
                    running, configured),
        on_change=lambda c: notify_status(status_line(c)),
        on_advice=lambda advice: save_advice(cfg.state_dir, advice),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await node.start()
    server: grpc.aio.Server | None = None
    try:
        server, _, health = create_server(cfg.socket, service_names=[SERVICE_NAME])
        pb_grpc.add_MembershipServicer_to_server(MembershipServicer(node, cfg.cluster), server)
        await server.start()
        restrict_unix_socket(cfg.socket)
        await set_serving(health, [SERVICE_NAME])
        notify_ready(status_line(node.view.counts()))
        start_watchdog()
        log.info("node_started", node_id=node_id, socket=str(cfg.socket), gossip_address=node.view.local().member.addr)
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(node.failed.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        notify_stopping("leaving the cluster" if stop.is_set() else f"failed: {node.failure}")
    finally:
        await node.stop(graceful=stop.is_set() or node.failed.is_set())
        if server is not None:
            await server.stop(grace=1.0)
            with contextlib.suppress(FileNotFoundError):
                cfg.socket.unlink()
    return EXIT_INTERNAL if node.failed.is_set() else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args)
        node_id = load_or_create_node_id(cfg.state_dir)
    except (ConfigError, ValueError, OSError) as e:
        print(f"swactor-membership: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging("membership", node_id=node_id)
    try:
        return asyncio.run(serve(cfg, node_id))
    except (ConfigError, SecretError, MetadataError, SwimStartError, ValueError, OSError) as e:
        get_logger(component="membership").error("membership_failed", reason=type(e).__name__, detail=str(e))
        print(f"swactor-membership: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
