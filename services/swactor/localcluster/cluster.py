"""LocalCluster: bring up N simulated hosts on this machine, wait for the pool, tear it all down.

Each host gets its own root dir (state/, run/, log/, swactor.toml), its own address (a loopback
address 127.X.Y.(i+1), or with `netns=True` and root a network namespace of its own) and its own
services as separate processes: arena-manager, membership (seeded at host 0; host 0 by the others across shaped
links), edge-driver, worker.
Host 0 also runs the orchestrator, sharing host 0's node id, arena and edge-driver for its token
endpoints. Only host 0 holds the model: every worker fetches its stage's byte ranges from the
orchestrator's model server into its own weights cache (docs/distribution.md). Readiness is evidence-based: gRPC health SERVING per service, membership shows every
node Available, the orchestrator's ListNodes shows them provisionable and the pool ready.

With `spec.links` every packet a host sends to another host gets the operator's delay, jitter, loss and rate
(linkshaping.py; namespaces only), from before the first service starts until after the last one stopped.

Whatever it creates is recorded with its reaper first (lifeline.py, reaper.py), so that the pool goes when its owner goes,
however the owner ends; `stop()` tears it down in order and then tells the reaper there is nothing left.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from swactor.common.events import get_logger
from swactor.common.ids import load_or_create_node_id
from swactor.localcluster import nat, ready
from swactor.localcluster.layout import (
    CONTROL_PORT,
    EDGE_PORT,
    MEMBERSHIP_PORT,
    MODEL_PORT,
    HostLayout,
    host_config,
    to_toml,
)
from swactor.localcluster.lifeline import Lifeline
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkshaping import LinkShaping, LinkShapingError, ShapedHost
from swactor.localcluster.linkshaping import unavailable as shaping_unavailable
from swactor.localcluster.nat import PUBLIC_OFFSET
from swactor.localcluster.netns import Netns
from swactor.localcluster.procs import Service, tail
from swactor.orchestrator.api.api_access import ensure_token
from swactor.v1 import arena_pb2, arena_pb2_grpc, edge_pb2, edge_pb2_grpc, orchestrator_pb2_grpc
from swactor.worker.stage_memory import advertised_memory

DEFAULT_MODEL = Path(__file__).resolve().parents[3] / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
log = get_logger(component="localcluster")


NAT_ENV = "SWACTOR_LOCALCLUSTER_NAT"


class ClusterError(RuntimeError):
    """A service failed to start or become ready; the message names it and quotes its log."""


@dataclass
class ClusterSpec:
    hosts: int = 3
    model: Path = DEFAULT_MODEL
    device: str = "CPU"  # tinygrad device of every worker's compute process
    # [worker].compute_threads of every host; 0 = every worker may use all of this machine's cores (at most 8): the
    # stages of a run compute one after another and an idle worker's compute threads sleep (measured, S=3 on 2 cores:
    # 36 ms of stage compute per token with 2 threads each vs 39 ms with 1; S=1: 22 vs 28 ms)
    compute_threads: int = 0
    # [orchestrator].max_slots_per_stage: runs in flight a stage holds. 1 here (the installed default is 8): each stage
    # compiles a graph per batch width (1, 2, 4, .. slots) at its load, about 15 s a width on a CPU the first time
    slots: int = 1
    # [orchestrator].readiness_timeout_s: a stage not ready this long faults the run with
    # RUN_FAULT_READINESS_TIMEOUT (production default 600 s: a hang here should look like a fault)
    readiness_timeout_s: float = 120.0
    netns: bool | None = None  # None: namespaces when root and `ip` exists, else loopback addresses
    # delay, jitter, loss and rate on every packet a host sends to another host (linkshaping.py; namespaces only)
    links: LinkConditions = field(default_factory=LinkConditions)
    # by host index: what packets arriving at that host get instead of `links` (a delay here alone makes a far host)
    host_links: dict[int, LinkConditions] = field(default_factory=dict)
    # every host behind NAT (nat.py; namespaces only): services advertise other ports than they bind, reachable only
    # through the mapping. None: SWACTOR_LOCALCLUSTER_NAT=1 in the environment turns it on for namespaced pools (the
    # whole suite's pool tests in that mode)
    nat: bool | None = None
    base_dir: Path | None = None  # default: a fresh temp dir, removed at teardown
    keep: bool = False  # keep the dir (logs) after teardown
    ceiling_bytes: int = 1 << 30
    pool_window_s: float = 0.5
    orchestrator: dict[str, object] = field(default_factory=dict)  # extra [orchestrator] keys
    workers: dict[int, dict[str, object]] = field(default_factory=dict)  # extra [worker] keys, by host index
    # extra keys of other tables on every host, e.g. {"edge": {"rendezvous_timeout": 5.0}}
    tables: dict[str, dict[str, object]] = field(default_factory=dict)
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 15.0
    # The OpenAI-compatible gateway (swactor-gateway) on 127.0.0.1:PORT of this machine, a client of h0's
    # orchestrator with a token file in the cluster dir; None: no gateway
    openai_port: int | None = None

    @property
    def shaped(self) -> bool:
        return self.links.shaped or any(c.shaped for c in self.host_links.values())


def _port_free(addr: str, port: int) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((addr, port))
            except OSError:
                return False
    return True


def _loopback_block(n: int) -> list[str]:
    """N loopback addresses 127.X.Y.1..N whose service ports are free (another cluster or test may
    run at the same time)."""
    rng = random.Random(os.getpid() ^ secrets.randbits(32))
    for _ in range(50):
        x, y = rng.randint(64, 250), rng.randint(1, 250)
        addrs = [f"127.{x}.{y}.{i + 1}" for i in range(n)]
        if all(_port_free(a, p) for a in addrs for p in (MEMBERSHIP_PORT, EDGE_PORT, CONTROL_PORT, MODEL_PORT)):
            return addrs
    raise ClusterError("no free loopback address block for the local cluster")


def check_model(path: Path) -> None:
    """Refuse a GGUF the workers would refuse (architecture, RoPE scaling, tensors, quant types, tokenizer)
    before anything starts: the orchestrator's judgement of its header."""
    from swactor.modelfile.judge import judge
    from swactor.modelfile.params import ModelRefused, open_header

    try:
        refusals = [str(r) for r in judge(open_header(path), path.stat().st_size)]
    except ModelRefused as e:
        refusals = [str(e)]
    if refusals:
        raise ClusterError(f"model {path} cannot be served: {'; '.join(refusals)}")


