"""NFQUEUE userspace delayer: holds each queued packet for a fixed time, then accepts it.

The test kernel has no netem, but it has nfnetlink_queue and the xtables NFQUEUE target, so:

    python -m tests.harness.nfqueue_delay --queue 3 --delay-ms 20 --udp-sport 7400
    python -m tests.harness.nfqueue_delay --queue 4 --delay-ms 30 --tcp-sport 7442

run inside a network namespace, adds `iptables -A OUTPUT -p udp --sport 7400 -j NFQUEUE
--queue-num 3 --queue-bypass` (or `-p tcp`) there, binds queue 3 over a raw netlink socket (no libnetfilter
binding needed), and gives every outgoing packet of that port `delay-ms` of one-way delay. Packets
are released in arrival order with one batch verdict per wakeup. It prints `ready` once bound and
removes its rule on SIGTERM/SIGINT. Needs root and the `iptables` (nft backend) binary.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NF_ACCEPT = 1
_NLMSG = struct.Struct("=IHHII")


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _msg(msg_type: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    payload = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return _NLMSG.pack(_NLMSG.size + len(payload), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + payload


def _messages(buf: bytes):  # type: ignore[no-untyped-def]
    off = 0
    while off + _NLMSG.size <= len(buf):
        length, msg_type, _flags, _seq, _pid = _NLMSG.unpack_from(buf, off)
        if length < _NLMSG.size:
            return
        yield msg_type, buf[off + _NLMSG.size : off + length]
        off += (length + 3) & ~3


def _packet_id(payload: bytes) -> int | None:
    off = 4  # nfgenmsg
    while off + 4 <= len(payload):
        alen, akind = struct.unpack_from("=HH", payload, off)
        if alen < 4:
            return None
        if akind & 0x3FFF == NFQA_PACKET_HDR:
            return int(struct.unpack_from("!I", payload, off + 4)[0])
        off += (alen + 3) & ~3
    return None


class Delayer:
    def __init__(self, queue: int, delay_s: float) -> None:
        self.queue = queue
        self.delay_s = delay_s
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
        self.sock.bind((0, 0))
        self._seq = 0
        self._config(_attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))
        self._config(_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 65536)))
        self.sock.setblocking(False)
        self.held: collections.deque[tuple[float, int]] = collections.deque()
        self.released = 0

    def _config(self, attrs: bytes) -> None:
        self._seq += 1
        self.sock.send(_msg(NFQNL_MSG_CONFIG, self.queue, attrs, self._seq, NLM_F_REQUEST | NLM_F_ACK))
        for msg_type, payload in _messages(self.sock.recv(65536)):
            if msg_type == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", payload)
                if err != 0:
                    raise OSError(-err, f"nfqueue config for queue {self.queue}: {os.strerror(-err)}")

    def _receive(self, now: float) -> None:
        while True:
            try:
                buf = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:  # ENOBUFS: the kernel dropped queue messages; QUIC recovers
                continue
            for msg_type, payload in _messages(buf):
                if msg_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    pid = _packet_id(payload)
                    if pid is not None:
                        self.held.append((now + self.delay_s, pid))

    def _release_due(self, now: float) -> None:
        last = None
        while self.held and self.held[0][0] <= now:
            last = self.held.popleft()[1]
            self.released += 1
        if last is not None:  # accept every queued packet with id <= last, in order
            hdr = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last))
            self._seq += 1
            with contextlib.suppress(BlockingIOError):
                self.sock.send(_msg(NFQNL_MSG_VERDICT_BATCH, self.queue, hdr, self._seq))

    def run(self, stop: list[bool]) -> None:
        while not stop[0]:
            now = time.monotonic()
            timeout = max(0.0, self.held[0][0] - now) if self.held else 0.2
            r, _, _ = select.select([self.sock], [], [], timeout)
            now = time.monotonic()
            if r:
                self._receive(now)
            self._release_due(now)


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
    delayer = Delayer(args.queue, args.delay_ms / 1000.0)
    subprocess.run(_rule("-A", args.queue, sport, proto), check=True, capture_output=True)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__(0, True))
    print("ready", flush=True)
    try:
        delayer.run(stop)
    finally:
        subprocess.run(_rule("-D", args.queue, sport, proto), capture_output=True)
        delayer._release_due(float("inf"))
    print(f"released {delayer.released}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
