"""Acceptance: two hosts in two network namespaces, each with its own arena-manager and edge
driver; the test process is producer and consumer through ring-rs (spec §23-25, §35)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import swactor_ring as sr
from swactor.v1 import common_pb2, edge_pb2
from tests.edge.cluster import EdgeHost, EventTap, wait_fd, wait_until, write_all
from tests.harness import NetnsCluster

pytestmark = [pytest.mark.netns]
EGRESS, INGRESS = common_pb2.RING_DIRECTION_EGRESS, common_pb2.RING_DIRECTION_INGRESS
Pair = tuple[NetnsCluster, list[EdgeHost], Path]


def _edge(a: EdgeHost, b: EdgeHost, edge_id: int, capacity: int, *, recv_first: bool = True) -> tuple[sr.Producer, sr.Consumer]:
    """Lease both rings, establish both ends (in the given order), open the worker-side handles."""
    lt = a.lease(edge_id, capacity, EGRESS)
    lr = b.lease(edge_id, capacity, INGRESS)
    assert a.stub is not None and b.stub is not None
    send = edge_pb2.EstablishSendRequest(edge_id=edge_id, rx_node_id=b.node_id, ring_id=lt.ring_id, ring_layout=lt)
    recv = edge_pb2.EstablishRecvRequest(edge_id=edge_id, ring_id=lr.ring_id, ring_layout=lr, tx_node_id=a.node_id)
    if recv_first:
        b.stub.EstablishRecv(recv)
        a.stub.EstablishSend(send)
        return a.producer(lt), b.consumer(lr)
    a.stub.EstablishSend(send)
    prod = a.producer(lt)
    return prod, _late_consumer(b, recv, lr)


def _late_consumer(b: EdgeHost, recv: edge_pb2.EstablishRecvRequest, lr: common_pb2.RingLayout) -> sr.Consumer:
    assert b.stub is not None
    b.stub.EstablishRecv(recv)
    return b.consumer(lr)


def _records(first: int, n: int, payload: bytes) -> bytes:
    """`n` object records (ring-rs ObjectHeader + payload), sequences first.., payloads rotated."""
    out = bytearray()
    for seq in range(first, first + n):
        out += sr.ObjectHeader(object_id=seq + 1, sequence=seq, extent=len(payload)).encode()
        out += payload[seq % 7 :] + payload[: seq % 7]
    return bytes(out)


class Reader(threading.Thread):
    """Consumer thread: reads `total` bytes, hashing them and checking every record header."""

    def __init__(self, cons: sr.Consumer, total: int, record: int | None = None,
                 hold: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.cons, self.total, self.record = cons, total, record
        self.hold = hold  # a stalled worker: it starts consuming once the test sets this
        self.h = hashlib.sha256()
        self.got = 0
        self.headers = 0
        self.partial = bytearray()  # header bytes of a record whose header the last read cut
        self.error: str | None = None

    def _check_headers(self, view: memoryview) -> None:
        """Parse the header at every record start; a header may be split over two reads."""
        i, size = 0, sr.ObjectHeader.SIZE
        while i < len(view):
            pos = (self.got + i) % self.record  # offset inside the current record
            if pos >= size:
                i += self.record - pos
                continue
            take = min(size - pos, len(view) - i)
            self.partial += view[i : i + take]
            i += take
            if len(self.partial) == size:
                hdr = sr.ObjectHeader.parse(bytes(self.partial), self.record)
                if hdr.sequence != self.headers:
                    self.error = f"sequence {hdr.sequence} where {self.headers} was due"
                self.headers += 1
                self.partial.clear()

    def run(self) -> None:
        if self.hold is not None:
            self.hold.wait(120)
        buf = bytearray(1 << 20)
        deadline = time.monotonic() + 120
        while self.got < self.total and time.monotonic() < deadline:
            n = self.cons.read_into(buf)
            if n:
                view = memoryview(buf)[:n]
                if self.record:
                    self._check_headers(view)
                self.h.update(view)
                self.got += n
                continue
            if not self.cons.arm_readable():
                wait_fd(self.cons.readable_fd, 0.5)
                self.cons.ack_wake()


def _pump_state(h: EdgeHost, edge_id: int) -> str:
    """The driver's state of its end of `edge_id` (GetStatus)."""
    status = h.stub.GetStatus(edge_pb2.GetStatusRequest())  # type: ignore[union-attr]
    return next((e.state for e in status.edges if e.edge_id == edge_id), "")


def test_ready_and_status_reach_systemd(netns_pair: Pair) -> None:
    _, hosts, _ = netns_pair
    for h in hosts:
        msgs = h.notify_messages()
        assert any(m.startswith("READY=1") for m in msgs), msgs
        assert f"endpoint {h.endpoint}" in msgs[0] and "connections" in msgs[0]


