"""Repeated QUIC handshakes with a certificate that is no member's (issue 13), one after another.

    python tests/harness/bad_handshakes.py HOST PORT [--seconds S] [--concurrency N]

A real aioquic client (it answers Retry) presents a fresh self-signed edge certificate of a node
nobody knows; the driver must refuse each in TLS. Runs until SIGTERM/SIGINT (or --seconds), then
prints one JSON line: {"attempts", "refused", "accepted", "unanswered", "closed", "timeouts",
"seconds"} (what each attempt came to: `one`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import ssl
import sys
import tempfile
import time
from pathlib import Path

from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration

from swactor.edge.config import ALPN
from swactor.edge.identity import create_identity

BAD_CERTIFICATE = 0x100 + 42  # CRYPTO_ERROR + TLS alert bad_certificate: the driver's refusal


async def one(host: str, port: int, cfg: QuicConfiguration) -> str:
    """One handshake: "refused" (the driver closed it with bad_certificate), "accepted" (still open
    2 s after the handshake: a hole), "unanswered" (no handshake within the client's idle timeout:
    under a flood a stranger's Initials mostly meet the kernel filter or a spent Retry budget), or
    "closed" (closed for another reason)."""
    try:
        async with connect(host, port, configuration=cfg, wait_connected=True) as c:
            try:
                await asyncio.wait_for(c.wait_closed(), 2)
            except TimeoutError:
                return "accepted"
            ev = c._quic._close_event  # aioquic keeps why the connection ended
            return "refused" if ev is not None and ev.error_code == BAD_CERTIFICATE else "closed"
    except ConnectionError:  # aioquic: terminated before the handshake completed
        return "unanswered"


async def run(a: argparse.Namespace) -> dict[str, float]:
    d = Path(tempfile.mkdtemp(prefix="badcert"))
    ident = create_identity(d / "cert.pem", d / "key.pem", 999_999)
    cfg = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE, idle_timeout=3.0)
    cfg.certificate, cfg.private_key = ident.certificate, ident.private_key
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    counts = {"attempts": 0, "refused": 0, "accepted": 0, "unanswered": 0, "closed": 0, "timeouts": 0}
    t0 = time.monotonic()

    async def worker() -> None:
        while not stop.is_set() and (a.seconds <= 0 or time.monotonic() - t0 < a.seconds):
            counts["attempts"] += 1
            try:
                counts[await asyncio.wait_for(one(a.host, a.port, cfg), 5)] += 1
            except TimeoutError:
                counts["timeouts"] += 1

    tasks = [asyncio.ensure_future(worker()) for _ in range(a.concurrency)]
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED if a.seconds <= 0 else asyncio.ALL_COMPLETED)
    for t in [*tasks, waiter]:
        t.cancel()
    await asyncio.gather(*tasks, waiter, return_exceptions=True)
    return {**counts, "seconds": round(time.monotonic() - t0, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--seconds", type=float, default=0.0, help="0: until SIGTERM / SIGINT")
    p.add_argument("--concurrency", type=int, default=2)
    print(json.dumps(asyncio.run(run(p.parse_args()))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
