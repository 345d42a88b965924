"""SwaRing (worker/compute/swa_ring.py), the host side of a sliding-window layer's KV ring, against its contract: after
any sequence of a run's steps (chunks padded or not, decode rows, rejected drafts taken back, a new run in the slot),
each query of a step sees, through its mask row, exactly the positions of its window, each in one place, all among
the places the step reads, and the places the step writes to are where those positions are recorded. The device side is in test_arch.py."""
from __future__ import annotations

import numpy as np
import pytest

from swactor.modelfile.memory import swa_cache_positions
from swactor.worker.compute.swa_ring import SwaRing


@pytest.mark.parametrize(("window", "rows"), [(3, 1), (3, 4), (5, 8), (16, 4), (1, 3)])
def test_every_query_sees_exactly_its_window(window: int, rows: int) -> None:
  max_seq, reach = 6 * (window + rows), 5
  ring = SwaRing(window, rows, caches=2, max_seq_len=max_seq, reach=reach)
  assert ring.length == swa_cache_positions(window, rows, reach) == window + max(rows, reach) + 2 * rows - 2
  rng = np.random.default_rng(window * 100 + rows)
  for _ in range(40):  # runs, each in slot 0 or 1 (a slot reused by a new run)
    slot, pos, top = int(rng.integers(2)), 0, -1
    ring.clear(slot)
    written: dict[int, int] = {}  # position -> the place its last write went to
    while pos < max_seq:
      width = 1 if rows == 1 or rng.random() < 0.5 else rows
      real = min(width if width == 1 else int(rng.integers(1, width + 1)), max_seq - pos)
      at = ring.place(slot, pos, real, width)
      assert at >= 0 and at + width <= ring.dump
      mask, reads = ring.mask(slot, pos, width), ring.seen(pos, width)
      assert at + width <= reads and np.isneginf(mask[:, reads:]).all()  # the places the step reads hold all it sees
      for i in range(real):
        written[pos + i] = at + i
        q = pos + i
        seen = np.flatnonzero(mask[i] == 0)
        want = range(max(0, q - window + 1), q + 1)
        assert sorted(written[p] for p in want) == sorted(seen.tolist()), (q, want)
        assert np.isneginf(np.delete(mask[i], seen)).all()
      top = max(top, pos + width - 1)  # padding rows overwrite places too
      pos += real
      lowest = max(1, top + 1 - max(rows, reach))  # a rewind reaches `reach` back from the furthest written
      if rng.random() < 0.3 and lowest < pos:  # drafts rejected: the run goes back and writes those positions again
        if lowest > 1:
          with pytest.raises(ValueError, match="takes back at most"):
            ring.rewind(slot, lowest - 1)
        pos = int(rng.integers(lowest, pos))
        ring.rewind(slot, pos)


def test_no_runs_rows_go_to_the_dump_and_bad_steps_are_refused() -> None:
  ring = SwaRing(4, 2, caches=1, max_seq_len=32, reach=3)
  assert ring.place(0, 32, 2, 2) == ring.dump == ring.length - 2
  assert (ring.mask(0, 32, 2) == 0).all() and ring.seen(32, 2) == ring.length  # a capture's rows: nothing masked (no NaN)
  with pytest.raises(ValueError, match="does not fit"):
    ring.place(0, 0, 3, 3)
  with pytest.raises(ValueError, match="window >= 1"):
    SwaRing(0, 4, caches=1, max_seq_len=32)
  for pos in range(12):
    ring.place(0, pos, 1, 1)
  with pytest.raises(ValueError, match="at most 3 positions from the furthest written, not 4"):  # what it overwrote may be in a window again
    ring.rewind(0, 8)
  ring.rewind(0, 9)
  ring.clear(0)
  assert (ring.mask(0, 0, 1) == -np.inf).all()  # nothing held: a new run's first row sees only what it writes
