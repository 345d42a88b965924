"""A token bucket with the time passed in (pure: tests drive it with a fake clock).

`rate` tokens per second refill a bucket of `burst` tokens; `take(now)` spends one if there is one.
A rate of 0 never refills (only the burst), a burst of 0 refuses everything.
"""

from __future__ import annotations


class TokenBucket:
    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate < 0 or burst < 0:
            raise ValueError(f"token bucket needs rate >= 0 and burst >= 0, got rate={rate} burst={burst}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = now

    def take(self, now: float) -> bool:
        """Spend one token if the bucket holds one (refilled up to `now`); False: over the rate."""
        if now > self._at:  # a clock that steps back never refills twice
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def available(self, now: float) -> float:
        """Tokens the bucket would hold at `now` (no side effect)."""
        if now <= self._at:
            return self._tokens
        return min(self.burst, self._tokens + (now - self._at) * self.rate)
