"""Stop strings over a stream of token texts: a stop string is never emitted, even when it arrives split
across several tokens.

The scanner holds back the longest tail of what it has seen that could still begin a stop string, so a
client receives text a little later than its token only while that text might be the start of one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_STOPS = 4


@dataclass
class StopScanner:
    stops: tuple[str, ...]
    _held: str = field(default="", init=False)
    stopped: bool = field(default=False, init=False)

    def feed(self, text: str) -> str:
        """The text that may go to the client now; after a stop string it is the text before it and
        `stopped` is set (feed nothing more)."""
        if self.stopped:
            raise RuntimeError("feed after a stop string")
        if not self.stops:
            return text
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buf[:min(hits)]
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """What was held back, at the end of the answer (it turned out to begin no stop string)."""
        out, self._held = self._held, ""
        return out

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
