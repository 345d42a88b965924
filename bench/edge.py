"""Edge-driver benchmark: two real `swactor-edge` processes (each with its own arena) on loopback.

    .venv/bin/python bench/edge.py [--bulk-mib 256] [--rounds 2000] [--profile]

Figures, each next to raw TCP over the same path (127.0.0.1) in the same run, with ratios:
  * bulk MB/s with 1 MiB objects (producer ring -> QUIC -> consumer ring, 4 MiB rings);
  * one-way latency from producer commit to consumer-readable for 2 KiB and 8 KiB objects
    (one object in flight; p50/p99 over --rounds objects).
  * QUIC handshake time between members (a fresh connection dialled --handshakes times, two drivers
    in this process on 127.0.0.1; p50/p99), the path issue 13's admission control must keep fast.
Aims (docs/edge.md): one-way 2 KiB <= 0.3 ms; bulk >= 0.1x TCP. --profile runs both drivers under
cProfile and prints where their time goes.
"""

from __future__ import annotations

import argparse
import os
import pstats
import select
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import swactor_ring as sr  # noqa: E402
from swactor.v1 import common_pb2, edge_pb2  # noqa: E402
from tests.edge.cluster import EdgeHost, EventTap, wait_fd, write_all, write_peers  # noqa: E402

EGRESS, INGRESS = common_pb2.RING_DIRECTION_EGRESS, common_pb2.RING_DIRECTION_INGRESS


def edge(a: EdgeHost, b: EdgeHost, edge_id: int, capacity: int) -> tuple[sr.Producer, sr.Consumer]:
    lt, lr = a.lease(edge_id, capacity, EGRESS), b.lease(edge_id, capacity, INGRESS)
    b.stub.EstablishRecv(edge_pb2.EstablishRecvRequest(edge_id=edge_id, ring_id=lr.ring_id, ring_layout=lr, tx_node_id=a.node_id))  # type: ignore[union-attr]
    a.stub.EstablishSend(  # type: ignore[union-attr]
        edge_pb2.EstablishSendRequest(edge_id=edge_id, rx_node_id=b.node_id, ring_id=lt.ring_id, ring_layout=lt)
    )
    return a.producer(lt), b.consumer(lr)


def bulk_edge(prod: sr.Producer, cons: sr.Consumer, total: int) -> float:
    obj = os.urandom(1 << 20)
    got = [0]

    def reader() -> None:
        buf = bytearray(1 << 20)
        while got[0] < total:
            n = cons.read_into(buf)
            if n:
                got[0] += n
            elif not cons.arm_readable():
                wait_fd(cons.readable_fd, 0.5)
                cons.ack_wake()

    t = threading.Thread(target=reader, daemon=True)
    t0 = time.perf_counter()
    t.start()
    for _ in range(total >> 20):
        write_all(prod, memoryview(obj), time.monotonic() + 60)
    t.join(120)
    assert got[0] == total, f"bulk: {got[0]} of {total} bytes"
    return total / (time.perf_counter() - t0) / 1e6


def latency_edge(prod: sr.Producer, cons: sr.Consumer, size: int, rounds: int) -> list[float]:
    obj = os.urandom(size)
    buf = bytearray(size)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        assert prod.write(obj) == size
        got = 0
        while got < size:
            n = cons.read_into(memoryview(buf)[got:])
            got += n
            if got < size and not n and not cons.arm_readable():
                wait_fd(cons.readable_fd, 1.0)
                cons.ack_wake()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def bulk_tcp(total: int) -> float:
    a, b = tcp_pair()
    obj = os.urandom(1 << 20)

    def reader() -> None:
        buf = bytearray(1 << 20)
        got = 0
        while got < total:
            got += b.recv_into(buf)

    t = threading.Thread(target=reader, daemon=True)
    t0 = time.perf_counter()
    t.start()
    for _ in range(total >> 20):
        a.sendall(obj)
    t.join(60)
    rate = total / (time.perf_counter() - t0) / 1e6
    a.close()
    b.close()
    return rate


def latency_tcp(size: int, rounds: int) -> list[float]:
    a, b = tcp_pair()
    obj = os.urandom(size)
    buf = bytearray(size)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a.sendall(obj)
        got = 0
        while got < size:
            select.select([b], [], [], 1.0)
            got += b.recv_into(memoryview(buf)[got:])
        out.append((time.perf_counter() - t0) * 1e3)
    a.close()
    b.close()
    return out


