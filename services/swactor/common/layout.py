"""The §18 ring layout as a plain value: what the arena-manager mints, leases carry, the edge-end
machinery passes to ring hosts and drivers, and the compute process's JSON wire carries.

Its other two spellings are the common.proto RingLayout (`from_pb` / `to_pb`) and ring-rs'
RingLayout (`swactor.common.ringport.native_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from swactor.v1 import common_pb2


@dataclass(frozen=True, slots=True)
class Layout:
    """§18 RingLayout: arena-relative offsets only."""

    ring_id: int
    arena_offset: int
    total_len: int
    header_offset: int
    data_offset: int
    data_capacity: int
    alignment: int

    @classmethod
    def from_pb(cls, msg: common_pb2.RingLayout) -> Layout:
        return cls(*(getattr(msg, name) for name in FIELDS))

    def to_pb(self) -> common_pb2.RingLayout:
        return common_pb2.RingLayout(**{name: getattr(self, name) for name in FIELDS})


FIELDS = tuple(f.name for f in fields(Layout))
