"""A sliding-window block's KV cache as a ring (gemma2, gemma3): the host side of where each position lives.

Why: a sliding-window block's query sees only the last `window` positions, so keeping every position of the context
(as a global block must) wastes memory and attention work: gemma3 27B's 52 sliding blocks of 62 (window 1024) at a
32k context would hold 32 times what they read. The ring keeps `swa_cache_positions(window, rows)` per run slot.

Layout: a step of a run writes its rows contiguously from `start % cycle` (cycle = window + max(rows, reach) - 1), so
the ring buffer runs rows - 1 past the cycle; a step that belongs to no run (prepare's captures, at max_seq_len) writes
at `dump`, past those. A position and the next one in the same place are `cycle` apart: more than any query's window
plus its step's other rows reach back, so no step overwrites a position a query of it or of a later step still sees,
and more than a window plus the drafts a run may take back (`reach`, MAX_DRAFT), so what rejected drafts overwrote is
out of the window of the row that follows them.
The device graph reads the ring's first `seen` places (all of them once the run's positions wrapped around, fewer for
a short run) and adds a mask row per query that this class fills from the positions it recorded: 0 where the place
holds a position in the query's window (causal included), -inf elsewhere; places that hold a padding row, a rewound
draft or nothing are never in a window. Pure numpy, no device.
"""

from __future__ import annotations

import numpy as np

from swactor.common.objflags import MAX_DRAFT
from swactor.modelfile.memory import swa_cache_positions

EMPTY = np.iinfo(np.int64).min // 2  # a place that holds no position (never within a window)


class SwaRing:
  """Per run slot (`caches` of them, the scratch slot included): the position each place of the ring holds."""

  def __init__(self, window: int, rows: int, caches: int, max_seq_len: int, reach: int = MAX_DRAFT) -> None:
    if window < 1 or rows < 1:
      raise ValueError(f"a ring needs window >= 1 and rows >= 1, got {window}, {rows}")
    self.window, self.rows, self.max_seq_len = window, rows, max_seq_len
    self.max_back = max(rows, reach)  # positions a rewind may take back from the furthest written
    self.cycle = window + self.max_back - 1
    self.length = swa_cache_positions(window, rows, reach)
    self.dump = self.length - rows
    self._held = np.full((caches, self.length), EMPTY, np.int64)
    self._top = np.full(caches, -1, np.int64)  # per slot: the furthest its run wrote, padding included (rewinds leave it)

  def place(self, slot: int, start: int, real: int, width: int) -> int:
    """Where a step's `width` rows (the first `real` of them a run's positions start.., the rest padding) are
    written in `slot`'s ring; records what they hold. A start at or past max_seq_len is no run's: the dump."""
    if start >= self.max_seq_len:
      return self.dump
    if not 0 < real <= width <= self.rows:
      raise ValueError(f"a step of {width} rows ({real} real) does not fit a ring of steps up to {self.rows} rows")
    at = start % self.cycle
    held = self._held[slot]
    held[at:at + real] = start + np.arange(real)
    held[at + real:at + width] = EMPTY
    self._top[slot] = max(self._top[slot], start + width - 1)  # padding rows overwrite places too
    return at

  def seen(self, start: int, width: int) -> int:
    """How many leading places a step of `width` rows from `start` reads (the rest hold nothing its queries see):
    before the run's positions wrap around the cycle a position's place is the position itself, so its rows see
    places below start + width; afterwards, and for no run's rows, the whole ring."""
    return self.length if start >= self.max_seq_len else min(start + width, self.length)

  def mask(self, slot: int, start: int, width: int) -> np.ndarray:
    """float32 [width, length]: row i (position start + i) 0 where `slot`'s ring holds a position within its
    window, -inf elsewhere. No run's rows (start past the context) see everything: finite, never all masked."""
    if start >= self.max_seq_len:
      return np.zeros((width, self.length), np.float32)
    q = start + np.arange(width)[:, None]
    held = self._held[slot][None, :]
    seen = (held <= q) & (held > q - self.window)
    return np.where(seen, np.float32(0), np.float32(-np.inf))

  def clear(self, slot: int) -> None:
    """A new run in `slot`: nothing of the last one is seen."""
    self._held[slot] = EMPTY
    self._top[slot] = -1

  def rewind(self, slot: int, position: int) -> None:
    """Positions >= `position` are gone (rejected drafts). The furthest position the run wrote may have overwritten
    the one a cycle before it, which must stay out of the next row's window: at most max(rows, reach) positions
    back from the furthest (a verify step's first row is always kept, so the protocol's rewinds are within)."""
    if (back := int(self._top[slot]) + 1 - position) > self.max_back:
      raise ValueError(f"a sliding-window ring takes back at most {self.max_back} positions from the furthest "
                       f"written, not {back}")
    held = self._held[slot]
    held[held >= position] = EMPTY
