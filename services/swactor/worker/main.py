"""swactor-worker: the gpu-worker service (spec §8, §12, §14, §26-31).

Boot: read the cluster secret and node id, receive the arena memfd from the arena-manager, start
the compute process (WorkerReady), follow the edge-driver, serve StageControl over mutual TLS,
then report NodeAvailable to membership.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from swactor.common.config import ConfigError, load_section, read_config
from swactor.common.events import configure_logging, get_logger
from swactor.common.grpcio import create_server, set_serving
from swactor.common.ids import load_or_create_node_id
from swactor.common.systemd import notify_ready, notify_status, notify_stopping, start_watchdog
from swactor.v1 import stage_pb2_grpc
from swactor.worker.config import WorkerConfig


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="swactor-worker", description=__doc__)
    p.add_argument("--config", type=Path)
    p.add_argument("--control-address")
    p.add_argument("--orchestrator-node-id", type=int)
    p.add_argument("--secret-file", type=Path)
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--device")
    p.add_argument("--compute-threads", type=int, help="CPU cores of the compute kernels (0 = auto)")
    return p.parse_args(argv)


def fetch_pool(cfg: WorkerConfig, secret: bytes, node_id: int):
    """The weights cache and its fetches from the orchestrator's model server (mutual TLS as this node), or from a
    URL source's own http(s) URL when the plan names one (FetchPool's default: the default trust store)."""
    from swactor.common import control_tls
    from swactor.distribution.cache import WeightsCache
    from swactor.distribution.fetcher import Target
    from swactor.distribution.stagefetch import FetchPool

    ctx = control_tls.model_client_context(secret, node_id)
    cache = WeightsCache(cfg.weights_cache_dir or cfg.state_dir / "weights", cfg.weights_cache_bytes)
    return FetchPool(cache, lambda url, tls_name: Target(url, ctx, tls_name or None),
                     stall_timeout_s=cfg.weights_stall_timeout_s, lanes=cfg.weights_connections)


async def serve(cfg: WorkerConfig) -> int:
    from swactor.common.secret import read_secret

    secret = read_secret(cfg.secret_file)
    node_id = load_or_create_node_id(cfg.state_dir)
    async with contextlib.AsyncExitStack() as local:  # the local services' connections, closed last
        return await _serve(cfg, secret, node_id, local)


async def _serve(cfg: WorkerConfig, secret: bytes, node_id: int, local: contextlib.AsyncExitStack) -> int:
    import swactor_ring
    from swactor.arena.client import EXIT_ARENA_LOST, AsyncArenaClient, connect_holder
    from swactor.common import control_tls
    from swactor.edgeend.adapters import ArenaClientPort, EdgeDriverPort
    from swactor.membership.gpus import compute_device, detect_nvidia
    from swactor.worker.ctl import GpuWorkerCtl
    from swactor.worker.ctl_fsm import CtlCore
    from swactor.worker.devices import DeviceMembership, StageDevices, stage_device_names
    from swactor.worker.host_metrics import HostSources
    from swactor.worker.membership import MembershipClientPort
    from swactor.worker.node import StageNode
    from swactor.worker.service import SERVICE_NAME, StageControlServicer
    from swactor.worker.stage_memory import HOST_KINDS, advertised_memory

    log = get_logger(component="worker")
    configured = cfg.device
    cfg = dataclasses.replace(cfg, device=compute_device(configured))
    devices = stage_device_names(cfg.device, cfg.stage_devices, len(detect_nvidia()) if cfg.stage_devices == 0 else 0)
    log.info("worker_compute_device", device=cfg.device, source="config" if configured else "detected",
             stage_devices=devices)
    hold = local.enter_context(connect_holder(cfg.arena_fd_socket))
    hold.map()  # ArenaReady (§8): mapped in this process before the worker maps it too
    arena = await local.enter_async_context(AsyncArenaClient(hold, cfg.arena_socket))
    shared_host = cfg.device.upper().partition(":")[0] in HOST_KINDS and len(devices) > 1
    threads = cfg.compute_threads or (max(1, min(len(os.sched_getaffinity(0)), 8) // len(devices)) if shared_host
                                      else 0)
    # Each compute process inherits our arena hand-out connection too: the arena then counts this
    # holder alive while a child still touches its rings, even if this service dies first.
    ctls = [GpuWorkerCtl(CtlCore(hold.arena_len, swactor_ring.RING_VERSION, cfg.backend(device, threads),
                                 init_timeout_s=cfg.init_timeout_s, stop_timeout_s=cfg.stop_timeout_s),
                         hold.fd, extra_fds=(hold.connection_fileno(),)) for device in devices]
    driver = await local.enter_async_context(EdgeDriverPort(cfg.edge_socket, cfg.edge_wake_socket))
    stage_memory = functools.partial(_stage_memory, devices, cfg.memory_bytes, cfg.device_memory_limit_bytes,
                                     advertised_memory)
    membership = await local.enter_async_context(MembershipClientPort(cfg.membership_socket, stage_memory,
                                                                      len(devices)))
    per_device = DeviceMembership(membership, len(devices))
    weights = fetch_pool(cfg, secret, node_id)
    stage_devices = StageDevices([
        StageNode(node_id, ctl, ArenaClientPort(arena), driver.for_new_owner() if index else driver,
                  per_device.device(index), control_endpoint=cfg.advertise_control or cfg.control_address,
                  orchestrator_node_id=cfg.orchestrator_node_id or None,
                  weights=weights, lease_window_s=cfg.control_lease_s,
                  arena_pressure_timeout_s=cfg.arena_pressure_timeout_s, batch_gather_s=cfg.batch_gather_ms / 1000,
                  device_index=index, step_grants=cfg.step_grants)
        for index, ctl in enumerate(ctls)])
    server, port, health = create_server(tcp_address=cfg.control_address, service_names=[SERVICE_NAME],
                                         server_credentials=control_tls.server_credentials(secret, node_id),
                                         options=control_tls.keepalive_options(cfg.control_keepalive_s, server=True))
    host = HostSources(node_id, arena.stats, driver.status, lambda: weights.received_bytes, stage_devices.steps)
    stage_pb2_grpc.add_StageControlServicer_to_server(StageControlServicer(stage_devices, host), server)
    await server.start()
    for node in stage_devices.nodes:
        node.publish_speed = membership.set_step_speed  # gossiped: the orchestrator places layers by it
        await node.start()
    # the arena-manager died: fault the runs, tear down, retire (exit, restarted)
    hold.on_end(stage_devices.arena_lost)
    keeper = asyncio.create_task(membership.keep_published())  # re-says our state after a membership restart
    await set_serving(health, [SERVICE_NAME])
    log.info("worker_service_started", node_id=node_id, control_port=port, stage_devices=len(devices))
    notify_ready(f"node {node_id}: control on port {port}")
    start_watchdog()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and not stage_devices.retired:
        workers = ",".join(ctl.state.value for ctl in ctls)
        notify_status(f"node {node_id}: available={stage_devices.available} worker={workers}")
        waits = [asyncio.ensure_future(stop.wait()),
                 *(asyncio.ensure_future(node.retired.wait()) for node in stage_devices.nodes)]
        await asyncio.wait(waits, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    # Retired: this process and its compute processes mapped a dead arena's memfd; the service manager
    # (Restart=on-failure) starts us again, on the new arena.
    rc = EXIT_ARENA_LOST if stage_devices.retired else 0
    notify_stopping("arena-manager gone" if rc else "shutting down")
    log.info("worker_service_stopping", exit_status=rc, detail=stage_devices.nodes[0].health.arena_gone or "")
    keeper.cancel()
    from swactor.worker.process import wire

    for ctl in ctls:
        ctl.send(wire.ShutdownWorker("AbortInFlight"))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(ctl.wait_exited() for ctl in ctls)), timeout=cfg.stop_timeout_s)
    for ctl in ctls:
        await ctl.close()
    await server.stop(grace=2)
    for node in stage_devices.nodes:
        await node.close()
    return rc


def _stage_memory(devices: list[str], budget: int, limit: int, measure: Callable[..., int]) -> int:
    """What each stage device offers a stage: the configured budget, else the least any device measures; several
    devices on the host's own memory (CPU) share it out."""
    if budget > 0:
        return budget
    least = min(measure(device, 0, limit=limit) for device in set(devices))
    return least // devices.count(devices[0]) if len(set(devices)) == 1 else least


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging("swactor-worker")
    try:
        cfg = load_section(read_config(args.config), "worker", WorkerConfig,
                           control_address=args.control_address, orchestrator_node_id=args.orchestrator_node_id,
                           secret_file=args.secret_file, state_dir=args.state_dir, device=args.device,
                           compute_threads=args.compute_threads)
    except ConfigError as e:
        print(f"swactor-worker: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(asyncio.run(serve(cfg)))
    except Exception as e:  # boot failure: name it, no traceback (the unit restarts us)
        get_logger(component="worker").error("worker_boot_failed", detail=f"{type(e).__name__}: {e}")
        print(f"swactor-worker: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
