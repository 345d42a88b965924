"""NFQUEUE delay on one port's outgoing packets, for tests: the local pool's link delayer
(swactor.localcluster.linkdelay) with a fixed delay, behind an iptables rule for that port only.

    python -m tests.harness.nfqueue_delay --queue 3 --delay-ms 20 --udp-sport 7400
    python -m tests.harness.nfqueue_delay --queue 4 --delay-ms 30 --tcp-sport 7442

run inside a network namespace, binds queue 3 there, adds `iptables -A OUTPUT -p udp --sport 7400 -j NFQUEUE
--queue-num 3 --queue-bypass` (or `-p tcp`) and gives every outgoing packet of that port `delay-ms` of one-way
delay, released in arrival order. It prints `ready` once bound and the rule is in, and removes its rule on
SIGTERM/SIGINT. Needs root and the `iptables` (nft backend) binary.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkdelay import LinkDelayer


def _rule(action: str, queue: int, sport: int, proto: str = "udp") -> list[str]:
    return ["iptables", action, "OUTPUT", "-p", proto, "--sport", str(sport), "-j", "NFQUEUE",
            "--queue-num", str(queue), "--queue-bypass"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--queue", type=int, default=3)
    p.add_argument("--delay-ms", type=float, required=True)
    port = p.add_mutually_exclusive_group(required=True)
    port.add_argument("--udp-sport", type=int, help="delay outgoing UDP from this source port")
    port.add_argument("--tcp-sport", type=int, help="delay outgoing TCP from this source port")
    args = p.parse_args(argv)
    proto, sport = ("udp", args.udp_sport) if args.udp_sport is not None else ("tcp", args.tcp_sport)
    delayer = LinkDelayer(args.queue, LinkConditions(delay_ms=args.delay_ms))
    subprocess.run(_rule("-A", args.queue, sport, proto), check=True, capture_output=True)
    signal.signal(signal.SIGTERM, lambda *_: delayer.stop())
    signal.signal(signal.SIGINT, lambda *_: delayer.stop())
    print("ready", flush=True)
    try:
        delayer.run()
    finally:
        subprocess.run(_rule("-D", args.queue, sport, proto), capture_output=True)
        delayer.release_all()  # what was queued while the rule went
        delayer.close()
    print(f"released {delayer.released}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
