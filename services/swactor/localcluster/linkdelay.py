"""The link delayer (`python -m swactor.localcluster.linkdelay`): run inside a host's network namespace, it holds
every packet queued to its NFQUEUE queue for the delay, jitter and rate cap of the path it came over
(linkschedule.py), then lets it go on, or drops it when that rate-capped path's buffer is full.

The kernel here has no netem (and no nft `queue` statement), but it has nfnetlink_queue and the xtables NFQUEUE
target; linkshaping.py adds the rule that queues the packets other hosts send this one once this process says
`link_delay_ready` (a structlog event on stderr). On SIGTERM or SIGINT it lets every held packet go and exits 0
(closing the queue with packets still in it would drop them).

The tests' delayer for one port (tests/harness/nfqueue_delay.py) is this one with a delay only.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import select
import signal
import sys
import time

from swactor.common.events import configure_logging, get_logger
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkschedule import LinkSchedule
from swactor.localcluster.nfqueue import Flow, QueueSocket

IDLE_WAKE_S = 0.2  # with nothing held, how often the loop looks whether it was asked to stop
log = get_logger(component="linkdelay")


class LinkDelayer:
    def __init__(self, queue: int, conditions: LinkConditions, schedule: LinkSchedule | None = None) -> None:
        self.queue = QueueSocket(queue)
        self.schedule = schedule or LinkSchedule(conditions)
        self._held: list[tuple[float, int, int, Flow]] = []  # a heap of (release at, arrival order, id, flow)
        self._order = itertools.count()
        self.released = 0
        self.dropped = 0
        self.stopping = False

    def stop(self) -> None:
        self.stopping = True

    def _admit(self, now: float) -> list[int]:
        drop = []
        for p in self.queue.receive():
            at = self.schedule.admit(now, p.length, p.flow)
            if at is None:
                drop.append(p.packet_id)
            else:
                heapq.heappush(self._held, (at, next(self._order), p.packet_id, p.flow))
        self.dropped += len(drop)
        return drop

    def _due(self, now: float) -> list[int]:
        due = []
        while self._held and self._held[0][0] <= now:
            at, _, packet_id, flow = heapq.heappop(self._held)
            self.schedule.released(flow, at)
            due.append(packet_id)
        self.released += len(due)
        return due

    def run(self) -> None:
        """Hold and release until stop(); then release what is still held."""
        try:
            while not self.stopping:
                now = time.monotonic()
                timeout = min(IDLE_WAKE_S, max(0.0, self._held[0][0] - now)) if self._held else IDLE_WAKE_S
                readable, _, _ = select.select([self.queue], [], [], timeout)
                now = time.monotonic()
                drop = self._admit(now) if readable else []
                due = self._due(now)
                if drop or due:
                    self.queue.verdicts(due, drop)
        finally:
            self.release_all()

    def release_all(self) -> None:
        drop = self._admit(time.monotonic())
        self.queue.verdicts(self._due(float("inf")), drop)

    def close(self) -> None:
        self.queue.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m swactor.localcluster.linkdelay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue", type=int, required=True, help="the NFQUEUE queue number to bind in this namespace")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--rate-mbit", type=float, default=None)
    args = p.parse_args(argv)
    configure_logging("swactor-linkdelay")
    try:
        conditions = LinkConditions(args.delay_ms, args.jitter_ms, 0.0, args.rate_mbit)
        delayer = LinkDelayer(args.queue, conditions)
    except (ValueError, OSError) as e:
        log.error("link_delay_failed", queue=args.queue, detail=str(e))
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: delayer.stop())
    log.info("link_delay_ready", queue=args.queue, **conditions.as_dict())
    try:
        delayer.run()
    finally:
        delayer.close()
    log.info("link_delay_stopped", queue=args.queue, released=delayer.released, dropped=delayer.dropped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
