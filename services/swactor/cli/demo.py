"""`swactor demo`: bring up a local pool (N simulated hosts, each with membership, arena-manager,
edge-driver and worker; the orchestrator on host 0), run one prompt through S pipeline stages,
stream the answer, print a summary, tear everything down.

Everything is judged before any host exists (`preflight`): hosts against the address plan and this machine's
memory, stages against the model's layers, --max-tokens against its context, the placement against each simulated
host's share of memory, --link-* conditions against their ranges and this machine's namespaces. Exit status
(cli/args.py): 0 completed, 1 the run faulted or the pool could not be brought up (the message names the failing
service and quotes its log), 2 a bad argument (nothing was started), 3 stopped, 130 interrupted."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc

from swactor.cli import render
from swactor.cli.args import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_STOPPED, CliError, link_conditions
from swactor.cli.main import sampling
from swactor.common.events import configure_logging
from swactor.localcluster import ClusterError, ClusterSpec, LocalCluster
from swactor.localcluster.cluster import DEFAULT_MODEL
from swactor.localcluster.layout import MAX_HOSTS
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkshaping import unavailable as shaping_unavailable
from swactor.localcluster.netns import Netns
from swactor.localcluster.run import RunResult, follow
from swactor.localcluster.signals import Terminated, hold_until_signalled, terminate_on_signals
from swactor.membership.gpus import host_memory_available
from swactor.orchestrator.config import OrchestratorConfig
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.models.models import ModelUnusable, load_model
from swactor.orchestrator.models.sources import ModelSource
from swactor.orchestrator.planning.dry_run import pool_refusal
from swactor.orchestrator.planning.planner import memory_need
from swactor.orchestrator.planning.pool import Demand
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc
from swactor.worker.stage_memory import advertised_memory

# What one simulated host's services hold besides its weights (RSS measured with the default model, one host: arena
# 47 MB, membership 58, edge 65, worker 89, its compute process 483 with the whole 30-layer model of ~100 MB loaded).
HOST_SERVICES_BYTES = 640 << 20
QUIET_EVENTS = {pb.OBJECT_LOADED, pb.OBJECT_PRODUCED, pb.EXECUTE_STEP_STARTED, pb.STEP_COMPLETED, pb.TOKEN_RECEIVED,
                pb.EDGE_OBJECT_SENT, pb.EDGE_OBJECT_RECEIVED}
# Shown without --events: what went wrong (the rest of the lifecycle is bring-up progress lines, or nothing).
FAULT_EVENTS = {pb.NODE_FAULTED, pb.STAGE_FAULTED, pb.RUN_FAULTED, pb.RUN_STOPPED}
OUTCOME_EVENTS = {pb.RUN_COMPLETED, pb.RUN_FAULTED, pb.RUN_STOPPED}
PROGRESS_STEP = 25  # percent between two progress lines of one stage and phase


def say(text: str, stream: TextIO | None = None) -> None:
    """Write to the user's terminal; a terminal that is gone (SIGHUP, EIO) must not stop the teardown that follows."""
    out = stream or sys.stderr
    with contextlib.suppress(OSError):
        out.write(text)
        out.flush()


