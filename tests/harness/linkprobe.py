"""Small traffic probes for link-condition tests, run inside a host's network namespace
(`ip netns exec NS python -m tests.harness.linkprobe ...`, cwd the repository root). Servers print `ready` once
bound; every probe ends with one JSON line on stdout.

    udp-echo  --port P                         echo every datagram back to its sender, until killed
    rtt       --to ADDR:PORT --count N         N request/answer round trips, one at a time: {"rtt_ms": [...]}
    udp-count --port P --idle-s S              count numbered datagrams until S s pass without one:
                                               {"received": n, "in_order": bool}
    udp-send  --to ADDR:PORT --count N         N numbered datagrams, one flow (one socket, one port)
    tcp-sink  --port P                         one connection read to its end: {"bytes": n, "seconds": first..last}
    tcp-send  --to ADDR:PORT --bytes N         send N bytes and close
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time


def _addr(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def _ready() -> None:
    print("ready", flush=True)


def udp_echo(port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    _ready()
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(data, peer)


def rtt(to: tuple[str, int], count: int) -> dict[str, object]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5.0)
    out = []
    for i in range(count):
        t0 = time.monotonic()
        s.sendto(struct.pack("!I", i), to)
        while struct.unpack("!I", s.recv(2048)[:4])[0] != i:  # a late answer to an earlier round
            pass
        out.append((time.monotonic() - t0) * 1000.0)
    return {"rtt_ms": out}


def udp_count(port: int, idle_s: float) -> dict[str, object]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("0.0.0.0", port))
    _ready()
    seqs = []
    s.settimeout(30.0)  # the sender starts after `ready`; a test fails long before this
    while True:
        try:
            seqs.append(struct.unpack("!I", s.recv(2048)[:4])[0])
        except TimeoutError:
            break
        s.settimeout(idle_s)
    return {"received": len(seqs), "in_order": seqs == sorted(seqs)}


def udp_send(to: tuple[str, int], count: int) -> dict[str, object]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(count):
        s.sendto(struct.pack("!I", i) + bytes(60), to)
        time.sleep(0.0005)  # no burst larger than a socket buffer: what is lost is lost to the link
    return {"sent": count}


def tcp_sink(port: int) -> dict[str, object]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    _ready()
    conn, _ = srv.accept()
    total, first, last = 0, 0.0, 0.0
    while chunk := conn.recv(1 << 16):
        last = time.monotonic()
        first = first or last
        total += len(chunk)
    return {"bytes": total, "seconds": last - first}


def tcp_send(to: tuple[str, int], size: int) -> dict[str, object]:
    with socket.create_connection(to, timeout=30.0) as s:
        s.sendall(bytes(size))
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the sink closes once it has read everything
    return {"sent": size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="probe", required=True)
    sub.add_parser("udp-echo").add_argument("--port", type=int, required=True)
    r = sub.add_parser("rtt")
    r.add_argument("--to", type=_addr, required=True)
    r.add_argument("--count", type=int, default=10)
    c = sub.add_parser("udp-count")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--idle-s", type=float, default=1.0)
    u = sub.add_parser("udp-send")
    u.add_argument("--to", type=_addr, required=True)
    u.add_argument("--count", type=int, required=True)
    sub.add_parser("tcp-sink").add_argument("--port", type=int, required=True)
    t = sub.add_parser("tcp-send")
    t.add_argument("--to", type=_addr, required=True)
    t.add_argument("--bytes", type=int, required=True)
    args = p.parse_args(argv)
    match args.probe:
        case "udp-echo":
            udp_echo(args.port)
            return 0
        case "rtt":
            out = rtt(args.to, args.count)
        case "udp-count":
            out = udp_count(args.port, args.idle_s)
        case "udp-send":
            out = udp_send(args.to, args.count)
        case "tcp-sink":
            out = tcp_sink(args.port)
        case _:
            out = tcp_send(args.to, args.bytes)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