def test_256mib_of_object_records_cross_intact(netns_pair: Pair) -> None:
    _, (a, b), _ = netns_pair
    tap = EventTap(b.stub)  # type: ignore[arg-type]
    prod, cons = _edge(a, b, 1, 1 << 20)  # 1 MiB rings: 256 wraparounds each
    payload = hashlib.shake_256(b"edge").digest((1 << 20) - sr.ObjectHeader.SIZE)
    total = 256 << 20  # 256 records of 1 MiB, written 16 MiB at a time
    reader = Reader(cons, total, record=1 << 20)
    reader.start()
    t0 = time.monotonic()
    want = hashlib.sha256()
    for first in range(0, 256, 16):
        block = _records(first, 16, payload)
        write_all(prod, memoryview(block), time.monotonic() + 60)
        want.update(block)
    reader.join(120)
    elapsed = time.monotonic() - t0
    assert reader.got == total and reader.error is None
    assert reader.h.hexdigest() == want.hexdigest()
    assert reader.headers == 256
    print(f"256 MiB in {elapsed:.1f} s ({total / elapsed / 1e6:.0f} MB/s)")
    prod.close()
    tap.wait("closed", 1)
    assert cons.state == sr.RingState.CLOSED
    tap.close()


def test_stalled_consumer_backpressures_with_bounded_memory(netns_pair: Pair) -> None:
    _, (a, b), _ = netns_pair
    prod, cons = _edge(a, b, 2, 1 << 20)
    warm = os.urandom(8 << 20)
    r = Reader(cons, len(warm))
    r.start()
    write_all(prod, memoryview(warm), time.monotonic() + 30)
    r.join(30)
    assert r.got == len(warm)
    rss0 = (a.rss_kib(), b.rss_kib())
    data = os.urandom(64 << 20)
    stalled = threading.Event()
    reader = Reader(cons, len(data), hold=stalled)
    reader.start()
    writer = threading.Thread(target=write_all, args=(prod, memoryview(data), time.monotonic() + 90), daemon=True)
    writer.start()
    # the consumer is stalled: everything upstream fills, then both pumps wait with full rings
    wait_until(lambda: prod.status().readable == prod.capacity and cons.status().readable == cons.capacity
               and _pump_state(a, 2) == _pump_state(b, 2) == "Backpressured",
               "both rings full and both pumps backpressured", timeout=30)
    peak = (a.rss_kib(), b.rss_kib())
    assert prod.status().readable == prod.capacity, "producer ring must still be full: nothing leaks past a stall"
    assert writer.is_alive() and reader.got == 0
    # Bound: per edge, ring-driven credit (<= one ring of unread bytes) + send queue (4 MiB) +
    # connection window slack; 32 MiB over the pre-stall RSS leaves room for allocator noise.
    bound_kib = 32 << 10
    print(f"RSS before/during stall (KiB): sender {rss0[0]}/{peak[0]}, receiver {rss0[1]}/{peak[1]}")
    for before, during, who in zip(rss0, peak, ("sender", "receiver"), strict=True):
        assert during - before < bound_kib, f"{who} driver RSS grew {during - before} KiB during the stall"
    stalled.set()
    reader.join(90)
    writer.join(10)
    assert reader.got == len(data)
    assert reader.h.hexdigest() == hashlib.sha256(data).hexdigest()


def test_rendezvous_both_orders_share_one_connection(netns_pair: Pair) -> None:
    _, (a, b), _ = netns_pair
    pairs = [_edge(a, b, 10 + i, 64 << 10, recv_first=i % 2 == 0) for i in range(4)]
    for i, (prod, _) in enumerate(pairs):
        prod.write(b"edge %d says hi" % (10 + i))
    for i, (_, cons) in enumerate(pairs):
        want = b"edge %d says hi" % (10 + i)
        wait_until(lambda cons=cons, want=want: cons.readable() >= len(want), f"edge {10 + i}'s bytes")
        assert cons.read(100) == want
    for host, peer in ((a, b), (b, a)):
        status = host.stub.GetStatus(edge_pb2.GetStatusRequest())  # type: ignore[union-attr]
        conns = [c for c in status.connections if c.peer_node_id == peer.node_id]
        assert len(conns) == 1, status
        assert conns[0].streams >= 4


