"""The one wall clock the services stamp events and records with."""

from __future__ import annotations

import time


def wall_us() -> int:
    """Microseconds since the epoch: the unit of every *_us field of the protos."""
    return time.time_ns() // 1000
