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
import time
import uuid
from collections.abc import Iterator
from importlib import metadata

import grpc

from swactor import __version__
from swactor.cli import render
from swactor.cli.args import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STATUSES,
    EXIT_STOPPED,
    INT32_MAX,
    UINT32_MAX,
    UINT64_MAX,
    CliError,
    Parser,
    add_link_conditions,
    add_sampling,
    address,
    chat_message,
    host_name,
    integer,
    local_path,
    number,
    run_id,
    text,
    token_ids,
)
from swactor.common.objflags import DEFAULT_DRAFT, MAX_DRAFT
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

DEFAULT_ADDRESS = "unix:/run/swactor/orchestrator.sock"
VERSIONED = ("grpcio", "protobuf", "gguf", "tinygrad", "numpy", "aioquic", "regex")
# A SubmitRun that timed out or lost its connection may still have created the run: it is sent again with the same
# client_request_id, which the orchestrator answers with the first run instead of a second one.
RETRIED_CODES = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})
DRAFTERS = {"auto": opb.DRAFTER_AUTO, "prompt-lookup": opb.DRAFTER_PROMPT_LOOKUP, "draft-model": opb.DRAFTER_DRAFT_MODEL}


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


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="swactor", description=__doc__, epilog=EXIT_STATUSES,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=VersionAction)
    p.add_argument("--address", type=address, default=os.environ.get("SWACTOR_ADDRESS") or DEFAULT_ADDRESS,
                   help=f"orchestrator gRPC address: unix:/path or host:port (default {DEFAULT_ADDRESS})")
    p.add_argument("--tls-ca", default=os.environ.get("SWACTOR_TLS_CA") or None, metavar="PEM",
                   help="TCP API: the certificate (or its CA) to trust; the orchestrator host's tls_cert")
    p.add_argument("--token-file", default=os.environ.get("SWACTOR_TOKEN_FILE") or None, metavar="FILE",
                   help="TCP API: file holding the bearer token (sent only over TLS)")
    p.add_argument("--tls-server-name", type=host_name, default=None, metavar="NAME",
                   help="TCP API: the name to check the certificate for, when it differs from --address's host")
    p.add_argument("--timeout", type=number(0.0, 86400.0, lo_open=True), default=10.0,
                   help="seconds for unary calls (default 10)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("submit", help="start a run")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=text, help="prompt text (one user message in the model's chat template)")
    src.add_argument("--message", action="append", type=chat_message, metavar="ROLE:TEXT",
                     help="a chat message (repeatable); ROLE is system, user, assistant or tool")
    src.add_argument("--prompt-ids", type=token_ids, metavar="ID,ID,...", help="prompt token ids, sent as is")
    s.add_argument("--raw", action="store_true", help="send --prompt as is, without the chat template")
    s.add_argument("--model", type=text, default="", help="model name (default: the orchestrator's default)")
    s.add_argument("--stages", type=integer(1, UINT32_MAX), default=None,
                   help="pipeline stages (default: the orchestrator's)")
    s.add_argument("--max-tokens", type=integer(1, INT32_MAX), default=64)
    s.add_argument("--ignore-eos", action="store_true", help="generate through EOS: stop only at --max-tokens")
    s.add_argument("--resume", action="store_true",
                   help="outlive a lost host: a run faulted by a stage host, worker or edge goes on as a new run on "
                        "the healthy nodes, from the tokens already delivered (--watch follows it)")
    s.add_argument("--speculate", type=integer(0, MAX_DRAFT), nargs="?", const=DEFAULT_DRAFT, default=0, metavar="N",
                   help=f"speculative decoding: verify up to N drafted tokens per step (default N {DEFAULT_DRAFT}); "
                        f"the tokens are those of the run without it, faster when the drafts are right")
    s.add_argument("--drafter", choices=DRAFTERS, default="auto",
                   help="who drafts for --speculate: the orchestrator's draft model when it has one that fits the "
                        "model (auto), or prompt lookup (n-grams of the prompt and output), or the draft model")
    s.add_argument("--max-context", type=integer(1, UINT32_MAX), default=0, metavar="TOKENS",
                   help="the run's own context: prompt and generated tokens at most this many (default: the model's)")
    s.add_argument("--node", action="append", type=integer(1, UINT64_MAX), default=[], metavar="NODE_ID",
                   help="place stage k on the k-th --node (repeatable; a node named twice carries two stages, on its "
                        "stage devices 0 and 1)")
    add_sampling(s)
    s.add_argument("--dry-run", action="store_true",
                   help="print the placement (nodes, blocks, estimated memory per stage) and start nothing")
    s.add_argument("--retries", type=integer(0, 10), default=3,
                   help="resend SubmitRun this often after a timeout or a lost connection, with the same request id "
                        "(the orchestrator then answers with the run already made; default 3)")
    s.add_argument("--watch", action="store_true", help="stream the run after submitting")
    s.add_argument("--events", action="store_true", help="with --watch: print lifecycle events to stderr")
    s.add_argument("--stop-on-interrupt", action="store_true",
                   help="with --watch: Ctrl-C stops the run (default: the run goes on, and the CLI says how to stop it)")
    s.add_argument("--json", action="store_true", help="JSON output")

    w = sub.add_parser("watch", help="stream a run until it ends")
    w.add_argument("run_id", type=run_id)
    w.add_argument("--events", action="store_true", help="print lifecycle events to stderr")
    w.add_argument("--stop-on-interrupt", action="store_true", help="Ctrl-C stops the run (default: it goes on)")
    w.add_argument("--json", action="store_true", help="one JSON object per update")

    r = sub.add_parser("runs", help="list runs, newest first")
    r.add_argument("--limit", type=integer(1, 1000), default=20, help="at most this many (1..1000, default 20)")
    r.add_argument("--json", action="store_true")

    g = sub.add_parser("show", help="one run in detail")
    g.add_argument("run_id", type=run_id)
    g.add_argument("--json", action="store_true")

    e = sub.add_parser("events", help="a run's lifecycle events; without RUN_ID the pool's node events "
                                      "(node_started / node_available / node_faulted)")
    e.add_argument("run_id", type=run_id, nargs="?", default=0)
    e.add_argument("--json", action="store_true")

    n = sub.add_parser("nodes", help="membership view, readiness and GPU inventory")
    n.add_argument("--json", action="store_true")

    m = sub.add_parser("models", help="served models and every host's weights cache")
    m.add_argument("--json", action="store_true")

    t = sub.add_parser("stop", help="operator stop of a run")
    t.add_argument("run_id", type=run_id)
    t.add_argument("--detail", type=text, default="operator stop (swactor stop)")
    t.add_argument("--json", action="store_true")

    from swactor.localcluster.layout import MAX_HOSTS

    d = sub.add_parser("demo", help="bring up a local pool and run one prompt end to end",
                       description="Bring up a local pool of simulated hosts, run one prompt, tear everything down. "
                                   "Everything is checked against the model's header and this machine first.")
    d.add_argument("--prompt", type=text, default="What is the capital of France?")
    d.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    d.add_argument("--max-tokens", type=integer(1, INT32_MAX), default=64)
    d.add_argument("--hosts", type=integer(1, MAX_HOSTS), default=None,
                   help=f"simulated hosts, at most {MAX_HOSTS} (default: 3, or --stages if more)")
    d.add_argument("--stages", type=integer(1, UINT32_MAX), default=None,
                   help="pipeline stages (default: one per host)")
    d.add_argument("--model", type=local_path, default=None, metavar="PATH",
                   help="GGUF file to serve (default: the shipped SmolLM2-135M-Instruct Q4_1)")
    add_sampling(d)
    d.add_argument("--json", action="store_true")
    d.add_argument("--events", "--verbose", action="store_true",
                   help="show every lifecycle event on stderr (default: bring-up progress lines and faults only)")
    d.add_argument("--serve", action="store_true",
                   help="after the answer, keep the pool up and serve the OpenAI-compatible API on 127.0.0.1 until "
                        "Ctrl-C (docs/demo.md)")
    d.add_argument("--openai-port", type=integer(1, 65535), default=8000,
                   help="with --serve: the OpenAI API's port (default 8000)")
    add_link_conditions(d)
    return p


def _read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CliError(f"{what} {path}: {e.strerror}") from None


def trusted_certificates(path: str) -> bytes:
    """--tls-ca's bytes, refused by name unless they hold a PEM certificate: gRPC would only say "unavailable"."""
    from cryptography import x509

    data = _read_file(path, "--tls-ca")
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CliError(f"--tls-ca {path} is not a PEM certificate (want the orchestrator host's "
                       "/etc/swactor/api/cert.pem, or its CA)") from None
    return data


def channel(args: argparse.Namespace) -> grpc.Channel:
    """Plain for the Unix socket; TLS (plus the token as call credentials) for the TCP API."""
    if args.tls_ca is None:
        if args.token_file is not None:
            raise CliError("--token-file needs --tls-ca: the token is only ever sent over TLS")
        return grpc.insecure_channel(args.address)
    if args.address.startswith("unix:"):
        raise CliError("--tls-ca is for the TCP API (--address HOST:PORT), not for a Unix socket")
    creds = grpc.ssl_channel_credentials(root_certificates=trusted_certificates(args.tls_ca))
    if args.token_file is not None:
        raw = _read_file(args.token_file, "--token-file").strip()
        if not raw:
            raise CliError(f"--token-file {args.token_file} is empty")
        try:
            token = raw.decode("ascii")
        except UnicodeDecodeError:
            raise CliError(f"--token-file {args.token_file} does not hold a token (not ASCII text)") from None
        # Sends `authorization: Bearer <token>` with every call, over this TLS channel only.
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    options = [("grpc.ssl_target_name_override", args.tls_server_name)] if args.tls_server_name else []
    return grpc.secure_channel(args.address, creds, options)


def sampling(args: argparse.Namespace) -> opb.Sampling:
    """The run's sampling; no --seed leaves the seed unset, so a sampled run gets a recorded random one."""
    s = opb.Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.seed is not None:
        s.seed = args.seed
    return s


def submit_request(args: argparse.Namespace) -> opb.SubmitRunRequest:
    req = opb.SubmitRunRequest(raw=args.raw, model=args.model, stages=args.stages or 0, max_tokens=args.max_tokens,
                               sampling=sampling(args), node_ids=args.node, ignore_eos=args.ignore_eos,
                               max_context=args.max_context, resume=args.resume, speculate=args.speculate,
                               drafter=DRAFTERS[args.drafter])
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


def submit(stub, req: opb.SubmitRunRequest, timeout: float, retries: int) -> opb.SubmitRunResponse:
    """SubmitRun under one client request id, resent after a timeout or a lost connection (never a second run)."""
    req.client_request_id = req.client_request_id or uuid.uuid4().hex
    for attempt in range(retries + 1):
        try:
            return stub.SubmitRun(req, timeout=timeout)
        except grpc.RpcError as e:
            code = e.code()  # type: ignore[attr-defined]
            if code not in RETRIED_CODES or attempt == retries:
                raise
            pause = min(0.5 * 2**attempt, 4.0)
            print(f"swactor: SubmitRun {code.name}; sending it again in {pause:g} s with the same request id "
                  f"{req.client_request_id} ({attempt + 1}/{retries})", file=sys.stderr, flush=True)
            time.sleep(pause)
    raise AssertionError("unreachable")


def stream(stub, run_id: int, *, events: bool, as_json: bool) -> int:
    out = sys.stdout
    final = None
    # The answer alone needs no per-token TOKEN_RECEIVED events: half the messages.
    request = opb.WatchRunRequest(run_id=run_id, omit_object_events=not (events or as_json))
    updates: Iterator[opb.RunUpdate] = stub.WatchRun(request)
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
        raise CliError(f"the stream for run {run_id} ended without an outcome", EXIT_FAILED)
    if not as_json:
        out.write("\n")
        print(render.run_detail(final).splitlines()[0], file=sys.stderr)
        if final.detail:
            print(f"  detail: {final.detail}", file=sys.stderr)
        if seed := render.seed_line(final):
            print(f"  {seed}", file=sys.stderr)
    return {opb.RUN_OUTCOME_COMPLETED: EXIT_OK, opb.RUN_OUTCOME_STOPPED: EXIT_STOPPED}.get(final.outcome, EXIT_FAILED)


def follow(stub, args: argparse.Namespace, run: int) -> int:
    """Stream a run; Ctrl-C leaves it running and says how to stop it, or stops it with --stop-on-interrupt."""
    try:
        return stream(stub, run, events=args.events, as_json=args.json)
    except KeyboardInterrupt:
        pass
    sys.stdout.write("\n")
    if not args.stop_on_interrupt:
        print(f"swactor: interrupted; run {run} goes on in the pool. Follow it again with `swactor watch {run}`, "
              f"stop it with `swactor stop {run}`", file=sys.stderr)
        return EXIT_INTERRUPTED
    stopped = stub.StopRun(opb.StopRunRequest(run_id=run, detail="swactor watch interrupted (--stop-on-interrupt)"),
                           timeout=args.timeout).run
    print(f"swactor: interrupted; stopped run {run}: {render.run_line(stopped)}", file=sys.stderr)
    return EXIT_INTERRUPTED


def all_events(stub, run_id: int, timeout: float) -> Iterator[pb.LifecycleEvent]:
    """Every event of a run, a GetEvents page at a time."""
    token = None
    while token != "":
        page = stub.GetEvents(opb.GetEventsRequest(run_id=run_id, page_token=token or ""), timeout=timeout)
        yield from page.events
        token = page.next_page_token


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from swactor.cli.demo import preflight, run_demo

        return run_demo(args, preflight(args))
    if getattr(args, "stop_on_interrupt", False) and args.command == "submit" and not args.watch:
        raise CliError("--stop-on-interrupt applies to --watch only")
    with channel(args) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        t = args.timeout
        match args.command:
            case "submit" if args.dry_run:
                plan = stub.Plan(submit_request(args), timeout=t)
                print(json.dumps(render.as_json(plan)) if args.json else "\n".join(render.plan_lines(plan)))
                return EXIT_FAILED if plan.refusal else EXIT_OK
            case "submit":
                resp = submit(stub, submit_request(args), t, args.retries)
                if args.json and not args.watch:
                    print(json.dumps(render.as_json(resp)))
                elif not args.watch:
                    print(resp.run_id)
                else:
                    queued = f", queued at position {resp.queue_position}" if resp.queue_position else ""
                    print(f"run {resp.run_id} ({resp.prompt_tokens} prompt tokens{queued})", file=sys.stderr)
                    return follow(stub, args, resp.run_id)
            case "watch":
                return follow(stub, args, args.run_id)
            case "runs":
                runs = stub.ListRuns(opb.ListRunsRequest(limit=args.limit), timeout=t).runs
                for r in runs:
                    print(json.dumps(render.as_json(r)) if args.json else render.run_line(r))
                if not args.json and (held := render.slots_line(stub.ListNodes(opb.ListNodesRequest(), timeout=t).nodes)):
                    print(held)
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
                    print("\n".join(render.rtt_lines(resp)))
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


def rpc_failure(e: grpc.RpcError, address: str) -> str:
    code, details = e.code(), e.details()  # type: ignore[attr-defined]
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return (f"UNAUTHENTICATED: {details} (the orchestrator's TCP API wants --token-file with the token from its "
                "host's token_file)")
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the orchestrator at {address} ({details}); is swactor-orchestrator running? (--address)"
    return f"{code.name}: {details}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    who = f"swactor {args.command}"  # as argparse names the command in its own refusals
    try:
        return dispatch(args)
    except CliError as e:
        print(f"{who}: {e}", file=sys.stderr)
        return e.status
    except grpc.RpcError as e:
        print(f"{who}: {rpc_failure(e, args.address)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout was closed early (`swactor events | head`): quiet, and no second error at interpreter exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:  # the last line of defence: one line, never a traceback (SWACTOR_DEBUG=1 shows it)
        if os.environ.get("SWACTOR_DEBUG"):
            raise
        print(f"{who}: internal error: {type(e).__name__}: {e} (SWACTOR_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
