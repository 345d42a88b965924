"""swactor: operate a swactor pool through its orchestrator.

  swactor submit --prompt "Hello" [--watch]    start a run, or queue it (chat template unless --raw)
  swactor submit ... --dry-run                  where it would run and the memory per stage; starts nothing
  swactor watch RUN_ID                          stream a run's text (and --events) to its end
  swactor runs | show RUN_ID | events [RUN_ID]  inspect runs and their lifecycle events (no RUN_ID: the pool's)
  swactor nodes                                 the membership view and pool readiness
  swactor models                                served models and what each host's weights cache holds
  swactor stop RUN_ID                           operator stop
  swactor demo                                  bring up a local pool and run one prompt

Locally the CLI talks to the orchestrator's Unix socket. From elsewhere, to its TCP API (TLS and a
bearer token, when the orchestrator host enabled it; see docs/operations.md):

  swactor --address 10.0.0.2:7440 --tls-ca api-cert.pem --token-file api.token nodes

SWACTOR_ADDRESS, SWACTOR_TLS_CA and SWACTOR_TOKEN_FILE set the same three from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import grpc

from swactor import __version__
from swactor.cli import render
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

DEFAULT_ADDRESS = "unix:/run/swactor/orchestrator.sock"
EXIT_OK, EXIT_RUN_FAILED, EXIT_ERROR, EXIT_STOPPED = 0, 1, 2, 3
VERSIONED = ("grpcio", "protobuf", "gguf", "tinygrad", "numpy", "aioquic", "regex")


class CliError(Exception):
    pass


def versions() -> str:
    lines = [f"swactor {__version__}", f"python {platform.python_version()}"]
    for dist in VERSIONED:
        try:
            lines.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{dist} (not installed)")
    return "\n".join(lines)


class VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kw) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print swactor and dependency versions")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(versions())
        parser.exit()


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def run_id_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"run id {text!r} is not an integer") from None
    if not 0 < value < 2**64:
        raise argparse.ArgumentTypeError(f"run id {value} is out of range")
    return value


def message_arg(text: str) -> opb.ChatMessage:
    role, sep, content = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"--message wants ROLE:TEXT, got {text!r}")
    return opb.ChatMessage(role=role, content=content)


def ids_arg(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids wants comma-separated token ids, got {text!r}") from None
    if not ids or min(ids) < 0 or max(ids) >= 2**32:
        raise argparse.ArgumentTypeError(f"--prompt-ids wants token ids in 0..2^32-1, got {text!r}")
    return ids


def add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swactor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=VersionAction)
    p.add_argument("--address", default=os.environ.get("SWACTOR_ADDRESS", DEFAULT_ADDRESS),
                   help=f"orchestrator gRPC address: unix:/path or host:port (default {DEFAULT_ADDRESS})")
    p.add_argument("--tls-ca", default=os.environ.get("SWACTOR_TLS_CA") or None, metavar="PEM",
                   help="TCP API: the certificate (or its CA) to trust; the orchestrator host's tls_cert")
    p.add_argument("--token-file", default=os.environ.get("SWACTOR_TOKEN_FILE") or None, metavar="FILE",
                   help="TCP API: file holding the bearer token (sent only over TLS)")
    p.add_argument("--tls-server-name", default=None, metavar="NAME",
                   help="TCP API: the name to check the certificate for, when it differs from --address's host")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for unary calls (default 10)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("submit", help="start a run")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (one user message in the model's chat template)")
    src.add_argument("--message", action="append", type=message_arg, metavar="ROLE:TEXT",
                     help="a chat message (repeatable)")
    src.add_argument("--prompt-ids", type=ids_arg, metavar="ID,ID,...", help="prompt token ids, sent as is")
    s.add_argument("--raw", action="store_true", help="send --prompt as is, without the chat template")
    s.add_argument("--model", default="", help="model name (default: the orchestrator's default)")
    s.add_argument("--stages", type=positive, default=None, help="pipeline stages (default: the orchestrator's)")
    s.add_argument("--max-tokens", type=positive, default=64)
    s.add_argument("--ignore-eos", action="store_true", help="generate through EOS: stop only at --max-tokens")
    s.add_argument("--node", action="append", type=int, default=[], metavar="NODE_ID",
                   help="place stage k on the k-th --node (repeatable)")
    add_sampling(s)
    s.add_argument("--dry-run", action="store_true",
                   help="print the placement (nodes, blocks, estimated memory per stage) and start nothing")
    s.add_argument("--watch", action="store_true", help="stream the run after submitting")
    s.add_argument("--events", action="store_true", help="with --watch: print lifecycle events to stderr")
    s.add_argument("--json", action="store_true", help="JSON output")

    w = sub.add_parser("watch", help="stream a run until it ends")
    w.add_argument("run_id", type=run_id_arg)
    w.add_argument("--events", action="store_true", help="print lifecycle events to stderr")
    w.add_argument("--json", action="store_true", help="one JSON object per update")

    r = sub.add_parser("runs", help="list runs, newest first")
    r.add_argument("--limit", type=positive, default=20)
    r.add_argument("--json", action="store_true")

    g = sub.add_parser("show", help="one run in detail")
    g.add_argument("run_id", type=run_id_arg)
    g.add_argument("--json", action="store_true")

    e = sub.add_parser("events", help="a run's lifecycle events; without RUN_ID the pool's node events "
                                      "(node_started / node_available / node_faulted)")
    e.add_argument("run_id", type=run_id_arg, nargs="?", default=0)
    e.add_argument("--json", action="store_true")

    n = sub.add_parser("nodes", help="membership view, readiness and GPU inventory")
    n.add_argument("--json", action="store_true")

    m = sub.add_parser("models", help="served models and every host's weights cache")
    m.add_argument("--json", action="store_true")

    t = sub.add_parser("stop", help="operator stop of a run")
    t.add_argument("run_id", type=run_id_arg)
    t.add_argument("--detail", default="operator stop (swactor stop)")
    t.add_argument("--json", action="store_true")

    d = sub.add_parser("demo", help="bring up a local pool and run one prompt end to end")
    d.add_argument("--prompt", default="What is the capital of France?")
    d.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    d.add_argument("--max-tokens", type=positive, default=64)
    d.add_argument("--hosts", type=positive, default=None, help="simulated hosts (default: 3, or --stages if more)")
    d.add_argument("--stages", type=positive, default=None, help="pipeline stages (default: one per host)")
    d.add_argument("--model", type=Path, default=None, metavar="PATH",
                   help="GGUF file to serve (default: the shipped SmolLM2-135M-Instruct Q4_1)")
    add_sampling(d)
    d.add_argument("--json", action="store_true")
    d.add_argument("--events", "--verbose", action="store_true",
                   help="show every lifecycle event on stderr (default: bring-up progress lines and faults only)")
    return p


def _read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CliError(f"{what} {path}: {e.strerror}") from None


def channel(args: argparse.Namespace) -> grpc.Channel:
    """Plain for the Unix socket; TLS (plus the token as call credentials) for the TCP API."""
    if args.tls_ca is None:
        if args.token_file is not None:
            raise CliError("--token-file needs --tls-ca: the token is only ever sent over TLS")
        return grpc.insecure_channel(args.address)
    if args.address.startswith("unix:"):
        raise CliError("--tls-ca is for the TCP API (--address HOST:PORT), not for a Unix socket")
    creds = grpc.ssl_channel_credentials(root_certificates=_read_file(args.tls_ca, "--tls-ca"))
    if args.token_file is not None:
        token = _read_file(args.token_file, "--token-file").decode(errors="replace").strip()
        if not token:
            raise CliError(f"--token-file {args.token_file} is empty")
        # Sends `authorization: Bearer <token>` with every call, over this TLS channel only.
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    options = [("grpc.ssl_target_name_override", args.tls_server_name)] if args.tls_server_name else []
    return grpc.secure_channel(args.address, creds, options)


def _sampling(args: argparse.Namespace) -> opb.Sampling:
    if args.temperature < 0:
        raise CliError(f"--temperature must be >= 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise CliError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.top_k < 0:
        raise CliError(f"--top-k must be >= 0, got {args.top_k}")
    return opb.Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def submit_request(args: argparse.Namespace) -> opb.SubmitRunRequest:
    req = opb.SubmitRunRequest(raw=args.raw, model=args.model, stages=args.stages or 0, max_tokens=args.max_tokens,
                               sampling=_sampling(args), node_ids=args.node, ignore_eos=args.ignore_eos)
    if args.prompt_ids is not None:
        if args.raw:
            raise CliError("--raw applies to --prompt only")
        req.prompt_ids.ids.extend(args.prompt_ids)
    elif args.prompt is not None:
        if not args.prompt.strip():
            raise CliError("--prompt is empty")
        req.prompt = args.prompt
    else:
        if args.raw:
            raise CliError("--raw applies to --prompt only")
        req.messages.messages.extend(args.message)
    return req


def stream(stub, run_id: int, *, events: bool, as_json: bool) -> int:
    out = sys.stdout
    final = None
    updates: Iterator[opb.RunUpdate] = stub.WatchRun(opb.WatchRunRequest(run_id=run_id))
    for u in updates:
        if as_json:
            print(json.dumps(render.as_json(u)), flush=True)
        elif u.HasField("token"):
            out.write(u.token.text)
            out.flush()
        elif u.HasField("event") and events:
            print(render.event_line(u.event), file=sys.stderr, flush=True)
        elif u.HasField("event") and (line := render.download_line(u.event) or render.queue_line(u.event)):
            print(line, file=sys.stderr, flush=True)  # queue position, weights download progress
        if u.HasField("finished"):
            final = u.finished
    if final is None:
        raise CliError(f"the stream for run {run_id} ended without an outcome")
    if not as_json:
        out.write("\n")
        print(render.run_detail(final).splitlines()[0], file=sys.stderr)
        if final.detail:
            print(f"  detail: {final.detail}", file=sys.stderr)
    return {opb.RUN_OUTCOME_COMPLETED: EXIT_OK, opb.RUN_OUTCOME_STOPPED: EXIT_STOPPED}.get(final.outcome, EXIT_RUN_FAILED)


def all_events(stub, run_id: int, timeout: float) -> Iterator[pb.LifecycleEvent]:
    """Every event of a run, a GetEvents page at a time."""
    token = None
    while token != "":
        page = stub.GetEvents(opb.GetEventsRequest(run_id=run_id, page_token=token or ""), timeout=timeout)
        yield from page.events
        token = page.next_page_token


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        _sampling(args)
        if args.hosts is not None and args.stages is not None and args.hosts < args.stages:
            raise CliError(f"--hosts {args.hosts} cannot hold --stages {args.stages} (one stage per host)")
        from swactor.cli.demo import run_demo

        return run_demo(args)
    with channel(args) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        t = args.timeout
        match args.command:
            case "submit" if args.dry_run:
                plan = stub.Plan(submit_request(args), timeout=t)
                print(json.dumps(render.as_json(plan)) if args.json else "\n".join(render.plan_lines(plan)))
                return EXIT_ERROR if plan.refusal else EXIT_OK
            case "submit":
                resp = stub.SubmitRun(submit_request(args), timeout=t)
                if args.json and not args.watch:
                    print(json.dumps(render.as_json(resp)))
                elif not args.watch:
                    print(resp.run_id)
                else:
                    queued = f", queued at position {resp.queue_position}" if resp.queue_position else ""
                    print(f"run {resp.run_id} ({resp.prompt_tokens} prompt tokens{queued})", file=sys.stderr)
                    return stream(stub, resp.run_id, events=args.events, as_json=args.json)
            case "watch":
                return stream(stub, args.run_id, events=args.events, as_json=args.json)
            case "runs":
                runs = stub.ListRuns(opb.ListRunsRequest(limit=args.limit), timeout=t).runs
                for r in runs:
                    print(json.dumps(render.as_json(r)) if args.json else render.run_line(r))
            case "show":
                r = stub.GetRun(opb.GetRunRequest(run_id=args.run_id), timeout=t)
                print(json.dumps(render.as_json(r)) if args.json else render.run_detail(r))
            case "events":
                for ev in all_events(stub, args.run_id, t):
                    print(json.dumps(render.as_json(ev)) if args.json else render.event_line(ev))
            case "nodes":
                resp = stub.ListNodes(opb.ListNodesRequest(), timeout=t)
                if args.json:
                    print(json.dumps(render.as_json(resp)))
                else:
                    for node in resp.nodes:
                        print(render.node_line(node))
                    print(f"pool {'ready' if resp.pool_ready else 'not ready'}: {resp.pool_detail}")
            case "models":
                resp = stub.ListModels(opb.ListModelsRequest(), timeout=max(t, 10.0))
                if args.json:
                    print(json.dumps(render.as_json(resp)))
                else:
                    print("\n".join(render.models_lines(resp)))
            case "stop":
                r = stub.StopRun(opb.StopRunRequest(run_id=args.run_id, detail=args.detail), timeout=t).run
                print(json.dumps(render.as_json(r)) if args.json else render.run_line(r))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return dispatch(args)
    except CliError as e:
        print(f"swactor: {e}", file=sys.stderr)
        return EXIT_ERROR
    except grpc.RpcError as e:
        code, details = e.code(), e.details()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.UNAUTHENTICATED:
            print(f"swactor: UNAUTHENTICATED: {details} (the orchestrator's TCP API wants --token-file "
                  "with the token from its host's token_file)", file=sys.stderr)
        elif code == grpc.StatusCode.UNAVAILABLE:
            print(f"swactor: cannot reach the orchestrator at {args.address} ({details}); "
                  "is swactor-orchestrator running? (--address)", file=sys.stderr)
        else:
            print(f"swactor: {code.name}: {details}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
