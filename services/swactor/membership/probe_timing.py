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
call that changes them. A joining node measures its seeds' round trips just before it starts (seed_rtt.py) and
starts on the advice for the farthest of them; a node with no seed (the pool's first) has nothing to measure yet.
Past its start a node does not retune itself; it tells the operator, with the event
`membership_probe_timeout_advised`, which [membership] probe_timeout_s and probe_interval_s the pool calls for
(docs/operations.md "WAN tuning"), whenever that advice moves by more than CHANGE_SHARE, and keeps the advice in its
state directory (ADVICE_FILE), from which its next start takes the longer timings (`starting_timing`): a restart, not
an edit of every host's config, puts them to work.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

RTT_FACTOR = 6.5  # the timeout over the largest peer's median RTT: 150 ms calls for the 1.0 s / 2.0 s that held
INTERVAL_OVER_TIMEOUT = 2.0  # the interval over the timeout: the rest of it waits for the indirect probes
CHANGE_SHARE = 0.2  # advice that moved by less than this share of the last one is not repeated
ADVICE_FILE = "probe_timing.json"  # in the membership state directory: the last advice, for the next start


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

    def __init__(self, configured: ProbeTiming, running: ProbeTiming | None = None) -> None:
        self.configured = configured
        # what was last told: at first what the engine runs with (the configured timings, or a saved advice's)
        self._last = running or configured

    def observe(self, own_rtts_us: Mapping[int, int]) -> Advice | None:
        """This node's median RTT to each live peer (RttTable.own); new Advice when its timeout moved by more than
        CHANGE_SHARE since the last told (at first: since the configured one), else None. Nothing measured yet (no
        live peer, or none answered so far) advises nothing: it would call the timings a start took from the seeds'
        round trips or a kept advice sufficient, and drop that advice, before any peer was measured."""
        if not own_rtts_us:
            return None
        peer, rtt_us = max(own_rtts_us.items(), key=lambda kv: (kv[1], -kv[0]))
        timing = advised(self.configured, rtt_us / 1000)
        if abs(timing.probe_timeout_s - self._last.probe_timeout_s) <= CHANGE_SHARE * self._last.probe_timeout_s:
            return None
        self._last = timing
        return Advice(timing, self.configured, peer, rtt_us / 1000)


def starting_timing(configured: ProbeTiming, saved: ProbeTiming | None, seed_rtt_ms: float = 0.0) -> ProbeTiming:
    """What the engine starts with: the configured timings, or where its timeout is longer, a saved advice's or the
    advice for the farthest seed's round trip measured just before the start (seed_rtt.py), whichever is longer
    (never shorter than configured: an operator's longer timings stand)."""
    longest = max(saved or configured, advised(configured, seed_rtt_ms), key=lambda t: t.probe_timeout_s)
    if longest.probe_timeout_s <= configured.probe_timeout_s:
        return configured
    return ProbeTiming(longest.probe_timeout_s, max(configured.probe_interval_s, longest.probe_interval_s))


def save_advice(state_dir: Path, advice: Advice) -> None:
    """Keep `advice` for the next start (written whole, then renamed); advice that the configured timings suffice
    removes what an earlier one kept. OSError: the state directory is not writable."""
    path = state_dir / ADVICE_FILE
    if advice.sufficient:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"probe_timeout_s": advice.timing.probe_timeout_s,
                               "probe_interval_s": advice.timing.probe_interval_s,
                               "farthest_peer": advice.peer, "farthest_rtt_ms": advice.rtt_ms}))
    os.replace(tmp, path)


def load_advice(state_dir: Path) -> ProbeTiming | None:
    """The advice the last run kept, None when there is none. ValueError names what is wrong with a damaged file."""
    path = state_dir / ADVICE_FILE
    try:
        kept = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    try:
        timing = ProbeTiming(float(kept["probe_timeout_s"]), float(kept["probe_interval_s"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a probe timing advice ({e!r})") from None
    if not 0 < timing.probe_timeout_s <= timing.probe_interval_s:
        raise ValueError(f"{path}: probe_timeout_s {timing.probe_timeout_s:g} must be > 0 and at most "
                         f"probe_interval_s {timing.probe_interval_s:g}")
    return timing
