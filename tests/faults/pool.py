"""A real local pool for fault injection: `swactor.localcluster` (every service its own process, one
network namespace per host) plus what the fault tests need around it — runs followed in the
background, the services' pids, arena leases per host, restarting what a fault killed (as systemd's
Restart= would) and healing the pool between tests.

Nothing here sleeps blindly: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster import ready as cready
from swactor.localcluster.layout import HostLayout, to_toml
from swactor.localcluster.procs import Service
from swactor.v1 import common_pb2 as pb
from swactor.v1 import membership_pb2 as mpb
from swactor.v1 import membership_pb2_grpc, orchestrator_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb
from tests.harness.procs import pid_alive

T = TypeVar("T")
POLL_S = 0.05
OUTCOME_KINDS = (pb.RUN_COMPLETED, pb.RUN_FAULTED, pb.RUN_STOPPED)
# The prompt of every run here: one length, so the compute processes' compiled graphs serve them all.
PROMPT_IDS = (1, 9690, 2, 198, 1, 4093, 198, 10576, 1432, 253, 655, 28, 2)
# Start order on a host (each waits for the one before: the arena first, the worker last).
SERVICE_ORDER = ("arena", "membership", "edge", "worker", "orchestrator")


class NotYet(Exception):
    """A polled condition does not hold yet; the message says why."""


def wait_until(what: str, probe: Callable[[], T], timeout_s: float, poll_s: float = POLL_S) -> T:
    """Poll `probe` (raises NotYet / returns) until it returns; TimeoutError naming `what` and why not."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            return probe()
        except NotYet as e:
            last = str(e)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s: {last}")
        time.sleep(poll_s)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