class LocalCluster:
    def __init__(self, spec: ClusterSpec, progress: Callable[[str], None] | None = None) -> None:
        if spec.hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {spec.hosts}")
        if spec.compute_threads < 0:
            raise ValueError(f"compute_threads must be >= 0 (0 = auto), got {spec.compute_threads}")
        if not spec.readiness_timeout_s > 0:
            raise ValueError(f"readiness_timeout_s must be > 0, got {spec.readiness_timeout_s}")
        if not spec.model.is_file():
            raise ClusterError(f"model {spec.model} does not exist (run `bash install.sh model` or `make model`)")
        check_model(spec.model)
        if bad := [h for h in spec.host_links if not 0 <= h < spec.hosts]:
            raise ValueError(f"host_links names host {bad[0]}, not one of the {spec.hosts} host(s)")
        if spec.openai_port is not None and not _port_free("127.0.0.1", spec.openai_port):
            raise ClusterError(f"127.0.0.1:{spec.openai_port} is taken: give the OpenAI API another port "
                               "(--openai-port) or none (--no-openai)")
        if spec.nat and spec.netns is False:
            raise ValueError("NAT needs network namespaces, not loopback addresses")
        if spec.shaped:
            if spec.netns is False:
                raise ValueError("link conditions need network namespaces, not loopback addresses")
            why = Netns.available() or shaping_unavailable()
            if why is not None:
                raise ClusterError(f"link conditions need network namespaces: {why}")
        self.spec = spec
        self.progress = progress or (lambda line: None)
        self.hosts: list[HostLayout] = []
        self.node_ids: list[int] = []
        self.services: list[Service] = []
        self.netns: Netns | None = None
        self.links: LinkShaping | None = None
        self.nat = False  # the hosts are behind NAT (nat.py): decided with the namespaces
        self.root: Path | None = None
        self._own_root = False
        self._lifeline: Lifeline | None = None
        self.teardown_report: dict[str, object] = {}
        self.openai_url: str | None = None  # the gateway's API, with its bearer token in openai_token_file
        self.openai_token_file: Path | None = None

    # --- context manager -------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- bring-up --------------------------------------------------------------------------------

    def start(self) -> None:
        spec = self.spec
        try:
            self._lifeline = Lifeline()
        except OSError as e:
            raise ClusterError(f"cannot start the local cluster's reaper: {e}") from None
        if spec.base_dir is None:
            self.root = Path(tempfile.mkdtemp(prefix="swl-"))  # short: Unix socket paths are <108 bytes
            self._own_root = True
            if not spec.keep:
                self._lifeline.own_dir(self.root)
        else:
            self.root = spec.base_dir
            self.root.mkdir(parents=True, exist_ok=True)
        use_netns = spec.netns if spec.netns is not None else Netns.available() is None
        if use_netns:
            why = Netns.available()
            if why is not None:
                raise ClusterError(f"network namespaces unavailable: {why}")
            self.netns = Netns(spec.hosts)
            self._lifeline.own_netns(self.netns.name)  # before the first one exists: no window without a record
            self.netns.create()
            addrs = self.netns.addrs
        else:
            addrs = _loopback_block(spec.hosts)
        self.nat = self.netns is not None and (spec.nat if spec.nat is not None else
                                               os.environ.get(NAT_ENV) == "1")
        offset = PUBLIC_OFFSET if self.nat else 0
        # The simulated hosts share this machine's memory (or its GPU): each worker advertises an equal share, so that
        # the planner splits blocks evenly (and refuses a model the machine cannot hold)
        share = advertised_memory(spec.device, 0) // spec.hosts
        secret_file = self.root / "cluster.secret"
        secret_file.write_text(secrets.token_hex(32) + "\n")
        secret_file.chmod(0o600)
        gossip = [f"{a}:{MEMBERSHIP_PORT + offset}" for a in addrs]  # each host's membership, as the others reach it
        for i, addr in enumerate(addrs):
            h = HostLayout(i, addr, self.root / f"h{i}",
                           netns=self.netns.host(i) if self.netns else None)
            for d in (h.state_dir, h.run_dir, h.log_dir):
                d.mkdir(parents=True, exist_ok=True)
            self.node_ids.append(load_or_create_node_id(h.state_dir))
            orch = None
            if i == 0:
                orch = {"model_path": str(spec.model), "pool_window_s": spec.pool_window_s,
                        "readiness_timeout_s": float(spec.readiness_timeout_s), "max_slots_per_stage": spec.slots,
                        **spec.orchestrator}
            # Host 0 founds the pool. Across shaped links it lists the others as seeds too, as an operator's first
            # WAN host should: it measures their round trips before its SWIM engine starts and probes at the timings
            # they call for (membership/seed_rtt.py), where a seedless first host would probe at the LAN's until
            # restarted; its join retries until one of them is up.
            seeds = gossip[:1] if i > 0 else gossip[1:] if spec.shaped else []
            cfg = host_config(h, seeds=seeds, secret_file=secret_file, device=spec.device,
                              ceiling_bytes=spec.ceiling_bytes, gpu=f"{spec.device or 'CPU'}:local-{i}:0",
                              orchestrator=orch, compute_threads=self.compute_threads, memory_bytes=share,
                              public_offset=offset)
            cfg["worker"].update(spec.workers.get(i, {}))
            for table, extra in spec.tables.items():
                cfg.setdefault(table, {}).update(extra)
            h.config_path.write_text(to_toml(cfg))
            self.hosts.append(h)
        self.progress(f"local cluster: {spec.hosts} host(s) at {', '.join(addrs)}"
                      f" ({'network namespaces' if self.netns else 'loopback addresses'}),"
                      f" {self.compute_threads} compute thread(s) per worker, dir {self.root}")
        if self.nat:
            assert self.netns is not None
            for h in self.hosts:
                try:
                    nat.apply(self.netns.host(h.index), h.addr, h.name)
                except nat.NatError as e:
                    raise ClusterError(f"NAT: {e}") from None
            mapped = ", ".join(f"{m.name} {m.public}" for m in nat.MAPPED)
            self.progress(f"NAT: every host's services advertise their port + {offset} ({mapped}), reachable from "
                          "other hosts only through that mapping")
        if spec.shaped and self.netns is not None:
            self._shape_links()
        for h in self.hosts:
            self._init_identity(h)
        t = spec.start_timeout_s
        self._start_all("arena", "swactor.arena.main", lambda h: h.sock("arena"), t)
        self._start_all("membership", "swactor.membership.main", lambda h: h.sock("membership"), t)
        self._start_all("edge", "swactor.edge.main", lambda h: h.sock("edge"), t)
        for h in self.hosts:
            self._spawn(h, "worker", "swactor.worker.main")
        want = set(self.node_ids)
        ready.wait_for("membership (every node Available)",
                       lambda: ready.all_available(self.hosts[0].sock("membership"), want), t,
                       check=self.check_alive, progress=self.progress)
        h0 = self.hosts[0]
        self._spawn(h0, "orchestrator", "swactor.orchestrator.main")
        ready.wait_for("h0/orchestrator", lambda: ready.health_serving(h0.sock("orchestrator")), t,
                       check=self.check_alive, progress=self.progress)
        with self.channel() as ch:
            stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
            ready.wait_for("orchestrator pool", lambda: ready.pool_ready(stub, want), t,
                           check=self.check_alive, progress=self.progress)
        if spec.openai_port is not None:
            self._start_gateway(spec.openai_port)
        self.progress(f"local cluster ready: nodes {', '.join(str(n) for n in self.node_ids)}")
        log.info("localcluster_ready", hosts=spec.hosts, node_ids=self.node_ids, root=str(self.root))

    def _start_gateway(self, port: int) -> None:
        """The gateway runs in this machine's own network namespace (its 127.0.0.1 is the operator's), a client of
        h0's orchestrator through the socket file."""
        assert self.root is not None
        h0 = self.hosts[0]
        self.openai_token_file = self.root / "openai.token"
        ensure_token(self.openai_token_file)
        self.openai_url = f"http://127.0.0.1:{port}/v1"
        argv = [sys.executable, "-m", "swactor.gateway.main", "--config", str(h0.config_path), "--address",
                f"127.0.0.1:{port}", "--orchestrator-socket", str(h0.sock("orchestrator")),
                "--token-file", str(self.openai_token_file)]
        svc = Service("h0/gateway", argv, h0.log_dir / "gateway.log")
        svc.start()
        if self._lifeline is not None:
            self._lifeline.own_group(svc.pid)
        self.services.append(svc)
        ready.wait_for("h0/gateway", lambda: ready.http_serving(f"{self.openai_url.removesuffix('/v1')}/health"),
                       self.spec.start_timeout_s, check=self.check_alive, progress=self.progress)
        self.progress(f"OpenAI API: {self.openai_url} (token file: {self.openai_token_file})")

    def _shape_links(self) -> None:
        assert self.netns is not None
        hosts = [ShapedHost(h.name, self.netns.host(h.index), h.log_dir, self.spec.host_links.get(h.index))
                 for h in self.hosts]
        self.links = LinkShaping(self.spec.links, hosts, self._lifeline)
        self.progress(f"link conditions: {self.spec.links.describe()}")
        for index, c in sorted(self.spec.host_links.items()):
            self.progress(f"link conditions on every packet into h{index} instead: {c.summary()}")
        try:
            self.links.apply(self.spec.start_timeout_s)
        except LinkShapingError as e:
            raise ClusterError(f"link conditions: {e}") from None

    def public_port(self, port: int) -> int:
        """Where another host reaches a service that binds `port`: the NAT mapping's port when the hosts are behind
        NAT (nat.py), else the port itself."""
        return port + PUBLIC_OFFSET if self.nat else port

    def public_endpoint(self, host: int, port: int) -> str:
        return f"{self.hosts[host].addr}:{self.public_port(port)}"

    @property
    def compute_threads(self) -> int:
        """Each worker's compute threads (what the worker's own auto choice gives, unless the spec sets it)."""
        return self.spec.compute_threads or min(len(os.sched_getaffinity(0)), 8)

    def _python(self, h: HostLayout, module: str, *args: str) -> list[str]:
        return [sys.executable, "-m", module, "--config", str(h.config_path), *args]

    def _prefix(self, h: HostLayout) -> list[str]:
        return self.netns.exec_prefix(h.index) if self.netns else []

    def _init_identity(self, h: HostLayout) -> None:
        argv = [*self._prefix(h), *self._python(h, "swactor.edge.main", "--init-identity")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise ClusterError(f"{h.name}/edge --init-identity failed ({done.returncode}): {done.stderr.strip()}")
        info = json.loads(done.stdout.strip().splitlines()[-1])
        if info["node_id"] != self.node_ids[h.index]:
            raise ClusterError(f"{h.name}: edge identity node id {info['node_id']} != {self.node_ids[h.index]}")

    def _spawn(self, h: HostLayout, name: str, module: str) -> Service:
        svc = Service(f"{h.name}/{name}", self._python(h, module), h.log_dir / f"{name}.log")
        self._start(svc, h)
        self.services.append(svc)
        return svc

    def _start(self, svc: Service, h: HostLayout) -> None:
        svc.start(self._prefix(h))
        if self._lifeline is not None:
            self._lifeline.own_group(svc.pid)  # its own session: the group id is its pid

    def _start_all(self, name: str, module: str, sock: Callable[[HostLayout], Path], timeout_s: float) -> None:
        for h in self.hosts:
            self._spawn(h, name, module)
        for h in self.hosts:
            ready.wait_for(f"{h.name}/{name}", lambda h=h: ready.health_serving(sock(h)), timeout_s,
                           check=self.check_alive)

    def restart(self, name: str, *, config: Path | None = None, env: dict[str, str] | None = None) -> Service:
        """Start service `name` ("h1/worker") again, as a service manager's Restart= would (stopping it
        first if it still runs), with its host's config or `config` and `env` added to its environment (a
        unit's Environment=). Readiness is the caller's to wait for."""
        old = self.service(name)
        old.stop(self.spec.stop_timeout_s)
        if self._lifeline is not None and old.proc is not None:
            self._lifeline.release_group(old.pid)
        host, kind = name.split("/")
        h = self.hosts[int(host.removeprefix("h"))]
        argv = self._python(h, f"swactor.{kind}.main")
        if config is not None:
            argv[argv.index("--config") + 1] = str(config)
        svc = Service(name, argv, h.log_dir / f"{kind}.log", env=dict(env or {}))
        self._start(svc, h)
        self.services[self.services.index(old)] = svc
        return svc

    def check_alive(self) -> None:
        for svc in self.services:
            if svc.exited() is not None:
                raise ClusterError(svc.describe_exit())
        if self.links is not None and (why := self.links.dead()) is not None:
            raise ClusterError(f"link delayer gone, its host is cut off: {why}")

    # --- access ----------------------------------------------------------------------------------

    @property
    def orchestrator_address(self) -> str:
        return f"unix:{self.hosts[0].sock('orchestrator')}"

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.orchestrator_address)

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def arena_stats(self, i: int) -> arena_pb2.ArenaStats:
        with grpc.insecure_channel(f"unix:{self.hosts[i].sock('arena')}") as ch:
            return arena_pb2_grpc.ArenaManagerStub(ch).Stats(arena_pb2.ArenaStatsRequest(), timeout=5)

    def edge_status(self, i: int) -> edge_pb2.EdgeDriverStatus:
        with grpc.insecure_channel(f"unix:{self.hosts[i].sock('edge')}") as ch:
            return edge_pb2_grpc.EdgeDriverStub(ch).GetStatus(edge_pb2.GetStatusRequest(), timeout=5)

    def logs(self, name: str, lines: int = 40) -> str:
        return tail(self.service(name).log, lines)

    # --- teardown --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every service (orchestrator first, arenas last), remove the link conditions, the namespaces and the
        dir, then let the reaper go. Safe to call twice, and with SIGINT/SIGTERM/SIGHUP held off so a second Ctrl-C
        cannot cut it short (if anything does, or it fails part way, the reaper removes the rest)."""
        old = {}
        clean = False
        with contextlib.suppress(ValueError):  # not the main thread: signals stay as they are
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            order = ["gateway", "orchestrator", "worker", "edge", "membership", "arena"]
            unclean: list[str] = []
            for kind in order:
                # The hosts' services of one kind stop together (a teardown as long as one host's, not N times it)
                same = [s for s in self.services if s.name.endswith("/" + kind)]
                for svc in same:
                    svc.signal(signal.SIGTERM)
                unclean += [svc.name for svc in same if not svc.finish(self.spec.stop_timeout_s)]
            for svc in self.services:
                svc.kill_group()
            self.teardown_report = {"services": len(self.services), "killed": unclean}
            self.services = []
            if self.links is not None:  # after the services: their teardown traffic still crosses the links
                self.links.remove()
                self.links = None
            if self.netns is not None:
                self.netns.destroy()
                self.netns = None
            if self.root is not None and self._own_root and not self.spec.keep:
                shutil.rmtree(self.root, ignore_errors=True)
            clean = True
        finally:
            if self._lifeline is not None:
                self._lifeline.close(clean=clean)
                self._lifeline = None
            for sig, handler in old.items():
                signal.signal(sig, handler)
