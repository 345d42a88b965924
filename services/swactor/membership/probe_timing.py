"""The SWIM probe timeout and interval a pool's measured round trips call for, as a pure core.

A direct probe is one round trip (ping, ack); when it times out, the indirect probes (ping-req through other
members) and the TCP fallback ping take two more each and are waited for in the rest of the probe interval, with a
lost packet's retransmission on top. A timeout set for a LAN (0.5 s, interval 1 s) leaves 0.5 s for that: 3.3 round
trips at 150 ms, and in a 3-host pool (one indirect prober) at 150 ms and 2 % loss the bench/wan.py soak raised 232
suspicions of healthy members in 10 minutes; with 1.0 s and 2.0 s, none in 5 minutes. So the timeout should be
RTT_FACTOR times the largest round trip this node measured to a live peer (each peer's RTT is the median of its
recent samples, rtt.py; the largest of them stands for the tail), never below the configured one; when it grows past
the configured one, the interval grows to at least INTERVAL_OVER_TIMEOUT times it, so that the indirect probes fit
after it.

The SWIM engine (kinship) takes its timings once, when it starts: its config is frozen and a running node has no
call that changes them. So this node does not retune itself; it tells the operator, with the event
`membership_probe_timeout_advised`, which [membership] probe_timeout_s and probe_interval_s to set on every host
(docs/operations.md "WAN tuning"), whenever that advice moves by more than CHANGE_SHARE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

RTT_FACTOR = 6.5  # the timeout over the largest peer's median RTT: 150 ms calls for the 1.0 s / 2.0 s that held
INTERVAL_OVER_TIMEOUT = 2.0  # the interval over the timeout: the rest of it waits for the indirect probes
CHANGE_SHARE = 0.2  # advice that moved by less than this share of the last one is not repeated


@dataclass(frozen=True)
class ProbeTiming:
    probe_timeout_s: float
    probe_interval_s: float


DEFAULT_PROBE = ProbeTiming(probe_timeout_s=0.5, probe_interval_s=1.0)  # MembershipConfig's (LAN) defaults


@dataclass(frozen=True)
class Advice:
    """What the engine should run with, and the measurement it follows from."""

    timing: ProbeTiming
    configured: ProbeTiming
    peer: int  # the node id of the farthest live peer (0: none measured)
    rtt_ms: float  # its median RTT

    @property
    def sufficient(self) -> bool:
        """The configured timings already cover the measured RTT."""
        return self.timing == self.configured


def advised(configured: ProbeTiming, largest_rtt_ms: float) -> ProbeTiming:
    """The timings for a pool whose farthest live peer is `largest_rtt_ms` away (0: none measured)."""
    timeout = RTT_FACTOR * max(0.0, largest_rtt_ms) / 1000
    if timeout <= configured.probe_timeout_s:
        return configured
    return ProbeTiming(timeout, max(configured.probe_interval_s, INTERVAL_OVER_TIMEOUT * timeout))


class ProbeAdvisor:
    """Follows this node's own RTT row and says when the advice changed enough to be worth telling."""

    def __init__(self, configured: ProbeTiming) -> None:
        self.configured = configured
        self._last = configured  # what was last told (the configured timings until something was)

    def observe(self, own_rtts_us: Mapping[int, int]) -> Advice | None:
        """This node's median RTT to each live peer (RttTable.own); new Advice when its timeout moved by more than
        CHANGE_SHARE since the last told (at first: since the configured one), else None."""
        peer, rtt_us = max(own_rtts_us.items(), key=lambda kv: (kv[1], -kv[0]), default=(0, 0))
        timing = advised(self.configured, rtt_us / 1000)
        if abs(timing.probe_timeout_s - self._last.probe_timeout_s) <= CHANGE_SHARE * self._last.probe_timeout_s:
            return None
        self._last = timing
        return Advice(timing, self.configured, peer, rtt_us / 1000)