@dataclass
class RunWatch:
    """One run followed in a background thread (WatchRun): its events, tokens and end."""

    run_id: int
    prompt_tokens: int
    events: list[pb.LifecycleEvent] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finished: opb.Run | None = None
    error: str = ""  # the watch broke (e.g. the orchestrator died): code and detail
    ended: threading.Event = field(default_factory=threading.Event)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def _add(self, u: opb.RunUpdate) -> None:
        with self._cond:
            if u.HasField("token"):
                self.tokens.append(u.token.token_id)
            elif u.HasField("event"):
                self.events.append(u.event)
            elif u.HasField("finished"):
                self.finished = u.finished
            self._cond.notify_all()

    def _end(self, error: str = "") -> None:
        with self._cond:
            self.error = error
            self.ended.set()
            self._cond.notify_all()

    def wait_tokens(self, n: int, timeout_s: float = 120.0) -> None:
        """Until `n` tokens arrived (the run is decoding); fails if the run ends first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.tokens) < n:
                if self.ended.is_set():
                    raise AssertionError(f"run {self.run_id} ended before {n} tokens: {self.describe()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"run {self.run_id}: {len(self.tokens)} of {n} tokens in {timeout_s:.0f} s; "
                                       f"{self.describe()}")
                self._cond.wait(left)

    def wait_event(self, kind: int, timeout_s: float) -> pb.LifecycleEvent:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for e in self.events:
                    if e.kind == kind:
                        return e
                left = deadline - time.monotonic()
                if self.ended.is_set() or left <= 0:
                    raise TimeoutError(f"run {self.run_id}: no {pb.LifecycleEventKind.Name(kind)} "
                                       f"({self.describe()})")
                self._cond.wait(left)

    def wait_outcome(self, timeout_s: float) -> pb.LifecycleEvent | None:
        """The first terminal outcome event, once there is one (None: not within `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                outs = self.outcome_events()
                if outs:
                    return outs[0]
                left = deadline - time.monotonic()
                if self.ended.is_set() or left <= 0:
                    return None
                self._cond.wait(left)

    def wait_end(self, timeout_s: float) -> bool:
        return self.ended.wait(timeout_s)

    def outcome_events(self) -> list[pb.LifecycleEvent]:
        return [e for e in self.events if e.kind in OUTCOME_KINDS]

    def describe(self) -> str:
        f = self.finished
        out = "running" if f is None else (f"{opb.RunOutcome.Name(f.outcome)} {f.reason} {f.detail!r}")
        # the last events say where a run that never decoded stands (queued, provisioning, waiting for a stage)
        last = ", ".join(f"{pb.LifecycleEventKind.Name(e.kind)}({e.stage_index}) {e.reason} {e.detail[:120]}".rstrip()
                         for e in self.events[-6:])
        return (f"{out}; {len(self.tokens)} token(s){'; watch error ' + self.error if self.error else ''}; "
                f"last events: {last or 'none'}")


class FaultPool:
    """A LocalCluster and the handles fault tests use. Stages are pinned: stage k on host k."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(grpc.insecure_channel(cluster.orchestrator_address))
        self.stopped: set[int] = set()  # pids we SIGSTOPped (healed with SIGCONT)

    # ---- identities ----

    @property
    def hosts(self) -> list[HostLayout]:
        return self.cluster.hosts

    def node_id(self, host: int) -> int:
        return self.cluster.node_ids[host]

    def netns(self, host: int) -> str:
        assert self.cluster.netns is not None, "fault tests need network namespaces"
        return self.cluster.netns.host(host)

    def service_pids(self) -> dict[str, int]:
        return {s.name: s.pid for s in self.cluster.services}

    def dead_services(self) -> list[str]:
        return [s.name for s in self.cluster.services if s.exited() is not None or not pid_alive(s.pid)]

    def compute_pid(self, host: int) -> int:
        """The worker's compute process (python -m swactor.worker.process) on `host`."""
        worker = self.cluster.service(f"h{host}/worker").pid
        for c in children(worker):
            with contextlib.suppress(OSError):
                if b"swactor.worker.process" in Path(f"/proc/{c}/cmdline").read_bytes():
                    return c
        raise LookupError(f"h{host}/worker (pid {worker}) has no compute process")

    def host_pids(self, host: int) -> list[int]:
        """Every process of the host's services (their process groups: the compute process too)."""
        out = []
        for s in self.cluster.services:
            if s.name.startswith(f"h{host}/"):
                out += [s.pid, *children(s.pid)]
        return [p for p in out if pid_alive(p)]

    # ---- runs ----

    def submit(self, hosts: tuple[int, ...] = (0, 1, 2), max_tokens: int = 4, **fields: object) -> RunWatch:
        """SubmitRun pinned to `hosts` (stage k on hosts[k]) and follow it in the background."""
        req = opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=PROMPT_IDS), stages=len(hosts), max_tokens=max_tokens,
                                   ignore_eos=True, node_ids=[self.node_id(h) for h in hosts], **fields)  # type: ignore[arg-type]
        resp = self.stub.SubmitRun(req, timeout=30)
        watch = RunWatch(resp.run_id, resp.prompt_tokens)
        threading.Thread(target=self._follow, args=(watch,), daemon=True, name=f"watch-{resp.run_id}").start()
        return watch

    def _follow(self, watch: RunWatch) -> None:
        try:
            for u in self.stub.WatchRun(opb.WatchRunRequest(run_id=watch.run_id), timeout=600):
                watch._add(u)
        except grpc.RpcError as e:
            watch._end(f"{e.code().name}: {e.details()}")  # type: ignore[attr-defined]
            return
        watch._end()

    def run(self, hosts: tuple[int, ...] = (0, 1, 2), max_tokens: int = 4, timeout_s: float = 180.0,
            **fields: object) -> RunWatch:
        watch = self.submit(hosts, max_tokens, **fields)
        if not watch.wait_end(timeout_s):
            raise TimeoutError(f"run {watch.run_id} did not end within {timeout_s:.0f} s: {watch.describe()}")
        return watch

    def get_run(self, run_id: int) -> opb.Run:
        return self.stub.GetRun(opb.GetRunRequest(run_id=run_id), timeout=10)

    def get_events(self, run_id: int) -> list[pb.LifecycleEvent]:
        return list(self.stub.GetEvents(opb.GetEventsRequest(run_id=run_id), timeout=10).events)

    def stop_run(self, run_id: int, detail: str) -> None:
        with contextlib.suppress(grpc.RpcError):
            self.stub.StopRun(opb.StopRunRequest(run_id=run_id, detail=detail), timeout=10)

    def active_runs(self) -> list[opb.Run]:
        runs = self.stub.ListRuns(opb.ListRunsRequest(limit=10), timeout=10).runs
        return [r for r in runs if r.state != opb.RUN_STATE_DONE]

    # ---- arenas ----

    def leases(self, host: int) -> list[str]:
        """Live leases and queued requests in the host's arena ("ring R edge E by REQUESTER")."""
        stats = self.cluster.arena_stats(host)
        return ([f"ring {x.ring_id} edge {x.edge_id} by {x.requester} (pid {x.owner_pid})" for x in stats.leases]
                + [f"queued request {q.request_id} edge {q.edge_id} by {q.requester}" for q in stats.queued])

    def leases_left(self, hosts: tuple[int, ...], timeout_s: float = 5.0) -> dict[str, list[str]]:
        """Leases still live on `hosts` once `timeout_s` passed (releases finish asynchronously)."""
        def probe() -> dict[str, list[str]]:
            left = {f"h{h}": ls for h in hosts if (ls := self.leases(h))}
            if left:
                raise NotYet(str(left))
            return {}

        try:
            return wait_until("leases released", probe, timeout_s, poll_s=0.1)
        except TimeoutError:
            return {f"h{h}": ls for h in hosts if (ls := self.leases(h))}

    # ---- restarting what a fault killed ----

    def host_config(self, host: int, name: str, **tables: dict[str, object]) -> Path:
        """A copy of the host's swactor.toml with keys of some tables replaced, e.g.
        host_config(1, "oom", worker={"fault_injection_device_budget_bytes": 4096})."""
        h = self.hosts[host]
        cfg = tomllib.loads(h.config_path.read_text())
        for table, keys in tables.items():
            cfg.setdefault(table, {}).update(keys)
        path = h.root / f"swactor-{name}.toml"
        path.write_text(to_toml(cfg))
        return path

    def restart(self, name: str, *, config: Path | None = None, env: dict[str, str] | None = None) -> None:
        """Restart one service (with `config`, `env` added to its environment) and wait until it serves
        (gRPC health; a worker: its node Available again; the orchestrator: its API)."""
        host, kind = name.split("/")
        h = self.hosts[int(host[1:])]
        if kind == "worker":
            # A worker that stops leaves its node advertised Available (finding in docs/faults.md):
            # withdraw it here so that "Available" below is the new worker's word. Only once the old
            # worker is gone: a live one may announce Available again (a run it refused ended) after it.
            self.cluster.service(name).stop(self.cluster.spec.stop_timeout_s)
            self._set_booting(h)
        svc = self.cluster.restart(name, config=config, env=env)
        if kind == "worker":
            wait_until(f"{name}: node Available", lambda: self._self_available(h, svc), 60)
        if kind in ("arena", "membership", "edge", "orchestrator"):
            sock = h.sock(kind)
            wait_until(f"{name} serving", lambda: self._health(sock, svc), 60)
        if kind == "orchestrator":
            self.stub = orchestrator_pb2_grpc.OrchestratorStub(grpc.insecure_channel(self.cluster.orchestrator_address))

    def restart_host(self, host: int, *, configs: dict[str, Path] | None = None) -> None:
        """Restart every service of `host` in boot order (a rebooted host)."""
        kinds = [k for k in SERVICE_ORDER if any(s.name == f"h{host}/{k}" for s in self.cluster.services)]
        for k in kinds:
            self.cluster.service(f"h{host}/{k}").kill_group()
        for k in kinds:
            self.restart(f"h{host}/{k}", config=(configs or {}).get(k))

    def _set_booting(self, h: HostLayout) -> None:
        with contextlib.suppress(grpc.RpcError), grpc.insecure_channel(f"unix:{h.sock('membership')}") as ch:
            membership_pb2_grpc.MembershipStub(ch).SetLocalState(
                mpb.SetLocalStateRequest(state=mpb.NODE_STATE_BOOTING), timeout=5)

    def _self_available(self, h: HostLayout, svc: Service) -> None:
        if svc.exited() is not None:
            raise AssertionError(svc.describe_exit())
        try:
            me = next(m for m in cready.members(h.sock("membership")) if m.is_self)
        except cready.NotReady as e:
            raise NotYet(str(e)) from None
        if me.metadata.state != mpb.NODE_STATE_AVAILABLE:
            raise NotYet(f"{h.name} is {mpb.NodeState.Name(me.metadata.state)}")

    def _health(self, sock: Path, svc: Service) -> None:
        if svc.exited() is not None:
            raise AssertionError(svc.describe_exit())
        try:
            cready.health_serving(sock)
        except cready.NotReady as e:
            raise NotYet(str(e)) from None

    def wait_pool(self, timeout_s: float = 60.0) -> None:
        """Until the orchestrator lists every node provisionable and its pool ready."""
        want = set(self.cluster.node_ids)

        def probe() -> None:
            dead = self.dead_services()
            if dead:
                raise AssertionError(f"service(s) died: {dead}")
            try:
                cready.pool_ready(self.stub, want)
            except cready.NotReady as e:
                raise NotYet(str(e)) from None

        wait_until("pool ready", probe, timeout_s)

    # ---- signals ----

    def sigstop(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)

    def sigcont(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.stopped.discard(pid)

    # ---- healing between tests ----

    def heal(self) -> list[str]:
        """Bring the pool back to health after a test, whatever it left: continue stopped
        processes, stop runs still active, restart dead services and hosts whose leases stay held.
        Returns what it had to do (empty: the test left the pool healthy)."""
        did: list[str] = []
        for pid in list(self.stopped):
            self.sigcont(pid)
            did.append(f"SIGCONT {pid}")
        with contextlib.suppress(grpc.RpcError):
            for r in self.active_runs():
                self.stop_run(r.run_id, "fault suite: heal")
                did.append(f"stopped run {r.run_id}")
        dead = self.dead_services()
        for host in sorted({int(n.split("/")[0][1:]) for n in dead}):
            names = [n for n in dead if n.startswith(f"h{host}/")]
            if f"h{host}/arena" in names:  # its dependents hold the dead arena's memfd: the host reboots
                did.append(f"restarted h{host} ({', '.join(names)} dead)")
                self.restart_host(host)
                continue
            for kind in SERVICE_ORDER:
                if f"h{host}/{kind}" in names:
                    did.append(f"restarted h{host}/{kind}")
                    self.restart(f"h{host}/{kind}")
        left = self.leases_left(tuple(range(len(self.hosts))), timeout_s=8.0)
        for h in sorted(left):
            did.append(f"restarted {h} (leases held: {left[h]})")
            self.restart_host(int(h[1:]))
        self.wait_pool()
        for _ in range(3):  # a probe run: a stage still holding an old run refuses it by name
            probe = self.run(max_tokens=2)
            if probe.finished is not None and probe.finished.outcome == opb.RUN_OUTCOME_COMPLETED:
                return did
            stuck = [h for h in range(len(self.hosts))
                     if probe.finished is not None and f"node {self.node_id(h)}" in probe.finished.detail]
            did.append(f"probe run {probe.describe()}; restarting {[f'h{h}/worker' for h in stuck] or 'every host'}")
            for h in stuck or range(len(self.hosts)):
                self.restart(f"h{h}/worker")
            self.wait_pool()
        raise AssertionError(f"the pool does not heal: {did}")


def pool_spec(base: Path, orchestrator_state: Path) -> ClusterSpec:
    """The fault suite's pool: 3 hosts, timeouts short enough that a fault is seen in seconds. Its blocks stay as
    memory splits them (split_by_speed off): faults are aimed at a stage's blocks (an interior tensor), and the hosts'
    measured speeds, which a fault that freezes a host or a busy neighbour moves, are not what this suite tests."""
    return ClusterSpec(
        hosts=3, netns=True, base_dir=base, readiness_timeout_s=90.0,
        orchestrator={"pool_timeout_s": 8.0, "step_timeout_s": 5.0, "first_token_timeout_s": 120.0,
                      "teardown_timeout_s": 8.0, "state_dir": str(orchestrator_state), "split_by_speed": False},
        # A frozen compute process is killed after 4 s; a ring lease queued 3 s faults the run.
        workers={i: {"stop_timeout_s": 4.0, "arena_pressure_timeout_s": 3.0} for i in range(3)},
        tables={"edge": {"rendezvous_timeout": 5.0}},
    )


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the body (the run store's small disk)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def fault_pool(progress: Callable[[str], None] = lambda line: None) -> Iterator[FaultPool]:
    """The suite's pool in a fresh dir; the orchestrator's run store on its own small tmpfs (so a
    test can fill that disk), holding host 0's node id like the rest of host 0's state."""
    import shutil
    import tempfile

    from swactor.common.ids import NODE_ID_FILE, load_or_create_node_id

    base = Path(tempfile.mkdtemp(prefix="swf-"))
    try:
        with tmpfs(base / "orch-state", "64m") as orch_state:
            load_or_create_node_id(base / "h0" / "state")
            shutil.copy(base / "h0" / "state" / NODE_ID_FILE, orch_state / NODE_ID_FILE)
            with LocalCluster(pool_spec(base, orch_state), progress=progress) as cluster:
                yield FaultPool(cluster)
    finally:
        if os.environ.get("SWACTOR_FAULTS_KEEP"):  # the services' logs, for a failure's post-mortem
            progress(f"fault pool kept at {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
