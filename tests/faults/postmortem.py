"""What the pool's services logged while a fault test ran, for the report of a test that failed.

A fault that fails once in many suite runs (a rare race between a fault and the next run) is lost
with the pool's directory unless its events are in the CI log: the pool fixture marks where every
service's log ends before a test and, when the test fails, prints the events logged since, one line
each, in time order. Per-object chatter (pump and edge-record states, ring attach/detach) is left out; the
lines kept are the lifecycle, connection, membership and fault events a post-mortem reads first.
"""

from __future__ import annotations

import json
from pathlib import Path

from swactor.localcluster.layout import HostLayout

# Events logged for every object or ring holder; the rest of a test's events fit a failure report (a ring's wake-fd
# sharing and its ends' states are what a hung run's post-mortem needs: kept).
NOISE = frozenset({"edge.pump_state", "edge_record_state", "ring_attached", "ring_detached"})
# Fields every line carries or that repeat what the line's prefix says.
_DROP = frozenset({"event", "timestamp", "level", "service", "component", "node_id"})
MAX_LINES = 400  # the last ones, when a test logged more


def log_marks(hosts: list[HostLayout]) -> dict[Path, int]:
    """Where each service log of `hosts` ends now."""
    return {p: p.stat().st_size for h in hosts for p in sorted(h.log_dir.glob("*.log"))}


# A ring end found ready without its wake-up (the compute process's loop, an edge driver's pump, a token endpoint:
# `ring_wake_missed` and `edge.ring_wake_missed`), or wake fds the stage node could not hand the compute process or
# that it could not use: a run survives them (a second's delay) but each is a lost wake-up to explain.
LOST_WAKEUPS = frozenset({"ring_wake_missed", "worker_wake_fds_not_shared", "ring_wake_fds_rejected"})


def events_since(marks: dict[Path, int], hosts: list[HostLayout], max_lines: int = MAX_LINES,
                 only: frozenset[str] | None = None) -> list[str]:
    """The events logged after `marks` (a log not marked: from its start), oldest first, as
    `time hN/service event key=value ...`; the last `max_lines` of them (`only`: those events alone)."""
    rows: list[tuple[str, str]] = []
    for h in hosts:
        for path in sorted(h.log_dir.glob("*.log")):
            stamp = ""  # a line that is not an event (a traceback's) sorts with the event before it
            with path.open("rb") as f:
                f.seek(marks.get(path, 0))
                for raw in f:
                    if only is not None and not any(name.encode() in raw for name in only):
                        continue
                    stamp, text = _line(raw, f"h{h.index}/{path.stem}", stamp)
                    if text:
                        rows.append((stamp, text))
    rows.sort(key=lambda row: row[0])  # stable: a file's lines of one stamp keep their order
    return [text for _, text in rows[-max_lines:]]


def _line(raw: bytes, where: str, stamp: str) -> tuple[str, str]:
    """(its timestamp, its text; empty when left out)."""
    try:
        event = json.loads(raw)
    except ValueError:
        text = raw.decode(errors="replace").rstrip()
        return stamp, f"{stamp[11:23]} {where} {text}" if text else ""
    if not isinstance(event, dict):
        return stamp, ""
    stamp = str(event.get("timestamp", stamp))
    if event.get("event") in NOISE:
        return stamp, ""
    fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in _DROP)
    return stamp, f"{stamp[11:23]} {where} {event.get('event')} {fields}".rstrip()
