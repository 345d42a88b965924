"""A congestion controller for lossy WAN paths: a loss that comes without queueing is not taken as congestion.

aioquic's Reno and Cubic take every lost packet as a sign of a full queue and cut the window (by half, by 0.3). On the
paths rented hosts sit on, packets are also lost where no queue is full (a lossy peering, a NAT's or a tunnel's drops):
at 2 % loss a window is cut at almost every 150 KB prompt chunk and never grows back, so a 512-token prefill at 50 ms
one way took 2.5-4x its LAN time (docs/operations.md "What WAN conditions cost").

A full queue shows before it drops: the round trip grows by the time packets wait in it. So on a loss this controller
looks at the queueing delay of the recent round trips (the least of the last RECENT_SAMPLES RTTs, so that one ack the
peer delayed does not look like a queue, minus the path's minimum RTT):
- at least QUEUE_SHARE of the minimum RTT (and at least QUEUE_FLOOR_S): congestion, the window is halved (Reno);
- less, while the share of packets lost lately (an average over about LOSS_WINDOW packets) is at most LOSS_TOLERATED:
  a random loss, the window stays. Even a tenth off per loss event held the window at ~22 datagrams at 2 % loss
  (where cuts and growth balance), less than a prompt chunk's pace needs at 100 ms of round trip;
- less, with more lost than that: a policer that drops without queueing (a rate cap), or a path that is failing:
  halved, as Reno would.
A cut happens at most once per recovery period (one round trip), as in Reno. Growth is Reno's: slow start until
the RTT rises (HyStart, aioquic's QuicRttMonitor) or the first cut, then one datagram per window acknowledged.
Persistent congestion (every packet of a long stretch lost) is an outage whatever the RTT: the minimum window.

Registered with aioquic as CONGESTION_CONTROL; `[edge].congestion_control` chooses it (docs/edge.md "Congestion
control"). bench/congestion.py compares it with Reno and Cubic on a simulated lossy and a congested link.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from aioquic.quic.congestion.base import (
    K_MINIMUM_WINDOW,
    QuicCongestionControl,
    QuicRttMonitor,
    register_congestion_control,
)
from aioquic.quic.packet_builder import QuicSentPacket

CONGESTION_CONTROL = "loss_tolerant"
# The algorithms [edge].congestion_control takes: aioquic's own and ours.
ALGORITHMS = ("reno", "cubic", CONGESTION_CONTROL)
CONGESTION_REDUCTION = 0.5  # Reno's cut, on a loss that came with a queue or with too many others
LOSS_TOLERATED = 0.05  # the share of packets lost lately that is still taken as a lossy path, not congestion
LOSS_WINDOW = 200  # packets the loss share averages over (an exponential average of this span)
QUEUE_SHARE = 0.25  # queueing delay over the minimum RTT that means a queue is building
QUEUE_FLOOR_S = 0.002  # ... and at least this much: a LAN's RTT jitters by a millisecond with no queue at all
RECENT_SAMPLES = 4  # RTT samples whose least is the path's current round trip


class LossTolerantCongestionControl(QuicCongestionControl):
    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self._max_datagram_size = max_datagram_size
        self._recovery_start = 0.0
        self._stash = 0  # bytes acknowledged toward the next datagram of congestion avoidance
        self._rtt_monitor = QuicRttMonitor()
        self.min_rtt: float | None = None  # the least RTT seen: the path with no queue (kept for the connection's life)
        self._recent: deque[float] = deque(maxlen=RECENT_SAMPLES)
        self.loss_share = 0.0  # of the recent packets, lost (exponential average over LOSS_WINDOW)
        self.congestion_cuts = 0  # loss events taken as congestion / as random loss (get_log_data)
        self.random_losses = 0

    def queueing_s(self) -> float:
        """How much longer the recent round trips took than the path's fastest (0 before any)."""
        if self.min_rtt is None or not self._recent:
            return 0.0
        return max(0.0, min(self._recent) - self.min_rtt)

    def queue_building(self) -> bool:
        if self.min_rtt is None:
            return False
        return self.queueing_s() >= max(QUEUE_FLOOR_S, QUEUE_SHARE * self.min_rtt)

    def _outcome(self, lost: bool) -> None:
        self.loss_share += (float(lost) - self.loss_share) / LOSS_WINDOW

    def on_packet_acked(self, *, now: float, packet: QuicSentPacket) -> None:
        self.bytes_in_flight -= packet.sent_bytes
        self._outcome(False)
        if packet.sent_time <= self._recovery_start:
            return  # sent before the last cut: its ack says nothing about the new window
        if self.ssthresh is None or self.congestion_window < self.ssthresh:
            self.congestion_window += packet.sent_bytes
            return
        self._stash += packet.sent_bytes
        grown, self._stash = divmod(self._stash, self.congestion_window)
        self.congestion_window += grown * self._max_datagram_size

    def on_packet_sent(self, *, packet: QuicSentPacket) -> None:
        self.bytes_in_flight += packet.sent_bytes

    def on_packets_expired(self, *, packets: Iterable[QuicSentPacket]) -> None:
        for packet in packets:
            self.bytes_in_flight -= packet.sent_bytes

    def on_packets_lost(self, *, now: float, packets: Iterable[QuicSentPacket]) -> None:
        latest_sent = 0.0
        for packet in packets:
            self.bytes_in_flight -= packet.sent_bytes
            latest_sent = max(latest_sent, packet.sent_time)
            self._outcome(True)
        if latest_sent <= self._recovery_start:
            return  # lost before the last cut: the same event
        self._recovery_start = now
        if not self.queue_building() and self.loss_share <= LOSS_TOLERATED:
            self.random_losses += 1
            if self.ssthresh is None:
                self.ssthresh = self.congestion_window  # slow start ends all the same: the path is probed enough
            return
        self.congestion_cuts += 1
        self.congestion_window = max(int(self.congestion_window * CONGESTION_REDUCTION),
                                     K_MINIMUM_WINDOW * self._max_datagram_size)
        self.ssthresh = self.congestion_window

    def on_persistent_congestion(self) -> None:
        self.congestion_window = K_MINIMUM_WINDOW * self._max_datagram_size
        self._recovery_start = 0.0

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        self._recent.append(rtt)
        self.min_rtt = rtt if self.min_rtt is None else min(self.min_rtt, rtt)
        if self.ssthresh is None and self._rtt_monitor.is_rtt_increasing(now=now, rtt=rtt):
            self.ssthresh = self.congestion_window  # slow start ends where the queue starts to build

    def get_log_data(self) -> dict[str, Any]:
        return {**super().get_log_data(), "congestion_cuts": self.congestion_cuts, "random_losses": self.random_losses,
                "loss_share": round(self.loss_share, 4), "queueing_ms": round(self.queueing_s() * 1000, 2)}


register_congestion_control(CONGESTION_CONTROL, LossTolerantCongestionControl)
