"""The conditions of the links between a local pool's hosts: one-way delay, jitter, loss and a rate cap on every
packet a host sends to another host, so that an operator can try a pool at the conditions of the hosts they mean to
rent (`python -m swactor.localcluster --link-delay-ms 40 ...`, `swactor demo --link-...`).

Pure: the values, their ranges and how they read; linkshaping.py applies them to the hosts' namespaces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_DELAY_MS = 10_000
MAX_RATE_MBIT = 100_000.0  # far above what the user-space delayer can carry: a cap, not a promise


@dataclass(frozen=True)
class LinkConditions:
    # Each applies to every one-way path from one host to another, alike and independently.
    delay_ms: float = 0.0  # one way: the round trip between two hosts is twice this
    jitter_ms: float = 0.0  # each packet's delay is uniform in [delay - jitter, delay + jitter]
    loss_pct: float = 0.0  # of the packets, each independently
    rate_mbit: float | None = None  # what one host gets from one other host at most; None: no cap

    def __post_init__(self) -> None:
        why = self.problem()
        if why is not None:
            raise ValueError(why)

    def problem(self) -> str | None:
        """Why these conditions cannot be applied (named by field), or None."""
        values = {"delay_ms": self.delay_ms, "jitter_ms": self.jitter_ms, "loss_pct": self.loss_pct}
        if self.rate_mbit is not None:
            values["rate_mbit"] = self.rate_mbit
        for name, value in values.items():
            if not math.isfinite(value):
                return f"link {name} must be a finite number, got {value!r}"
        if not 0 <= self.delay_ms <= MAX_DELAY_MS:
            return f"link delay_ms must be in [0, {MAX_DELAY_MS}], got {self.delay_ms:g}"
        if not 0 <= self.jitter_ms <= self.delay_ms:
            return f"link jitter_ms must be in [0, delay_ms {self.delay_ms:g}], got {self.jitter_ms:g}"
        if not 0 <= self.loss_pct <= 100:
            return f"link loss_pct must be in [0, 100], got {self.loss_pct:g}"
        if self.rate_mbit is not None and not 0 < self.rate_mbit <= MAX_RATE_MBIT:
            return f"link rate_mbit must be in (0, {MAX_RATE_MBIT:g}], got {self.rate_mbit:g}"
        return None

    @property
    def shaped(self) -> bool:
        """Whether any packet between hosts is touched at all."""
        return self.loss_pct > 0 or self.needs_delayer

    @property
    def needs_delayer(self) -> bool:
        """Delay, jitter and the rate cap hold packets in user space; loss alone is a kernel rule."""
        return self.delay_ms > 0 or self.rate_mbit is not None

    @property
    def rate_bytes_s(self) -> float | None:
        return None if self.rate_mbit is None else self.rate_mbit * 1e6 / 8

    def describe(self) -> str:
        if not self.shaped:
            return "none (hosts reach each other at this machine's own speed)"
        return self.summary() + ", on every packet a host sends to another host (each one-way path alike)"

    def summary(self) -> str:
        """The values alone ("one-way delay 40 ms, loss 1 %"), for a scope the caller names."""
        parts = [f"one-way delay {self.delay_ms:g} ms" + (f" ± {self.jitter_ms:g} ms" if self.jitter_ms else "")]
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g} %")
        if self.rate_mbit is not None:
            parts.append(f"rate {self.rate_mbit:g} Mbit/s")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, float | None]:
        return {"delay_ms": self.delay_ms, "jitter_ms": self.jitter_ms, "loss_pct": self.loss_pct,
                "rate_mbit": self.rate_mbit}
