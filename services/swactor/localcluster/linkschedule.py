"""When each packet one host sends another may go on (pure: a clock and the packet in, a time out).

The model is a one-way path from each host to each other host, all alike and independent of each other. With a
rate cap, the packets of one path are serialized one after another at the rate (a FIFO with a drop-tail buffer:
a real bottleneck queues a burst, where a policer would drop it and TCP and QUIC would back off at every burst);
then each packet takes the one-way delay, drawn per packet uniform in [delay - jitter, delay + jitter].

Jitter never reorders one flow (same protocol, addresses and ports): a packet is held at least until the packet
its flow sent before it goes. TCP takes a reordered segment for a loss (duplicate ACKs, a spurious retransmit, a
halved window) and QUIC declares a packet lost once one three packets later is acknowledged, so per-packet
reordering at WAN jitter would measure loss recovery, not latency; real paths rarely reorder one flow. Packets of
different flows (a membership probe and a bulk weight fetch) do overtake each other. The price: in a burst a flow's
delays bunch towards the upper end of the range rather than spreading over all of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.nfqueue import Flow

BUFFER_S = 0.1  # a path's bottleneck buffer holds this long at the rate...
BUFFER_MIN_PACKETS = 32  # ...but at least this many full packets, so a slow path still takes a burst
MTU_BYTES = 1500


@dataclass
class LinkSchedule:
    conditions: LinkConditions
    rng: random.Random = field(default_factory=random.Random)
    # per sending host (its address): when its rate-capped path has serialized everything admitted so far
    _path_free_at: dict[bytes, float] = field(default_factory=dict)
    _flow_last: dict[Flow, float] = field(default_factory=dict)  # each flow's latest release time still ahead

    @property
    def buffer_bytes(self) -> float:
        rate = self.conditions.rate_bytes_s
        return float("inf") if rate is None else max(rate * BUFFER_S, BUFFER_MIN_PACKETS * MTU_BYTES)

    def admit(self, now: float, length: int, flow: Flow) -> float | None:
        """When the packet that arrived at `now` may go on, or None when its path's buffer is full (tail drop)."""
        c = self.conditions
        sent = now
        rate = c.rate_bytes_s
        if rate is not None:
            source = flow[1]
            start = max(now, self._path_free_at.get(source, now))
            backlog = round((start - now) * rate)  # bytes still to serialize (rounded: time is a float)
            if backlog + length > self.buffer_bytes:
                return None
            sent = self._path_free_at[source] = start + length / rate
        delay_ms = c.delay_ms
        if c.jitter_ms:
            delay_ms = self.rng.uniform(c.delay_ms - c.jitter_ms, c.delay_ms + c.jitter_ms)
        release = sent + delay_ms / 1000.0
        release = max(release, self._flow_last.get(flow, release))
        self._flow_last[flow] = release
        return release

    def released(self, flow: Flow, at: float) -> None:
        """The packet of `flow` due at `at` went: forget the flow unless a later packet of it is still held (the
        table stays as large as the flows in flight, not all flows ever seen)."""
        if self._flow_last.get(flow) == at:
            del self._flow_last[flow]
