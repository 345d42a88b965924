"""Two aioquic connections over a simulated link, on a virtual clock: what a congestion controller does at a given
delay, loss and bottleneck, deterministically (seeded), in milliseconds of real time.

Each direction of the link holds every datagram `delay_s`, drops it with probability `loss` (random loss: a lossy
path, no queue involved), and serialises it at `rate_bps` through a drop-tail queue of `queue_bytes` (a bottleneck:
its losses come with a growing round trip). The client sends `chunk_bytes` objects on one stream, one every `gap_s`
(a prompt's chunks as a stage produces them), or one bulk object; the result is when each object's last byte
arrived, and what the client's congestion controller did.
"""

from __future__ import annotations

import heapq
import random
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from swactor.edge.config import ALPN
from swactor.edge.identity import create_identity

CLIENT, SERVER = ("10.0.0.1", 4000), ("10.0.0.2", 4433)


@dataclass(frozen=True)
class LinkSpec:
    delay_s: float = 0.05  # one way
    loss: float = 0.0  # random loss per datagram, each direction
    rate_bps: float = 100e6  # bottleneck, bits per second
    queue_bytes: int = 1 << 20  # drop-tail queue at the bottleneck
    seed: int = 1


@dataclass
class _Direction:
    spec: LinkSpec
    rng: random.Random
    free_at: float = 0.0  # when the bottleneck finishes serialising what it holds
    dropped_random: int = 0
    dropped_queue: int = 0

    def arrival(self, now: float, size: int) -> float | None:
        """When a datagram sent now arrives, None when it is lost."""
        if self.rng.random() < self.spec.loss:
            self.dropped_random += 1
            return None
        start = max(now, self.free_at)
        if (start - now) * self.spec.rate_bps / 8 > self.spec.queue_bytes:
            self.dropped_queue += 1
            return None
        self.free_at = start + size * 8 / self.spec.rate_bps
        return self.free_at + self.spec.delay_s


@dataclass
class Result:
    algorithm: str
    done_s: list[float]  # per object: from its write to its last byte's arrival
    finished: bool
    cwnd_bytes: int  # the client's window at the end
    dropped_random: int
    dropped_queue: int
    log: dict = field(default_factory=dict)  # the controller's get_log_data()


def _pair(algorithm: str, mds: int) -> tuple[QuicConnection, QuicConnection]:
    with tempfile.TemporaryDirectory() as tmp:
        ident = create_identity(Path(tmp) / "s.pem", Path(tmp) / "s.key", 2)
    common = {"alpn_protocols": [ALPN], "max_datagram_size": mds, "max_data": 64 << 20, "max_stream_data": 64 << 20,
              "congestion_control_algorithm": algorithm, "idle_timeout": 60.0}
    client = QuicConnection(configuration=QuicConfiguration(is_client=True, verify_mode=ssl.CERT_NONE, **common))
    server_cfg = QuicConfiguration(is_client=False, **common)
    server_cfg.certificate, server_cfg.private_key = ident.certificate, ident.private_key
    server = QuicConnection(configuration=server_cfg,
                            original_destination_connection_id=client.original_destination_connection_id)
    return client, server


def transfer(algorithm: str, link: LinkSpec, *, objects: int, object_bytes: int, gap_s: float = 0.0,
             mds: int = 1350, limit_s: float = 600.0) -> Result:
    """`objects` objects of `object_bytes` on one stream, one every `gap_s` once the handshake is done."""
    client, server = _pair(algorithm, mds)
    up, down = _Direction(link, random.Random(link.seed)), _Direction(link, random.Random(link.seed + 1))
    flight: list[tuple[float, int, str, bytes]] = []  # (arrival, order, "up"/"down", datagram)
    order = 0
    now = 0.0
    client.connect(SERVER, now=now)
    stream = client.get_next_available_stream_id(is_unidirectional=True)
    received = 0
    written: list[float] = []  # when each object was written
    done: list[float] = []
    start: float | None = None
    heard = False

    while now < limit_s and len(done) < objects:
        for conn, way, direction in ((client, "up", up), (server, "down", down)):
            if conn is server and not heard:
                continue  # a server has no path to send on before its first datagram
            for data, _addr in conn.datagrams_to_send(now=now):
                at = direction.arrival(now, len(data))
                if at is not None:
                    heapq.heappush(flight, (at, order, way, data))
                    order += 1
        while (ev := server.next_event()) is not None:
            if isinstance(ev, events.StreamDataReceived):
                received += len(ev.data)
                while len(done) < len(written) and received >= (len(done) + 1) * object_bytes:
                    done.append(now - written[len(done)])
        while (ev := client.next_event()) is not None:
            if isinstance(ev, events.HandshakeCompleted):
                start = now
        due = start + len(written) * gap_s if start is not None and len(written) < objects else None
        if due is not None and due <= now:
            written.append(now)
            client.send_stream_data(stream, bytes(object_bytes), end_stream=len(written) == objects)
            continue
        times = [t for t in (flight[0][0] if flight else None, client.get_timer(), server.get_timer(), due)
                 if t is not None]
        if not times:
            break
        # a microsecond past the event: aioquic's loss timer compares `now - loss_delay` with a send time it added
        # loss_delay to, and at exactly that time rounding can leave the packet not yet lost and the timer unmoved
        now = max(now, min(times)) + 1e-6
        while flight and flight[0][0] <= now:
            _, _, way, data = heapq.heappop(flight)
            heard = heard or way == "up"
            (server if way == "up" else client).receive_datagram(data, CLIENT if way == "up" else SERVER, now=now)
        for conn in (client, server):
            timer = conn.get_timer()
            if timer is not None and timer <= now:
                conn.handle_timer(now=now)

    cc = client._loss._cc  # aioquic keeps its controller private; what it did is the point of the simulation
    return Result(algorithm, done, len(done) == objects, cc.congestion_window, up.dropped_random, up.dropped_queue,
                  cc.get_log_data())
