"""One NFQUEUE queue over a raw netlink socket (no libnetfilter binding needed): packets an iptables
`-j NFQUEUE --queue-num N` rule hands to user space, and the verdicts that let them go on or drop them.

The socket belongs to the network namespace it was opened in, so a process that binds queue N inside a host's
namespace sees only that host's queued packets. Each packet comes with its first COPY_RANGE bytes (the IPv4 and
transport headers: enough for its flow) and its length; the kernel segments GSO packets before queueing them, so a
length is one wire packet's, which is what a rate limit must count.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_PACKET = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_PAYLOAD = 10
NFQA_CAP_LEN = 13
NF_DROP = 0
NF_ACCEPT = 1
SO_RCVBUFFORCE = 33

COPY_RANGE = 64  # an IPv4 header with options (at most 60 bytes) and the ports after it
QUEUE_MAXLEN = 65536  # packets the kernel holds for us before it drops (the kernel's default is 1024)
_NLMSG = struct.Struct("=IHHII")
_PACKET_MSG = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET
_VERDICTS_PER_SEND = 1024  # 32 bytes each: well inside a netlink socket's send buffer

# (protocol, source, destination, source port, destination port); ports 0 for anything but TCP and UDP
Flow = tuple[int, bytes, bytes, int, int]


@dataclass(frozen=True, slots=True)
class QueuedPacket:
    packet_id: int
    length: int  # bytes on the wire from the IP header on
    flow: Flow


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _msg(msg_type: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    payload = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return _NLMSG.pack(_NLMSG.size + len(payload), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + payload


def _messages(buf: bytes) -> Iterator[tuple[int, bytes]]:
    off = 0
    while off + _NLMSG.size <= len(buf):
        length, msg_type, _flags, _seq, _pid = _NLMSG.unpack_from(buf, off)
        if length < _NLMSG.size:
            return
        yield msg_type, buf[off + _NLMSG.size : off + length]
        off += (length + 3) & ~3


def _attrs(payload: bytes) -> dict[int, bytes]:
    found = {}
    off = 4  # nfgenmsg
    while off + 4 <= len(payload):
        alen, akind = struct.unpack_from("=HH", payload, off)
        if alen < 4:
            break
        found[akind & 0x3FFF] = payload[off + 4 : off + alen]
        off += (alen + 3) & ~3
    return found


def flow_of(ip: bytes) -> Flow:
    """The flow an IPv4 packet belongs to, from its first bytes; a packet too short to tell gets the empty flow."""
    if len(ip) < 20 or ip[0] >> 4 != 4:
        return (0, b"", b"", 0, 0)
    proto, ihl = ip[9], (ip[0] & 0x0F) * 4
    sport = dport = 0
    if proto in (socket.IPPROTO_TCP, socket.IPPROTO_UDP) and len(ip) >= ihl + 4:
        sport, dport = struct.unpack_from("!HH", ip, ihl)
    return (proto, ip[12:16], ip[16:20], sport, dport)


def parse_packet(payload: bytes) -> QueuedPacket | None:
    """A NFQNL_MSG_PACKET message's packet, or None when it lacks the packet header."""
    attrs = _attrs(payload)
    hdr = attrs.get(NFQA_PACKET_HDR)
    if hdr is None or len(hdr) < 4:
        return None
    data = attrs.get(NFQA_PAYLOAD, b"")
    cap = attrs.get(NFQA_CAP_LEN)  # present when the packet is longer than what was copied
    length = struct.unpack("!I", cap)[0] if cap is not None and len(cap) >= 4 else len(data)
    return QueuedPacket(struct.unpack_from("!I", hdr)[0], length, flow_of(data))


class QueueSocket:
    """Queue `queue` of the current network namespace, bound (OSError when the kernel refuses: no root, no
    nfnetlink_queue, the queue bound by another process)."""

    def __init__(self, queue: int) -> None:
        self.queue = queue
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            # A burst queued faster than we read would otherwise overflow the socket and the kernel drop it.
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
            self.sock.bind((0, 0))
            self._seq = 0
            self._config(_attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)))
            self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", COPY_RANGE, NFQNL_COPY_PACKET)))
            self._config(_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)))
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def _config(self, attrs: bytes) -> None:
        self._seq += 1
        self.sock.send(_msg(NFQNL_MSG_CONFIG, self.queue, attrs, self._seq, NLM_F_REQUEST | NLM_F_ACK))
        for msg_type, payload in _messages(self.sock.recv(65536)):
            if msg_type == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", payload)
                if err != 0:
                    raise OSError(-err, f"nfqueue config for queue {self.queue}: {os.strerror(-err)}")

    def receive(self) -> list[QueuedPacket]:
        """Every packet queued so far (none when there is nothing to read)."""
        packets = []
        while True:
            try:
                buf = self.sock.recv(1 << 16)
            except BlockingIOError:
                return packets
            except OSError:  # ENOBUFS: the kernel could not hand us some packets and dropped them; the senders recover
                continue
            for msg_type, payload in _messages(buf):
                if msg_type == _PACKET_MSG and (packet := parse_packet(payload)) is not None:
                    packets.append(packet)

    def verdicts(self, accept: Sequence[int], drop: Sequence[int] = ()) -> None:
        """Let the `accept` packets go on and drop the `drop` ones, each by its id: one verdict per packet (a batch
        verdict would also release every earlier id, and a packet held longer may have an earlier id), many
        verdicts per send."""
        msgs = []
        for verdict, ids in ((NF_DROP, drop), (NF_ACCEPT, accept)):
            for packet_id in ids:
                self._seq += 1
                msgs.append(_msg(NFQNL_MSG_VERDICT, self.queue,
                                 _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id)), self._seq))
        for i in range(0, len(msgs), _VERDICTS_PER_SEND):
            chunk = b"".join(msgs[i : i + _VERDICTS_PER_SEND])
            while True:
                try:
                    self.sock.send(chunk)
                    break
                except BlockingIOError:  # the kernel is behind on our verdicts: wait, a lost verdict holds a packet
                    select.select([], [self.sock], [], 1.0)

    def close(self) -> None:
        self.sock.close()
