"""`python -m swactor.localcluster [--hosts N] [--keep]`: bring up a local pool, print how to reach
it, and hold it until Ctrl-C or SIGTERM (then tear everything down; exit 130 / 143)."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from swactor.common.events import configure_logging
from swactor.localcluster.cluster import DEFAULT_MODEL, ClusterError, ClusterSpec, LocalCluster
from swactor.localcluster.signals import EXIT_TERMINATED, Terminated, terminate_on_sigterm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m swactor.localcluster", description=__doc__)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--device", default="CPU", help="tinygrad device of the workers (default CPU)")
    p.add_argument("--compute-threads", type=int, default=0,
                   help="CPU cores per worker's compute kernels (default 0: all cores, at most 8; stages compute in turn)")
    p.add_argument("--readiness-timeout", type=float, default=120.0,
                   help="seconds a run's stages may take to become ready before the run faults (default 120)")
    p.add_argument("--loopback", action="store_true", help="loopback addresses even when root")
    p.add_argument("--dir", type=Path, help="cluster directory (default: a temp dir removed at exit)")
    p.add_argument("--keep", action="store_true", help="keep the cluster directory (logs) at exit")
    args = p.parse_args(argv)
    spec = ClusterSpec(hosts=args.hosts, model=args.model, device=args.device, base_dir=args.dir, keep=args.keep,
                       netns=False if args.loopback else None, compute_threads=args.compute_threads,
                       readiness_timeout_s=args.readiness_timeout)
    configure_logging("swactor-localcluster")
    try:
        cluster = LocalCluster(spec, progress=lambda s: print(s, file=sys.stderr, flush=True))
    except (ValueError, ClusterError) as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return 2
    terminate_on_sigterm()
    try:
        with cluster as c:
            print(f"swactor --address {c.orchestrator_address} nodes", flush=True)
            threading.Event().wait()
    except ClusterError as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return 1
    except Terminated:
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