class Printer:
    """Human output: the answer on stdout as it arrives, progress and the summary on stderr."""

    def __init__(self, as_json: bool, events: bool = False) -> None:
        self.as_json = as_json
        self.events = events  # every lifecycle event as a line (--events / --verbose), not just progress
        # Once the run has its outcome, a stage's stream fault is teardown racing teardown (the spec stops the token
        # endpoints while StopRun travels): not what went wrong with the answer, so shown with --events only.
        self.outcome_seen = False
        self._shown: dict[tuple[int, str], int] = {}  # (stage, phase) -> the last percentage shown

    def emit(self, obj: dict[str, Any]) -> None:
        say(json.dumps(obj) + "\n", sys.stdout)

    def progress(self, line: str) -> None:
        if self.as_json:
            self.emit({"type": "progress", "message": line})
        else:
            say(f"[demo] {line}\n")

    def update(self, u: opb.RunUpdate, res: RunResult) -> None:
        if u.HasField("token"):
            if self.as_json:
                self.emit({"type": "token", "sequence": u.token.sequence, "token_id": u.token.token_id,
                           "text": u.token.text, "end_of_generation": u.token.end_of_generation})
            else:
                say(u.token.text, sys.stdout)
        elif u.HasField("event"):
            ev = u.event
            if self.as_json:
                self.emit({"type": "event", **render.as_json(ev)})
            elif ev.kind == pb.WEIGHTS_LOAD_PROGRESS:
                self._percent(ev.stage_index, "weights", ev.counters.get("layers_loaded", 0),
                              ev.counters.get("layers_total", 0), "layers")
            elif ev.kind == pb.COMPILE_PROGRESS:
                total = ev.counters.get("units_total", 0)
                if total == 0:
                    self._once(ev.stage_index, "compile", "compiled graphs loaded from the cache")
                else:
                    self._percent(ev.stage_index, "compile", ev.counters.get("units_done", 0), total, "graph calls")
            elif (line := render.download_line(ev)) is not None:
                self.progress(line)  # weights fetched from host 0's model server, a line per stage update
            elif ev.kind == pb.READINESS_BARRIER_PASSED and not self.events:
                self.progress("every stage is ready (readiness barrier passed): the prompt goes in")
            elif ev.kind not in QUIET_EVENTS and (self.events or (ev.kind in FAULT_EVENTS and not self.outcome_seen)):
                self.progress(render.event_line(ev))
            self.outcome_seen |= ev.kind in OUTCOME_EVENTS

    def _percent(self, stage: int, phase: str, done: int, total: int, unit: str) -> None:
        """A line when the stage's `phase` crosses another PROGRESS_STEP percent (every update with --events)."""
        pct = 100 * done // total if total else 100
        shown = self._shown.get((stage, phase))
        if shown is not None:
            same_step = pct < 100 and pct // PROGRESS_STEP == shown // PROGRESS_STEP
            if pct == shown or (same_step and not self.events):
                return
        self._shown[(stage, phase)] = pct
        self.progress(f"stage {stage}: {phase} {pct}% ({done}/{total} {unit})")

    def _once(self, stage: int, phase: str, what: str) -> None:
        if (stage, phase) not in self._shown:
            self._shown[(stage, phase)] = 100
            self.progress(f"stage {stage}: {what}")

    def summary(self, res: RunResult, hosts: int, stages: int) -> None:
        s = {"type": "summary", "hosts": hosts, "stages": stages, **res.summary(), "token_ids": res.token_ids}
        if self.as_json:
            self.emit(s)
            return
        say("\n", sys.stdout)

        def f(v: object, unit: str) -> str:
            return "-" if v is None else f"{v:.2f}{unit}"

        line = (f"outcome: {s['outcome']}{' (' + str(s['reason']) + ')' if s['reason'] else ''}; "
                f"{s['tokens']} token(s) from {s['prompt_tokens']} prompt token(s); "
                f"TTFT {f(s['ttft_s'], ' s')} (provision {f(s['provision_s'], ' s')}, prefill {f(s['prefill_s'], ' s')}); "
                f"decode {f(s['decode_tok_s'], ' tok/s')}; teardown {f(s['teardown_s'], ' s')}")
        say(f"[demo] {line}\n")
        if s["detail"]:
            say(f"[demo] detail: {s['detail']}\n")
        if res.finished is not None and (seed := render.seed_line(res.finished)):
            say(f"[demo] {seed}\n")


@dataclass(frozen=True)
class DemoPlan:
    """What the demo will bring up and submit, every part checked before anything is created."""

    hosts: int
    stages: int
    model: Path
    request: opb.SubmitRunRequest
    links: LinkConditions = field(default_factory=LinkConditions)


def preflight(args: argparse.Namespace) -> DemoPlan:
    """Judge hosts, stages, token limits and memory against the model's header and this machine, so a demo that
    cannot work says why in a second rather than after bringing up its hosts. Raises CliError naming the argument."""
    links = link_conditions(args)
    if links.shaped:
        why = Netns.available() or shaping_unavailable()
        if why is not None:
            raise CliError(f"the --link-* conditions need network namespaces: {why}")
    hosts = args.hosts or max(3, args.stages or 0)
    stages = args.stages or hosts  # the default model split across every simulated host
    if hosts < stages:
        raise CliError(f"--hosts {hosts} cannot hold --stages {stages} (one stage per host)")
    if not args.prompt.strip():
        raise CliError("--prompt is empty")
    model = Path(args.model) if args.model else DEFAULT_MODEL
    if not model.is_file():
        hint = " (run `make model`)" if args.model is None else ""
        raise CliError(f"--model {model}: no such file{hint}")
    try:  # the orchestrator's own judgement of the file, as its model registry makes it
        facts = load_model(ModelSource(model.stem, str(model.resolve()))).facts
    except ModelUnusable as e:
        raise CliError(f"--model {model}: {e}") from None
    if stages > facts.num_layers:
        raise CliError(f"--stages {stages}: model {model.name} has {facts.num_layers} layers, so at most "
                       f"{facts.num_layers} stages")
    if hosts > MAX_HOSTS:
        raise CliError(f"--stages {stages} needs {hosts} hosts; the local address plan holds at most {MAX_HOSTS}")
    context = min(facts.max_seq_len, OrchestratorConfig.max_seq_len)
    if args.max_tokens > context:
        raise CliError(f"--max-tokens {args.max_tokens}: the context holds {context} tokens, prompt included")
    # The simulated hosts share this machine: each one's services, and each stage's part of the model in its share.
    available = host_memory_available()
    if available and hosts * HOST_SERVICES_BYTES > available:
        raise CliError(f"--hosts {hosts}: their services need about {hosts * HOST_SERVICES_BYTES / 2**30:.1f} GiB "
                       f"and this machine has {available / 2**30:.1f} GiB available")
    share = advertised_memory("CPU", 0) // hosts
    members = tuple(NodeInfo(i + 1, NodeState.AVAILABLE, "edge", "control", memory_bytes=share) for i in range(hosts))
    demand = Demand(stages, (), facts.num_layers, memory_need(facts, OrchestratorConfig.max_seq_len))
    refusal = pool_refusal(members, demand)
    if refusal:
        raise CliError(f"--hosts {hosts} --stages {stages}: this machine cannot hold model {model.name} so: {refusal}")
    req = opb.SubmitRunRequest(prompt=args.prompt, raw=args.raw, stages=stages, max_tokens=args.max_tokens,
                               sampling=sampling(args))
    return DemoPlan(hosts, stages, model, req, links)


