"""The timers around the admission core (admission.py): refusal summaries and flood mode.

* Refusals are counted, never logged one by one: `noted()` logs one `edge.admission_refused`
  summary now if the last one is a `refusal_log_interval` old, else arms one for when it is, so a
  flood gives one line per interval (with counts, sources and the top source), never one per packet.
* Flood mode: about once a second while strangers send Initials (or while the filter is on), and
  at once when more than a second's Retry budget of them came since the last judgement,
  `ConnectionAdmission.flood_tick` judges their rate; when it says so, the kernel socket filter
  (sockfilter.py) goes on or off (`edge.flood_filter`), and while on it follows the membership view.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from swactor.common.events import get_logger
from swactor.edge import sockfilter
from swactor.edge.admission import FILTER_SAMPLE_SHIFT, ConnectionAdmission

FLOOD_TICK = 1.0  # seconds between flood-rate judgements
log = get_logger(component="COMPONENT_EDGE_DRIVER")

# () -> (the endpoint's socket, the hosts the filter lets through)
FilterTarget = Callable[[], tuple[socket.socket | None, frozenset[str]]]


class AdmissionGuard:
    def __init__(self, admission: ConnectionAdmission, loop: asyncio.AbstractEventLoop, interval: float,
                 target: FilterTarget) -> None:
        self.admission = admission
        self.loop = loop
        self.interval = interval
        self.target = target
        self._summary_timer: asyncio.TimerHandle | None = None
        self._summary_at = float("-inf")  # loop time of the last summary
        self._flood_timer: asyncio.TimerHandle | None = None
        self.filter_members: frozenset[str] | None = None  # what the attached filter lets through

    def after_batch(self) -> None:
        """After each batch of datagrams: arm what the batch calls for (O(1))."""
        adm = self.admission
        if adm.has_refusals and self._summary_timer is None:
            self.noted()
        if adm.flood_suspected:  # a second's worth of strangers already: judge now
            if self._flood_timer is not None:
                self._flood_timer.cancel()
            self._flood_tick()
        elif (adm.stranger_initials or adm.filtering) and self._flood_timer is None:
            self._flood_timer = self.loop.call_later(FLOOD_TICK, self._flood_tick)

    # ---- refusal summaries ----

    def noted(self) -> None:
        """Something was refused."""
        if self._summary_timer is not None:
            return
        due = self._summary_at + self.interval
        if self.loop.time() >= due:
            self._log_summary()
        else:
            self._summary_timer = self.loop.call_at(due, self._log_summary)

    def _log_summary(self) -> None:
        self._summary_timer = None
        summary = self.admission.take_summary()
        if summary is not None:
            now = self.loop.time()
            interval = min(now - self._summary_at, self.interval)
            self._summary_at = now
            log.warning("edge.admission_refused", interval_s=round(interval, 3), **summary)

    # ---- flood mode ----

    def _flood_tick(self) -> None:
        self._flood_timer = None
        adm = self.admission
        change = adm.flood_tick(self.loop.time())
        if change is False:
            self._filter_off()
        elif adm.filtering:  # on now, or on already: keep it in step with the membership view
            self._filter_on()
        if adm.filtering:
            self._flood_timer = self.loop.call_later(FLOOD_TICK, self._flood_tick)

    def _filter_on(self) -> None:
        sock, members = self.target()
        if sock is None or members == self.filter_members:
            return
        rate = round(self.admission.flood_rate)
        try:
            if sock.family != socket.AF_INET:
                raise OSError("the kernel filter is IPv4 only")
            sockfilter.attach(sock, sockfilter.initial_filter(members, FILTER_SAMPLE_SHIFT))
        except (OSError, ValueError) as e:
            self.admission.filter_failed()
            log.warning("edge.flood_filter", on=False, rate=rate, detail=f"cannot filter in the kernel: {e}")
            return
        if self.filter_members is None:
            log.warning("edge.flood_filter", on=True, rate=rate, members=len(members),
                        sample=f"1/{1 << FILTER_SAMPLE_SHIFT}")
        self.filter_members = members

    def _filter_off(self) -> None:
        sock, _ = self.target()
        if sock is not None:
            sockfilter.detach(sock)
        self.filter_members = None
        log.info("edge.flood_filter", on=False, rate=round(self.admission.flood_rate))

    def close(self) -> None:
        for timer in (self._summary_timer, self._flood_timer):
            if timer is not None:
                timer.cancel()
        self._summary_timer = self._flood_timer = None
