"""`swactor demo`: bring up a local pool (N simulated hosts, each with membership, arena-manager,
edge-driver and worker; the orchestrator on host 0), run one prompt through S pipeline stages,
stream the answer, print a summary, tear everything down.

Exit status: 0 completed, 1 the run faulted, 3 it was stopped, 2 the pool could not be brought up
(the message names the failing service and quotes its log), 130 interrupted."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
from typing import Any

import grpc

from swactor.cli import render
from swactor.common.events import configure_logging
from swactor.localcluster import ClusterError, ClusterSpec, LocalCluster
from swactor.localcluster.run import RunResult, follow
from swactor.localcluster.signals import terminate_on_sigterm
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

EXIT_OK, EXIT_RUN_FAILED, EXIT_ERROR, EXIT_STOPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
QUIET_EVENTS = {pb.OBJECT_LOADED, pb.OBJECT_PRODUCED, pb.EXECUTE_STEP_STARTED, pb.STEP_COMPLETED, pb.TOKEN_RECEIVED,
                pb.EDGE_OBJECT_SENT, pb.EDGE_OBJECT_RECEIVED}
# Shown without --events: what went wrong (the rest of the lifecycle is bring-up progress lines, or nothing).
FAULT_EVENTS = {pb.NODE_FAULTED, pb.STAGE_FAULTED, pb.RUN_FAULTED, pb.RUN_STOPPED}
PROGRESS_STEP = 25  # percent between two progress lines of one stage and phase


class Printer:
    """Human output: the answer on stdout as it arrives, progress and the summary on stderr."""

    def __init__(self, as_json: bool, events: bool = False) -> None:
        self.as_json = as_json
        self.events = events  # every lifecycle event as a line (--events / --verbose), not just progress
        self._shown: dict[tuple[int, str], int] = {}  # (stage, phase) -> the last percentage shown

    def emit(self, obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    def progress(self, line: str) -> None:
        if self.as_json:
            self.emit({"type": "progress", "message": line})
        else:
            print(f"[demo] {line}", file=sys.stderr, flush=True)

    def update(self, u: opb.RunUpdate, res: RunResult) -> None:
        if u.HasField("token"):
            if self.as_json:
                self.emit({"type": "token", "sequence": u.token.sequence, "token_id": u.token.token_id,
                           "text": u.token.text, "end_of_generation": u.token.end_of_generation})
            else:
                sys.stdout.write(u.token.text)
                sys.stdout.flush()
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
            elif ev.kind not in QUIET_EVENTS and (self.events or ev.kind in FAULT_EVENTS):
                self.progress(render.event_line(ev))

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
        sys.stdout.write("\n")
        sys.stdout.flush()

        def f(v: object, unit: str) -> str:
            return "-" if v is None else f"{v:.2f}{unit}"

        line = (f"outcome: {s['outcome']}{' (' + str(s['reason']) + ')' if s['reason'] else ''}; "
                f"{s['tokens']} token(s) from {s['prompt_tokens']} prompt token(s); "
                f"TTFT {f(s['ttft_s'], ' s')} (provision {f(s['provision_s'], ' s')}, prefill {f(s['prefill_s'], ' s')}); "
                f"decode {f(s['decode_tok_s'], ' tok/s')}; teardown {f(s['teardown_s'], ' s')}")
        print(f"[demo] {line}", file=sys.stderr, flush=True)
        if s["detail"]:
            print(f"[demo] detail: {s['detail']}", file=sys.stderr, flush=True)


def request(args: argparse.Namespace) -> opb.SubmitRunRequest:
    if not args.prompt.strip():
        raise ValueError("--prompt is empty")
    return opb.SubmitRunRequest(prompt=args.prompt, raw=args.raw, stages=args.stages, max_tokens=args.max_tokens,
                                sampling=opb.Sampling(temperature=args.temperature, top_k=args.top_k,
                                                      top_p=args.top_p, seed=args.seed))


def run_demo(args: argparse.Namespace) -> int:
    out = Printer(args.json, events=getattr(args, "events", False))
    configure_logging("swactor-demo", level=logging.WARNING)  # stderr; stdout carries only the answer / JSON
    hosts = args.hosts or max(3, args.stages or 0)
    args.stages = args.stages or hosts  # the default model split across every simulated host
    try:
        req = request(args)
    except ValueError as e:
        print(f"swactor demo: {e}", file=sys.stderr)
        return EXIT_ERROR
    spec = ClusterSpec(hosts=hosts, netns=False if getattr(args, "loopback", False) else None,
                       **({"model": args.model} if getattr(args, "model", None) else {}))
    # SIGTERM tears down like Ctrl-C, even when SIGINT was inherited ignored (localcluster/signals.py).
    prev = terminate_on_sigterm()
    res: RunResult | None = None
    try:
        with LocalCluster(spec, progress=out.progress) as cluster:
            if args.json:
                out.emit({"type": "cluster", "hosts": hosts, "node_ids": cluster.node_ids,
                          "addresses": [h.addr for h in cluster.hosts], "netns": cluster.netns is not None})
            with cluster.channel() as ch:
                stub = orchestrator_pb2_grpc.OrchestratorStub(ch)

                def submitted(r: RunResult) -> None:
                    nonlocal res
                    res = r
                    out.progress(f"run {r.run_id}: {r.prompt_tokens} prompt token(s), {args.stages} stage(s) "
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
            out.progress("tearing the local cluster down")
        out.summary(res, hosts, args.stages)
        out.progress(f"teardown: {cluster.teardown_report['services']} service(s) stopped"
                     + (f", killed after timeout: {cluster.teardown_report['killed']}"
                        if cluster.teardown_report["killed"] else ""))
    except ClusterError as e:
        print(f"swactor demo: the local cluster failed: {e}", file=sys.stderr)
        return EXIT_ERROR
    except TimeoutError as e:
        print(f"swactor demo: {e}", file=sys.stderr)
        return EXIT_ERROR
    except grpc.RpcError as e:
        print(f"swactor demo: orchestrator call failed: {e.code().name}: {e.details()}", file=sys.stderr)  # type: ignore[attr-defined]
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("swactor demo: interrupted; the local cluster was torn down", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, prev)
    assert res is not None and res.finished is not None
    return {opb.RUN_OUTCOME_COMPLETED: EXIT_OK, opb.RUN_OUTCOME_STOPPED: EXIT_STOPPED}.get(
        res.finished.outcome, EXIT_RUN_FAILED)