async def handshake_times(n: int, tmp: Path, **cfg: object) -> list[float]:
    """Milliseconds per fresh member-to-member dial (each connection closed and forgotten before the next)."""
    from tests.edge.inproc import start_nodes, stop_nodes, until

    nodes = await start_nodes(tmp, 2, **cfg)
    a, b = nodes
    out = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            conn = await a.driver.endpoint.connection_to(b.node_id)
            out.append((time.perf_counter() - t0) * 1e3)
            conn.close()
            await until(lambda: not a.driver.endpoint.connections and not b.driver.endpoint.connections,
                        "both drivers forgot the connection")
    finally:
        await stop_nodes(nodes)
    return out


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bulk-mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--profile", action="store_true", help="run both drivers under cProfile and print the top")
    p.add_argument("--max-datagram-size", type=int, default=0)
    p.add_argument("--uvloop", action="store_true", help="run both drivers on uvloop")
    p.add_argument("--handshakes", type=int, default=50, help="fresh member dials to time (0: skip)")
    args = p.parse_args()
    if args.handshakes:
        import asyncio
        import logging

        from swactor.common.events import configure_logging

        configure_logging("edge-bench", level=logging.WARNING)  # the in-process drivers' events: quiet
        hs = asyncio.run(handshake_times(args.handshakes, Path(tempfile.mkdtemp(prefix="edgebench-hs"))))
        print(f"handshake (members, loopback): p50 {pct(hs, 0.5):.2f} ms p99 {pct(hs, 0.99):.2f} ms over {len(hs)}")
    root = Path(tempfile.mkdtemp(prefix="edgebench"))
    hosts = [EdgeHost(f"h{i}", root / f"h{i}", port=7460 + i) for i in range(2)]
    for h in hosts:
        h.root.mkdir()
        h.init_identity()
    write_peers(root / "peers.toml", hosts)
    extra = ["--max-datagram-size", str(args.max_datagram_size), *(["--uvloop"] if args.uvloop else [])]
    try:
        for h in hosts:
            h.start_arena()
            prof = ["--profile-out", str(h.root / "edge.prof")] if args.profile else []
            h.start_edge(root / "peers.toml", *extra, *prof)
        a, b = hosts
        tap = EventTap(a.stub)  # type: ignore[arg-type]
        prod, cons = edge(a, b, 1, 4 << 20)
        tap.wait("ready", 1)
        total = args.bulk_mib << 20
        if total:
            bulk_edge(prod, cons, 16 << 20)  # warm-up: connection, congestion window, allocator
            edge_bulk = bulk_edge(prod, cons, total)
            tcp_bulk = bulk_tcp(total)
            print(f"bulk 1 MiB objects: edge {edge_bulk:8.1f} MB/s   tcp {tcp_bulk:8.1f} MB/s   "
                  f"ratio {edge_bulk / tcp_bulk:.3f}")
        for size in (2048, 8192):
            latency_edge(prod, cons, size, 200)  # warm-up
            e = latency_edge(prod, cons, size, args.rounds)
            t = latency_tcp(size, args.rounds)
            print(
                f"one-way {size // 1024} KiB: edge p50 {pct(e, 0.5):.3f} ms p99 {pct(e, 0.99):.3f} ms   "
                f"tcp p50 {pct(t, 0.5):.3f} ms p99 {pct(t, 0.99):.3f} ms   ratio(p50) {pct(e, 0.5) / pct(t, 0.5):.1f}x"
            )
        status = a.stub.GetStatus(edge_pb2.GetStatusRequest())  # type: ignore[union-attr]
        print(f"datagram size {status.connections[0].max_datagram_size} B; rss sender {a.rss_kib()} KiB receiver {b.rss_kib()} KiB")
        tap.close()
    finally:
        for h in hosts:
            h.close()
    if args.profile:
        for h, role in zip(hosts, ("sender", "receiver"), strict=True):
            prof = h.root / "edge.prof"
            if prof.exists():
                print(f"\n== {role} driver: top functions by own time")
                pstats.Stats(str(prof)).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