def run_demo(args: argparse.Namespace, plan: DemoPlan) -> int:
    out = Printer(args.json, events=getattr(args, "events", False))
    configure_logging("swactor-demo", level=logging.WARNING)  # stderr; stdout carries only the answer / JSON
    hosts, req = plan.hosts, plan.request
    serve = getattr(args, "serve", False)
    spec = ClusterSpec(hosts=hosts, model=plan.model, links=plan.links, openai_port=args.openai_port if serve else None)
    # SIGTERM and SIGHUP tear down like Ctrl-C, even when SIGINT was inherited ignored (localcluster/signals.py).
    restore_signals = terminate_on_signals()
    res: RunResult | None = None
    try:
        with LocalCluster(spec, progress=out.progress) as cluster:
            if args.json:
                out.emit({"type": "cluster", "hosts": hosts, "node_ids": cluster.node_ids,
                          "addresses": [h.addr for h in cluster.hosts], "netns": cluster.netns is not None,
                          "links": plan.links.as_dict()})
            with cluster.channel() as ch:
                stub = orchestrator_pb2_grpc.OrchestratorStub(ch)

                def submitted(r: RunResult) -> None:
                    nonlocal res
                    res = r
                    out.progress(f"run {r.run_id}: {r.prompt_tokens} prompt token(s), {plan.stages} stage(s) "
                                 f"on {hosts} host(s)")

                try:
                    res = follow(stub, req, out.update, submitted)
                except KeyboardInterrupt:
                    if res is not None and res.run_id:
                        out.progress(f"interrupted: stopping run {res.run_id}")
                        with contextlib.suppress(grpc.RpcError):
                            stub.StopRun(opb.StopRunRequest(run_id=res.run_id, detail="swactor demo interrupted"),
                                         timeout=30)
                    raise
            if serve:
                out.progress(f"serving the OpenAI API at {cluster.openai_url} until Ctrl-C (docs/demo.md)")
                with contextlib.suppress(KeyboardInterrupt):  # the normal end of serving, not a failure
                    hold_until_signalled()
            out.progress("tearing the local cluster down")
        out.summary(res, hosts, plan.stages)
        out.progress(f"teardown: {cluster.teardown_report['services']} service(s) stopped"
                     + (f", killed after timeout: {cluster.teardown_report['killed']}"
                        if cluster.teardown_report["killed"] else ""))
    except ClusterError as e:
        say(f"swactor demo: the local cluster failed: {e}\n")
        return EXIT_FAILED
    except TimeoutError as e:
        say(f"swactor demo: {e}\n")
        return EXIT_FAILED
    except grpc.RpcError as e:
        say(f"swactor demo: orchestrator call failed: {e.code().name}: {e.details()}\n")  # type: ignore[attr-defined]
        return EXIT_FAILED
    except KeyboardInterrupt as e:
        say("swactor demo: interrupted; the local cluster was torn down\n")
        return e.exit_status if isinstance(e, Terminated) else EXIT_INTERRUPTED
    finally:
        restore_signals()
    assert res is not None and res.finished is not None
    return {opb.RUN_OUTCOME_COMPLETED: EXIT_OK, opb.RUN_OUTCOME_STOPPED: EXIT_STOPPED}.get(
        res.finished.outcome, EXIT_FAILED)
