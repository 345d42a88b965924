"""How fast this host computes: microseconds per layer of a one-row decode step, measured on its real steps.

An I/O-free core the StageNodes feed (node.py) and the worker publishes with the node's gossiped metadata
(NodeMetadata.step_us_per_layer), so the orchestrator can give a slower host fewer layers (docs/orchestrator.md
"Placement"). Only steps that measure the host's speed and nothing else count:

- one run's one-row step (a decode step, or a prompt sent row by row): a batched step carries several runs' rows and
  a prompt chunk many rows, so their time per layer is not a decode step's;
- its blocks' own time over its block count where the compute process says it (StepCompleted.layers_us): what every
  step costs besides (dispatch, IPC, embedding, head, read-back) does not grow with the blocks, and counted per block it
  makes a stage of few blocks look slower than one of many on the same host; else the whole step over the stage's
  decode work in layers (ProvisionStage's `compute_layers`: its blocks plus the head's weight in blocks on the last
  stage). Either way a host measures the same figure whichever role it computed;
- the median of the last `window` of them: the first steps of a freshly loaded role (tinygrad runs a graph twice
  before it is jitted) and a step that waited on the host's other work are outliers, not its speed.

There is no probe: a host measures itself on the first run placed on it (it holds no weights before one). A new figure
is published only when it moved by more than `change_share` from the one said, so gossip carries a change of speed,
not noise.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

WINDOW = 32
MIN_SAMPLES = 5
CHANGE_SHARE = 0.1


@dataclass
class StepSpeed:
    window: int = WINDOW
    min_samples: int = MIN_SAMPLES  # decode steps measured before a figure is said at all
    change_share: float = CHANGE_SHARE
    samples: deque[float] = field(init=False)  # seconds per layer of the last `window` decode steps
    said_us: int = 0  # the figure last returned for publishing (0: none yet)

    def __post_init__(self) -> None:
        if self.window < 1 or not 1 <= self.min_samples <= self.window:
            raise ValueError(f"need 1 <= min_samples <= window, got min_samples={self.min_samples}, "
                             f"window={self.window}")
        self.samples = deque(maxlen=self.window)

    @property
    def us_per_layer(self) -> int:
        """The median of the recent decode steps, in whole microseconds per layer (at least 1); 0 before
        `min_samples` of them."""
        if len(self.samples) < self.min_samples:
            return 0
        return max(1, round(statistics.median(self.samples) * 1e6))

    def decode_step(self, seconds: float, compute_layers: float) -> int | None:
        """One run's one-row step took `seconds` on `compute_layers` layers of work (its blocks' time over its blocks, or
        its whole time over its work in layers: the node's choice). Returns the figure to
        publish when it is the first one or moved by more than `change_share` from the one said, else None."""
        if compute_layers <= 0:
            raise ValueError(f"compute_layers must be positive, got {compute_layers}")
        if seconds <= 0:
            return None  # a clock that did not move measured nothing
        self.samples.append(seconds / compute_layers)
        now = self.us_per_layer
        if not now or (self.said_us and abs(now - self.said_us) <= self.change_share * self.said_us):
            return None
        self.said_us = now
        return now
