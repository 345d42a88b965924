"""The ring layout (§18) and object spec (§17) as plain values: what the edge-end machinery passes
between the arena-manager, the edge-driver, the ring host and the ring-object FSMs.

The compute process's JSON wire (`swactor.worker.process.wire`) carries these same dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """§18 RingLayout, arena-relative."""

    ring_id: int
    arena_offset: int
    total_len: int
    header_offset: int
    data_offset: int
    data_capacity: int
    alignment: int


@dataclass(frozen=True)
class ObjSpec:
    """§17 ObjectSpec. kind: Tokens|Activations|Weights; dtype_family: Float|Int|Uint|Bfloat."""

    kind: str
    max_extent: int
    dtype_family: str
    dtype_width_bytes: int
    row_elements: int
    alignment: int
    sequence_policy: str = "StrictlyConsecutive"
