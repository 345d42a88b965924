"""A flood of junk QUIC Initial datagrams from one process, as fast as it can send (issue 13).

    python tests/harness/udp_flood.py HOST PORT [--seconds S]

Each datagram is shaped like a client Initial (long header, version 1, 1200 bytes, a distinct
destination CID among 256 precomputed ones) with noise for a payload: it passes QUIC's header
checks and costs the receiver its admission path. Runs until SIGTERM/SIGINT (or --seconds), then
prints one JSON line: {"sent", "errors", "seconds", "rate"}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

VARIANTS = 256


def junk_initial(dcid: bytes | None = None, token: bytes = b"", size: int = 1200) -> bytes:
    """A datagram shaped like a client Initial (long header, version 1) whose payload is noise."""
    dcid = dcid or os.urandom(8)
    head = bytes([0xC3]) + (1).to_bytes(4, "big") + bytes([len(dcid)]) + dcid + bytes([8]) + os.urandom(8)
    head += (bytes([len(token)]) if len(token) < 64 else (0x4000 | len(token)).to_bytes(2, "big")) + token
    rest = size - len(head) - 2
    return head + (0x4000 | rest).to_bytes(2, "big") + os.urandom(rest)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--seconds", type=float, default=0.0, help="0: until SIGTERM / SIGINT")
    a = p.parse_args()
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    packets = [junk_initial() for _ in range(VARIANTS)]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((a.host, a.port))  # connected: send() skips the per-call address lookup
    send = s.send
    sent = errors = 0
    t0 = time.monotonic()
    end = t0 + a.seconds if a.seconds > 0 else float("inf")
    while not stop:
        for pkt in packets:
            try:
                send(pkt)
            except OSError:  # ICMP errors (refused) and a full queue: count and go on
                errors += 1
        sent += VARIANTS
        if time.monotonic() >= end:
            break
    took = time.monotonic() - t0
    print(json.dumps({"sent": sent - errors, "errors": errors, "seconds": round(took, 3),
                      "rate": round((sent - errors) / took) if took else 0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
