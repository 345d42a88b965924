"""`python -m swactor.localcluster [--hosts N] [--keep] [--link-delay-ms MS ...]`: bring up a local pool (the links
between its hosts at the given conditions), print how to reach it, and hold it until Ctrl-C, SIGTERM or SIGHUP (then
tear everything down; exit 130 / 143 / 129). Killed any other way, its reaper removes the pool within a second."""

from __future__ import annotations

import sys
from pathlib import Path

from swactor.cli.args import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    Parser,
    add_link_conditions,
    far_host,
    integer,
    link_conditions,
    local_path,
    number,
    text,
)
from swactor.common.events import configure_logging
from swactor.localcluster.cluster import DEFAULT_MODEL, ClusterError, ClusterSpec, LocalCluster
from swactor.localcluster.layout import MAX_HOSTS
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.signals import Terminated, hold_until_signalled, terminate_on_signals
from swactor.modelfile.memory import MAX_RUN_SLOTS


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m swactor.localcluster", description=__doc__)
    p.add_argument("--hosts", type=integer(1, MAX_HOSTS), default=3, help=f"simulated hosts, 1..{MAX_HOSTS} (default 3)")
    p.add_argument("--model", type=local_path, default=str(DEFAULT_MODEL), metavar="PATH")
    p.add_argument("--device", type=text, default="CPU", help="tinygrad device of the workers (default CPU)")
    p.add_argument("--compute-threads", type=integer(0, 1024), default=0,
                   help="CPU cores per worker's compute kernels (default 0: all cores, at most 8; stages compute in turn)")
    p.add_argument("--readiness-timeout", type=number(0.0, 86400.0, lo_open=True), default=120.0,
                   help="seconds a run's stages may take to become ready before the run faults (default 120)")
    p.add_argument("--slots", type=integer(1, MAX_RUN_SLOTS), default=1,
                   help="runs in flight each stage holds, batched (default 1; each stage compiles a graph per batch "
                        "width at its load, about 15 s a width on a CPU the first time)")
    p.add_argument("--loopback", action="store_true", help="loopback addresses even when root")
    p.add_argument("--dir", type=local_path, metavar="DIR", help="cluster directory (default: a temp dir removed at exit)")
    p.add_argument("--keep", action="store_true", help="keep the cluster directory (logs) at exit")
    p.add_argument("--openai-port", type=integer(1, 65535), default=8000,
                   help="serve the OpenAI-compatible API (swactor-gateway) on 127.0.0.1:PORT (default 8000)")
    p.add_argument("--no-openai", action="store_true", help="no OpenAI-compatible API")
    add_link_conditions(p)
    p.add_argument("--far-host", type=far_host, action="append", default=[], metavar="H=RTT_MS",
                   help="host H (0..hosts-1) is RTT_MS of round trip from every other host, which keep the --link-* "
                        "conditions (its arrivals are held that long; repeatable): try placement beside a far host")
    p.add_argument("--nat", action="store_true",
                   help="every host behind NAT: its services advertise their port + 10000, reachable from other hosts "
                        "only through that mapping (nft in each namespace; docs/operations.md)")
    args = p.parse_args(argv)
    try:
        links = link_conditions(args)
    except CliError as e:
        p.error(str(e))
    if args.loopback and (links.shaped or args.far_host or args.nat):
        what = "the --link-* conditions need" if links.shaped else "--far-host needs" if args.far_host else "--nat needs"
        p.error(f"{what} network namespaces: not with --loopback")
    if (bad := [h for h, _ in args.far_host if h >= args.hosts]):
        p.error(f"argument --far-host: host {bad[0]} is not one of the {args.hosts} host(s) 0..{args.hosts - 1}")
    host_links = {h: LinkConditions(delay_ms=float(ms)) for h, ms in args.far_host}
    spec = ClusterSpec(hosts=args.hosts, model=Path(args.model), device=args.device,
                       base_dir=Path(args.dir) if args.dir else None, keep=args.keep,
                       netns=False if args.loopback else None, compute_threads=args.compute_threads,
                       readiness_timeout_s=args.readiness_timeout, links=links, host_links=host_links,
                       slots=args.slots, nat=True if args.nat else None,
                       openai_port=None if args.no_openai else args.openai_port)
    configure_logging("swactor-localcluster")
    try:
        cluster = LocalCluster(spec, progress=lambda s: print(s, file=sys.stderr, flush=True))
    except (ValueError, ClusterError) as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return EXIT_USAGE
    terminate_on_signals()
    try:
        with cluster as c:
            print(f"swactor --address {c.orchestrator_address} nodes", flush=True)
            hold_until_signalled()
    except ClusterError as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return EXIT_FAILED
    except Terminated as e:
        return e.exit_status
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
