"""A rogue edge peer for the fault suite: a QUIC client that holds a real member's edge identity (its
certificate and key from the host's state dir) and writes crafted bytes on edge streams, so the
receiving edge driver and worker meet wire faults a buggy or compromised member could send
(spec §17, §23, §36). It is a test tool: it runs inside the member host's network namespace (the
fault pool's `ip netns exec`), never in a service.

Run as a child process, driven line by line on stdin; it answers on stdout:

    (start)                          -> "ready <local port>" once the TLS handshake with the peer is done
    open <edge_id> <craft> [args]    -> "opened <stream id>": a uni-stream with the edge's preamble,
                                        then the craft's bytes (below); FIN where the craft ends it
    reset <stream id> <code>         -> "reset <stream id>": RESET_STREAM with application code <code>
    (from the peer)                  -> "stop_sending <stream id> <code>", "closed <reason>"
    (stdin closed)                   -> the connection is closed and the process exits

Crafts (`row` is the activation row in bytes, the edge's smallest valid extent):
    bad_magic                 a 40-byte header whose magic is wrong                 (HEADER_MALFORMED)
    over_max <max_extent>     a valid header whose extent is max_extent + row       (EXTENT_EXCEEDS_MAX)
    sequence <row> <seq>      a valid one-row object numbered <seq> (the edge expects 0 first)
    eof_mid <row>             a one-row header, half the row, then FIN              (EOF_MID_OBJECT)
    partial <row>             a one-row header and half the row, stream left open (then `reset`)
    object <row>              a complete valid one-row object numbered 0, stream left open
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
from pathlib import Path

from aioquic.asyncio import QuicConnectionProtocol, connect
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration

import swactor_ring as sr
from swactor.edge import preamble
from swactor.edge.config import ALPN
from swactor.edge.identity import default_paths, load_identity


def header(sequence: int, extent: int, object_id: int = 0x5E0) -> bytes:
    return bytes(sr.ObjectHeader(object_id + sequence, sequence, extent, 0).encode())


def craft(name: str, args: list[int]) -> tuple[bytes, bool]:
    """The bytes after the preamble, and whether the stream ends (FIN) after them."""
    if name == "bad_magic":
        good = header(0, 64)
        return b"XXXX" + good[4:], False
    if name == "over_max":
        (max_extent,) = args
        return header(0, max_extent + 4096), False
    if name == "sequence":
        row, seq = args
        return header(seq, row) + bytes(row), False
    if name == "eof_mid":
        (row,) = args
        return header(0, row) + bytes(row // 2), True
    if name == "partial":
        (row,) = args
        return header(0, row) + bytes(row // 2), False
    if name == "object":
        (row,) = args
        return header(0, row) + bytes(row), False
    raise ValueError(f"unknown craft {name!r}")


class Rogue(QuicConnectionProtocol):
    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StopSendingReceived):
            say(f"stop_sending {event.stream_id} {event.error_code}")
        elif isinstance(event, events.ConnectionTerminated):
            say(f"closed {event.reason_phrase or event.error_code}")


def say(line: str) -> None:
    print(line, flush=True)


async def serve(rogue: Rogue) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        cmd, *rest = line.split()
        quic = rogue._quic
        if cmd == "open":
            edge_id, name, args = int(rest[0]), rest[1], [int(a) for a in rest[2:]]
            data, end = craft(name, args)
            sid = quic.get_next_available_stream_id(is_unidirectional=True)
            quic.send_stream_data(sid, preamble.encode(edge_id) + data, end_stream=end)
            rogue.transmit()
            say(f"opened {sid}")
        elif cmd == "reset":
            sid, code = int(rest[0]), int(rest[1])
            quic.reset_stream(sid, code)
            rogue.transmit()
            say(f"reset {sid}")
        else:
            say(f"error unknown command {cmd!r}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir", type=Path, required=True, help="the impersonated member's state dir")
    ap.add_argument("--peer", required=True, help="host:port of the receiving edge driver")
    a = ap.parse_args()
    identity = load_identity(*default_paths(a.state_dir))
    cfg = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE,
                            server_name="rogue", idle_timeout=10.0)
    cfg.certificate, cfg.private_key = identity.certificate, identity.private_key
    host, port = a.peer.rsplit(":", 1)
    async with connect(host, int(port), configuration=cfg, create_protocol=Rogue) as rogue:
        say(f"ready {rogue._transport.get_extra_info('sockname')[1]}")  # type: ignore[attr-defined]
        await serve(rogue)  # type: ignore[arg-type]
        rogue.close()


if __name__ == "__main__":
    asyncio.run(main())
