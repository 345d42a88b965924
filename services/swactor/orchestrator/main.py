"""`swactor-orchestrator`: the run authority process (spec §9-13).

Opens the run store (marking runs a previous process left unfinished as faulted), loads the default
model's facts and tokenizer, follows the local membership service, and serves the Orchestrator gRPC
API with reflection and health on a Unix socket and, when configured, on TCP with TLS and a bearer
token (api/api_access.py). SIGTERM operator-stops active runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from swactor import __version__
from swactor.common.clock import wall_us
from swactor.common.config import ConfigError, load_section, read_config
from swactor.common.events import configure_logging, get_logger
from swactor.common.grpcio import restrict_unix_socket, set_serving
from swactor.common.ids import load_or_create_node_id
from swactor.common.objflags import MAX_PREFILL_CHUNK
from swactor.common.secret import read_secret
from swactor.common.systemd import notify_ready, notify_status, notify_stopping, start_watchdog
from swactor.modelfile.memory import KV_DTYPE_BYTES
from swactor.orchestrator.api.api_access import ApiAccess, ApiAccessError, init_access, load_access
from swactor.orchestrator.api.server import listeners
from swactor.orchestrator.api.service import SERVICE_NAME, OrchestratorServicer
from swactor.orchestrator.config import OrchestratorConfig
from swactor.orchestrator.fleet import node_events, reach_shell, reconcile_shell
from swactor.orchestrator.fleet.fleet import FleetError, Report, StageFleet, TokenEndpoints
from swactor.orchestrator.fleet.membership_client import follow_membership, follow_rtts
from swactor.orchestrator.fleet.reach import Probe, ReachConfig, ReachTracker
from swactor.orchestrator.fleet.reconcile import Leftover
from swactor.orchestrator.fleet.stage_fleet import StageControlFleet, mtls_channels
from swactor.orchestrator.models.distributor import Distributor
from swactor.orchestrator.models.models import ModelRegistry, ModelUnusable
from swactor.orchestrator.planning.placement import MAX_SLOTS_PER_STAGE
from swactor.orchestrator.planning.planner import RunPlan, StagePlan
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.manager import Limits, Orchestrator, RunDefaults
from swactor.orchestrator.runs.retention import RetentionPolicy
from swactor.orchestrator.runs.store import RunStore
from swactor.orchestrator.tokens.draft_model import DraftModel, DraftModelError
from swactor.orchestrator.tokens.token_endpoints import RingEndpointFactory
from swactor.v1 import common_pb2

EXIT_USAGE = 2
NO_SECRET = ("no cluster secret configured ([orchestrator].secret_file / --secret-file): the node control "
             "API cannot be reached, so no stage can be provisioned")


class NoSecretFleet:
    """Without the cluster secret nothing can be provisioned: refuse by name so a run faults at
    once with RUN_FAULT_PROVISIONING_REJECTED instead of hanging."""

    async def provision(self, plan: RunPlan, stage: StagePlan, report: Report) -> None:
        raise FleetError(common_pb2.RUN_FAULT_PROVISIONING_REJECTED, NO_SECRET)

    async def stop_stage(self, plan: RunPlan, stage: StagePlan) -> None:
        return None

    async def open_endpoints(self, plan: RunPlan, report: Report) -> TokenEndpoints:
        raise FleetError(common_pb2.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, NO_SECRET)


def build_fleet(cfg: OrchestratorConfig, node_id: int, models: ModelRegistry,
                distributor: Distributor | None = None) -> StageFleet:
    if cfg.secret_file is None:
        return NoSecretFleet()

    secret = read_secret(cfg.secret_file)
    if distributor is not None:
        sources = distributor.gguf_source
    else:  # no model server: every node holds the file at the orchestrator's path
        node_paths = dict(models.paths)
        if cfg.node_model_path is not None:
            node_paths[cfg.model_name] = cfg.node_model_path

        def sources(plan: RunPlan, report: Report) -> Path:
            return node_paths[plan.model.model_id].resolve()

    endpoints = RingEndpointFactory(local_ports(cfg, lambda detail: endpoints.forget(detail)),
                                    lease_timeout_s=cfg.arena_pressure_timeout_s)
    return StageControlFleet(mtls_channels(secret, node_id, keepalive_s=cfg.control_keepalive_s), sources,
                             endpoints=endpoints)


def reach_tracker(cfg: OrchestratorConfig) -> ReachTracker:
    try:
        return ReachTracker(ReachConfig(cfg.reach_timeout_s, cfg.reach_retry_s, cfg.reach_recheck_s, cfg.reach_tries))
    except ValueError as e:
        raise ConfigError(f"[orchestrator]: {e}") from None


def reach_channel(cfg: OrchestratorConfig, node_id: int):  # type: ignore[no-untyped-def]
    """The mutual-TLS channel a reachability probe handshakes over (None without the cluster secret: TCP only)."""
    if cfg.secret_file is None:
        return None
    from swactor.common import control_tls

    secret = read_secret(cfg.secret_file)

    def channel(p: Probe):  # type: ignore[no-untyped-def]
        return control_tls.channel(secret, node_id, p.control, p.node_id)

    return channel


def start_distribution(cfg: OrchestratorConfig, node_id: int, models: ModelRegistry):
    """The model server and the Distributor (None, None without a secret or with the server disabled)."""
    if cfg.secret_file is None or not cfg.model_server_address:
        return None, None
    from swactor.common import control_tls
    from swactor.distribution.server import FileTable, start_server

    files = FileTable()
    server, _ = start_server(cfg.model_server_address, files,
                             control_tls.model_server_context(read_secret(cfg.secret_file), node_id))
    node_paths = {cfg.model_name: cfg.node_model_path} if cfg.node_model_path is not None else {}
    distributor = Distributor(models, files, state_dir=cfg.state_dir,
                              cache_dir=cfg.model_cache_dir or cfg.state_dir / "model-cache", node_id=node_id,
                              server_port=server.port, advertise=cfg.model_server_advertise,
                              piece_bytes=cfg.manifest_piece_bytes, node_paths=node_paths,
                              stall_timeout_s=cfg.source_stall_timeout_s,
                              stages_fetch_from_source=cfg.stages_fetch_from_source)
    return server, distributor


async def judge_models(models: ModelRegistry) -> str | None:
    """Every configured model judged from its header; the first reason one cannot run, or None."""
    for name in sorted(models.sources, key=lambda n: n != models.default):
        try:
            loaded = await asyncio.to_thread(models.load, name)
        except ModelUnusable as e:
            return str(e)
        get_logger().info("model_judged", model=name, source=models.sources[name].describe(),
                          architecture=loaded.facts.architecture, layers=loaded.facts.num_layers,
                          chat_template_error=loaded.chat_template_error or None)
    return None


def local_ports(cfg: OrchestratorConfig, on_arena_lost: Callable[[str], None]):
    """Connects (on first use) to this host's arena-manager and edge-driver for the token endpoints;
    `on_arena_lost` when that arena-manager is gone (ArenaHold.on_end)."""

    async def connect():
        from swactor.arena import client as arena_client
        from swactor.edgeend.adapters import ArenaClientPort, EdgeDriverPort

        hold = await asyncio.to_thread(arena_client.connect_holder, cfg.arena_fd_socket)

        def lost(detail: str) -> None:
            hold.close()  # its memfd and connection; the mapping stays valid for runs still using it
            on_arena_lost(detail)

        hold.on_end(lost)
        client = arena_client.AsyncArenaClient(hold, cfg.arena_socket)
        driver = EdgeDriverPort(cfg.edge_socket, cfg.edge_wake_socket)
        return ArenaClientPort(client, requester="orchestrator"), driver, hold.map()

    return connect


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="swactor-orchestrator", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"swactor-orchestrator {__version__}")
    p.add_argument("--config", type=Path, help="host config file (default /etc/swactor/swactor.toml if present)")
    p.add_argument("--socket", help="gRPC Unix socket (default /run/swactor/orchestrator.sock)")
    p.add_argument("--tcp", dest="tcp_address",
                   help="TCP API address host:port, TLS + bearer token (default '': off, the Unix socket only)")
    p.add_argument("--tls-cert", dest="tls_cert", help="TCP API certificate (PEM)")
    p.add_argument("--tls-key", dest="tls_key", help="TCP API private key (PEM, not readable by others)")
    p.add_argument("--token-file", dest="token_file", help="TCP API bearer token (a 0600 file)")
    p.add_argument("--init-api-access", action="store_true",
                   help="create the TCP API's certificate, key and token where the config says (keeps existing "
                        "ones), print what was done as JSON, and exit")
    p.add_argument("--api-name", action="append", default=[], metavar="IP_OR_DNS",
                   help="with --init-api-access: a name operators dial, put in the certificate (repeatable)")
    p.add_argument("--state-dir", help="run store and node id directory (default /var/lib/swactor)")
    p.add_argument("--membership-socket", help="local membership service socket")
    p.add_argument("--model", dest="model_path", help="default model GGUF path")
    p.add_argument("--secret-file", dest="secret_file", help="cluster secret (node control mTLS)")
    p.add_argument("--pool-window", type=float, dest="pool_window_s", help="PoolReady stability window (s)")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> OrchestratorConfig:
    overrides = {k: getattr(args, k) for k in ("socket", "tcp_address", "state_dir", "membership_socket",
                                                "model_path", "pool_window_s", "secret_file", "tls_cert",
                                                "tls_key", "token_file")}
    return load_section(read_config(args.config), "orchestrator", OrchestratorConfig, **overrides)


def fsm_config(cfg: OrchestratorConfig, node_id: int) -> F.FsmConfig:
    return F.FsmConfig(
        orchestrator_node_id=node_id, pool_window_s=cfg.pool_window_s, max_seq_len_cap=cfg.max_seq_len,
        ring_ceiling_bytes=cfg.ring_ceiling_bytes, prefill_chunk=cfg.prefill_chunk,
        max_slots_per_stage=cfg.max_slots_per_stage, kv_dtype=cfg.kv_dtype, split_by_speed=cfg.split_by_speed,
        timeouts=cfg.timeouts(),
    )


def limits(cfg: OrchestratorConfig) -> Limits:
    for key in ("queue_depth", "max_request_bytes", "runs_max"):
        if getattr(cfg, key) < (1 if key == "max_request_bytes" else 0):
            raise ConfigError(f"[orchestrator].{key} must be {'positive' if key == 'max_request_bytes' else '>= 0'}, "
                              f"got {getattr(cfg, key)}")
    if cfg.readiness_min_fetch_bps < 0:
        raise ConfigError(f"[orchestrator].readiness_min_fetch_bps must be >= 0 (0 = any fetch that moves is waited "
                          f"for), got {cfg.readiness_min_fetch_bps}")
    if cfg.default_stages < 0:
        raise ConfigError(f"[orchestrator].default_stages must be >= 0 (0 = the fewest stages whose memory fits), "
                          f"got {cfg.default_stages}")
    if cfg.runs_max_age_s < 0:
        raise ConfigError(f"[orchestrator].runs_max_age_s must be >= 0 (0 = no age limit), got {cfg.runs_max_age_s}")
    if not 0 <= cfg.prefill_chunk <= MAX_PREFILL_CHUNK:
        raise ConfigError(f"[orchestrator].prefill_chunk must be 0..{MAX_PREFILL_CHUNK} (0 = the prompt in one object), "
                          f"got {cfg.prefill_chunk}")
    if not 1 <= cfg.max_slots_per_stage <= MAX_SLOTS_PER_STAGE:
        raise ConfigError(f"[orchestrator].max_slots_per_stage must be 1..{MAX_SLOTS_PER_STAGE} (run slots a stage is "
                          f"planned to hold), got {cfg.max_slots_per_stage}")
    if not 1 <= cfg.draft_slots <= MAX_SLOTS_PER_STAGE:
        raise ConfigError(f"[orchestrator].draft_slots must be 1..{MAX_SLOTS_PER_STAGE} (runs drafting with the draft "
                          f"model at once), got {cfg.draft_slots}")
    if cfg.draft_model is not None and not cfg.draft_model.is_absolute():
        raise ConfigError(f"[orchestrator].draft_model must be an absolute path to a GGUF file, got {cfg.draft_model}")
    if cfg.kv_dtype not in KV_DTYPE_BYTES:
        raise ConfigError(f"[orchestrator].kv_dtype must be one of {', '.join(map(repr, KV_DTYPE_BYTES))} (the stages' KV "
                          f"cache dtype), got {cfg.kv_dtype!r}")
    return Limits(queue_depth=cfg.queue_depth, max_request_bytes=cfg.max_request_bytes,
                  retention=RetentionPolicy(max_runs=cfg.runs_max, max_age_s=cfg.runs_max_age_s))


async def load_draft_model(cfg: OrchestratorConfig, models: ModelRegistry) -> DraftModel | None:
    """[orchestrator] draft_model loaded and compiled (DraftModelError names what is wrong); a warning for each
    served model whose vocabulary it does not share (their runs draft by prompt lookup)."""
    if cfg.draft_model is None:
        return None
    draft = DraftModel(cfg.draft_model, device=cfg.draft_device, slots=cfg.draft_slots, max_seq_len=cfg.max_seq_len,
                       prefill_chunk=cfg.prefill_chunk or 64, graph_cache_dir=cfg.state_dir / "draft-graphs",
                       kv_dtype=cfg.kv_dtype)
    await draft.load()
    for name in models.sources:
        model = models.loaded(name)
        if model is not None and (why := draft.refuses(model.tokenizer, name)):
            get_logger().warning("draft_model_unfit", model=name, detail=why)
    return draft


async def serve(cfg: OrchestratorConfig, access: ApiAccess | None = None) -> int:
    log = get_logger()
    node_id = load_or_create_node_id(cfg.state_dir)
    store = RunStore.in_state_dir(cfg.state_dir)
    leftovers = []
    for run in store.recover(wall_us()):
        log.warning("run_interrupted_by_restart", run_id=run.run_id, reason=run.reason, placed=len(run.placement))
        if run.placement:  # it may still hold stages and token edges: fleet/reconcile.py tears them down
            leftovers.append(Leftover.of(run))
    models = ModelRegistry(cfg.model_sources(), cfg.model_name)
    refused = await judge_models(models)
    if refused is not None:
        log.error("model_unusable", detail=refused)
        notify_status(f"refused to start: {refused}")
        print(f"swactor-orchestrator: {refused}", file=sys.stderr)
        return EXIT_USAGE
    loaded = models.get("")
    try:
        draft = await load_draft_model(cfg, models)
    except DraftModelError as e:
        log.error("draft_model_unusable", detail=str(e))
        notify_status(f"refused to start: {e}")
        print(f"swactor-orchestrator: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        model_server, distributor = start_distribution(cfg, node_id, models)
        fleet = build_fleet(cfg, node_id, models, distributor)
    except ValueError as e:  # SecretError
        print(f"swactor-orchestrator: {e}", file=sys.stderr)
        return EXIT_USAGE
    lister = node_channel = None
    if cfg.secret_file is not None:  # the node control API (mutual TLS) is dialled with the cluster secret
        from swactor.common import control_tls

        secret = read_secret(cfg.secret_file)

        def node_channel(node):
            return control_tls.channel(secret, node_id, node.control_endpoint, node.node_id)

    if distributor is not None:
        from swactor.orchestrator.models.model_listing import list_models

        async def lister(members):
            return await list_models(models, distributor, members, node_channel)

    from swactor.orchestrator.fleet.pool_metrics import pool_metrics

    async def metrics(members):
        return await pool_metrics(members, node_channel)

    orch = Orchestrator(models=models, fleet=fleet, store=store, fsm_config=fsm_config(cfg, node_id),
                        defaults=RunDefaults(stages=cfg.default_stages), model_lister=lister, limits=limits(cfg),
                        pool_metrics=metrics, draft_model=draft)
    if distributor is not None:
        distributor.members = lambda: orch.members
        for name in models.sources:  # manifests (and URL copies) are made before the first run needs them
            distributor.start(name)
    servers, port = listeners(cfg, access, OrchestratorServicer(orch))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for server, health_servicer in servers:
        await server.start()
        await set_serving(health_servicer, [SERVICE_NAME])
    restrict_unix_socket(cfg.socket)
    on_view, reconciling = reconcile_shell.start(
        leftovers if cfg.secret_file is not None else [], secret=read_secret(cfg.secret_file) if cfg.secret_file else b"",
        node_id=node_id, edge_socket=cfg.edge_socket, edge_wake_socket=cfg.edge_wake_socket,
        arena_socket=cfg.arena_socket, store=store, publish=orch.set_members,
        confirm_timeout_s=cfg.teardown_timeout_s, keepalive_s=cfg.control_keepalive_s)
    tracker = node_events.NodeEventTracker()
    reach = reach_shell.ReachShell(reach_tracker(cfg), on_view, channel=reach_channel(cfg, node_id),
                                   node_id=node_id)
    reaching = asyncio.create_task(reach.run(), name="reach")

    def on_members(view: tuple) -> None:
        node_events.publish(tracker.observe(view, wall_us()), store, orch.active_runs())
        reach.on_view(view)

    def on_rtts(rtts: dict) -> None:
        orch.set_rtts(rtts)
        reach.set_rtts(rtts)

    watcher = asyncio.create_task(follow_membership(cfg.membership_socket, on_members))
    rtts = asyncio.create_task(follow_rtts(cfg.membership_socket, on_rtts))
    log.info("orchestrator_serving", node_id=node_id, socket=str(cfg.socket), tcp_port=port,
             model=loaded.name, layers=loaded.facts.num_layers, fleet=type(fleet).__name__,
             model_server_port=model_server.port if model_server else None)
    notify_ready(f"serving {loaded.name} on {cfg.socket}")
    start_watchdog()
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5.0)
            orch.maintain()
            ready = orch.pool_status(1)
            notify_status(f"{len(orch.members)} member(s); pool {'ready' if ready.ready else 'not ready'}; "
                          f"{len(orch.active_runs())} active run(s), {orch.queued()} queued")
    finally:
        notify_stopping("stopping: operator-stopping active runs")
        await orch.shutdown()
        watcher.cancel()
        rtts.cancel()
        reaching.cancel()
        if reconciling is not None:
            reconciling.cancel()
        for server, _ in servers:
            await server.stop(grace=1.0)
        if model_server is not None:
            model_server.shutdown()
            model_server.server_close()
        if draft is not None:
            await draft.close()
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("orchestrator")
    try:
        cfg = build_config(args)
        cfg.model_sources()
        limits(cfg)
        reach_tracker(cfg)
        if args.init_api_access:
            print(json.dumps(init_access(cfg.tls_cert, cfg.tls_key, cfg.token_file, args.api_name)))
            return 0
        access = load_access(cfg.tls_cert, cfg.tls_key, cfg.token_file) if cfg.tcp_address else None
    except (ConfigError, ApiAccessError, OSError) as e:
        print(f"swactor-orchestrator: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(serve(cfg, access))
    except (OSError, ValueError) as e:
        print(f"swactor-orchestrator: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