REFUSED_CLIENT = r"""
import asyncio, ssl, sys, tempfile
from pathlib import Path
from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration
from swactor.edge.identity import create_identity
d = Path(tempfile.mkdtemp())
ident = create_identity(d / "c.pem", d / "k.pem", 999)
cfg = QuicConfiguration(is_client=True, alpn_protocols=["swactor/edge/1"], verify_mode=ssl.CERT_NONE)
cfg.certificate, cfg.private_key = ident.certificate, ident.private_key
async def main():
    try:
        async with connect(sys.argv[1], int(sys.argv[2]), configuration=cfg) as c:
            # TLS 1.3: the client finishes its side first; the server's verdict follows.
            try:
                await asyncio.wait_for(c.wait_closed(), 3)
            except asyncio.TimeoutError:
                print("accepted")
                return
            ev = c._quic._close_event
            print("refused", hex(ev.error_code), ev.reason_phrase)
    except ConnectionError as e:
        print("refused", e)
asyncio.run(asyncio.wait_for(main(), 10))
"""


def test_client_without_member_certificate_is_refused(netns_pair: Pair) -> None:
    cluster, (_, b), _ = netns_pair
    out = cluster.hosts[0].run([sys.executable, "-c", REFUSED_CLIENT, b.addr, str(b.port)], timeout=30)
    assert out.startswith("refused 0x12a"), out  # CRYPTO_ERROR + TLS alert bad_certificate (42)
    status = b.stub.GetStatus(edge_pb2.GetStatusRequest())  # type: ignore[union-attr]
    assert status.admission.refused["peer_not_authorized"] >= 1 and status.admission.half_open == 0

    def summaries() -> list[dict]:
        lines = (b.root / "edge.log").read_text().splitlines()
        return [e for e in map(json.loads, filter(lambda x: x.startswith("{"), lines))
                if e.get("event") == "edge.admission_refused" and "peer_not_authorized" in e["refused"]]

    wait_until(lambda: summaries(), "the refusal in an edge.admission_refused summary", timeout=15)


@pytest.mark.parametrize("victim", ["receiver", "sender"])
def test_peer_sigkilled_mid_object_faults_survivor(netns_pair: Pair, victim: str) -> None:
    _, (a, b), peers = netns_pair
    edge_id = 3 if victim == "receiver" else 5
    dead, survivor = (b, a) if victim == "receiver" else (a, b)
    tap = EventTap(survivor.stub)  # type: ignore[arg-type]
    prod, cons = _edge(a, b, edge_id, 1 << 20)
    size = 4 << 20
    prod.write(sr.ObjectHeader(object_id=1, sequence=0, extent=size).encode())
    prod.write(b"z" * (512 << 10))  # half an object... then one host's driver dies
    wait_until(lambda: cons.readable() >= 512 << 10, "half an object in the ingress ring")
    dead.kill_edge()
    t0 = time.monotonic()
    ev = tap.wait("fault", edge_id, timeout=10)
    detected = time.monotonic() - t0
    assert ev.fault.reason == common_pb2.STREAM_FAULT_CONNECTION_LOST
    print(f"{victim} killed: StreamFault on the survivor {detected:.2f} s later")
    assert detected < 5.0, f"fault after {detected:.1f} s"
    assert survivor.stub.StopEdge(edge_pb2.StopEdgeRequest(edge_id=edge_id)).known  # type: ignore[union-attr]
    tap.wait("pump_stopped", edge_id)
    tap.close()
    dead.start_edge(peers)  # later tests need the driver back


def test_everything_arrives_with_20ms_one_way_delay(netns_pair: Pair) -> None:
    if shutil.which("iptables") is None:
        pytest.skip("the NFQUEUE delayer needs the iptables binary (nft backend): apt-get install iptables")
    cluster, (a, b), _ = netns_pair
    delayers = [
        h.spawn([sys.executable, "-m", "tests.harness.nfqueue_delay", "--delay-ms", "20", "--udp-sport", str(a.port)],
                stdout=subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[2]))
        for h in cluster.hosts
    ]
    try:
        for d in delayers:
            assert d.stdout is not None and d.stdout.readline().strip() == b"ready"
        rtt_probe = a.stub.GetStatus(edge_pb2.GetStatusRequest())  # type: ignore[union-attr]
        assert rtt_probe.node_id == a.node_id
        prod, cons = _edge(a, b, 4, 1 << 20)
        data = os.urandom(32 << 20)
        reader = Reader(cons, len(data))
        reader.start()
        t0 = time.monotonic()
        write_all(prod, memoryview(data), time.monotonic() + 90)
        reader.join(90)
        elapsed = time.monotonic() - t0
        assert reader.got == len(data)
        assert reader.h.hexdigest() == hashlib.sha256(data).hexdigest()
        print(f"32 MiB with 20 ms one-way delay in {elapsed:.1f} s ({len(data) / elapsed / 1e6:.1f} MB/s)")
    finally:
        for d in delayers:
            d.terminate()
            d.wait(10)
