"""Round-trip times between members (issue 22: placement that knows the network), as a pure core.

Each node pings every live peer with a SWIM user message and the peer echoes it at once; the echo's arrival minus
the ping's send time is one sample. A node keeps the last WINDOW samples per peer and reports their median, so a
lost ping (no sample) or one packet held behind a burst moves nothing. Each node broadcasts its own row (its medians
to every peer) to the pool, so any member, and through it the orchestrator, holds the whole matrix.

The samples include both membership processes' event loops (a fraction of a millisecond); what the planner needs is
the order of magnitude between hosts, 0.1 ms on a LAN against 20-150 ms across the internet.

Messages (kinship carries and authenticates them to the pool; none carries payload bytes of a run):
    ping  b"rp" + u64 send time (ns, the sender's monotonic clock: only the sender reads it back)
    pong  b"rq" + the ping's 8 bytes
    row   b"rr" + u64 sender node id + n * (u64 peer node id, u32 RTT in us); at most ROW_ENTRIES per broadcast
"""

from __future__ import annotations

import statistics
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

PING, PONG, ROW = b"rp", b"rq", b"rr"
WINDOW = 8  # samples per peer whose median is its RTT
MAX_BROADCAST = 256  # kinship's max_user_broadcast
_STAMP = struct.Struct("<Q")
_ENTRY = struct.Struct("<QI")
ROW_ENTRIES = (MAX_BROADCAST - len(ROW) - _STAMP.size) // _ENTRY.size
MAX_RTT_US = 2**32 - 1


@dataclass(frozen=True)
class Rtt:
    """One measured pair: `from_node` pinged `to_node`; `age_s` since the measuring node last reported it."""

    from_node: int
    to_node: int
    rtt_us: int
    age_s: float


class RttTable:
    """This node's samples and the rows its peers broadcast; times are the caller's monotonic seconds."""

    def __init__(self, node_id: int, stale_s: float) -> None:
        self.node_id = node_id
        self.stale_s = stale_s  # a row (own or a peer's) not refreshed for this long is dropped
        self._samples: dict[int, deque[int]] = {}
        self._measured: dict[int, float] = {}  # peer -> when its last sample came
        self._rows: dict[int, tuple[float, dict[int, int]]] = {}  # peer -> (received, {its peer: rtt_us})

    # ---- messages ----

    @staticmethod
    def ping(now_ns: int) -> bytes:
        return PING + _STAMP.pack(now_ns)

    @staticmethod
    def pong_for(data: bytes) -> bytes | None:
        """The echo a ping asks for, or None when `data` is not a well-formed ping."""
        return PONG + data[len(PING):] if data.startswith(PING) and len(data) == len(PING) + _STAMP.size else None

    def on_pong(self, peer: int, data: bytes, now_ns: int, now_s: float) -> int | None:
        """Record the sample a pong carries; the RTT in us, or None when it is malformed or from the future."""
        if not data.startswith(PONG) or len(data) != len(PONG) + _STAMP.size or peer == self.node_id:
            return None
        (sent,) = _STAMP.unpack_from(data, len(PONG))
        if not 0 <= now_ns - sent <= MAX_RTT_US * 1000:
            return None
        rtt_us = (now_ns - sent) // 1000
        self._samples.setdefault(peer, deque(maxlen=WINDOW)).append(rtt_us)
        self._measured[peer] = now_s
        return rtt_us

    def rows(self, now_s: float) -> list[bytes]:
        """This node's row as broadcasts (several when it has more peers than one broadcast holds)."""
        entries = sorted(self.own(now_s).items())
        out = []
        for i in range(0, len(entries), ROW_ENTRIES):
            chunk = entries[i:i + ROW_ENTRIES]
            out.append(ROW + _STAMP.pack(self.node_id) + b"".join(_ENTRY.pack(p, min(r, MAX_RTT_US)) for p, r in chunk))
        return out

    def on_row(self, data: bytes, now_s: float) -> bool:
        """Keep a peer's broadcast row (a chunk adds to what the same sender sent within the stale time)."""
        body = data[len(ROW):]
        if not data.startswith(ROW) or len(body) < _STAMP.size or (len(body) - _STAMP.size) % _ENTRY.size:
            return False
        (sender,) = _STAMP.unpack_from(body)
        if sender == self.node_id:
            return False
        entries = dict(_ENTRY.iter_unpack(body[_STAMP.size:]))
        received, row = self._rows.get(sender, (now_s, {}))
        if now_s - received > self.stale_s:
            row = {}
        self._rows[sender] = (now_s, {**row, **entries})
        return True

    # ---- reads ----

    def forget(self, peers: Iterable[int]) -> None:
        """Members that left or died: their samples and rows go."""
        for p in peers:
            self._samples.pop(p, None)
            self._measured.pop(p, None)
            self._rows.pop(p, None)

    def own(self, now_s: float) -> dict[int, int]:
        """This node's median RTT in us to each peer it measured within the stale time."""
        return {p: int(statistics.median(s)) for p, s in self._samples.items()
                if now_s - self._measured[p] <= self.stale_s}

    def matrix(self, now_s: float) -> list[Rtt]:
        """Every pair known: this node's own medians and the rows peers broadcast, none older than the stale time."""
        out = [Rtt(self.node_id, p, r, now_s - self._measured[p]) for p, r in sorted(self.own(now_s).items())]
        for sender, (received, row) in sorted(self._rows.items()):
            if now_s - received <= self.stale_s:
                out.extend(Rtt(sender, p, r, now_s - received) for p, r in sorted(row.items()))
        return out
