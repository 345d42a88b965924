"""The arena's memory: one sealed sparse memfd, mapped once, and what the table asks of it.

ring-rs (`swactor_ring`) creates the memfd, maps it and writes ring headers; this module adds the
two page-level operations the lease table needs: pre-faulting a fresh range (MADV_POPULATE_WRITE)
and giving a released range's pages back to the OS (MADV_REMOVE, i.e. a hole punched in the
memfd: touched shmem pages otherwise stay allocated until the memfd dies). Both go through a plain
`mmap` of the same fd, used only for madvise: Python never reads or writes ring bytes here.
"""

from __future__ import annotations

import mmap
import os

import swactor_ring
from swactor.arena.freelist import Range
from swactor.arena.model import Layout
from swactor.arena.ports import RingInitError
from swactor.common.ringport import native_layout

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
PAGE_SIZE = mmap.PAGESIZE


class ArenaBootError(RuntimeError):
    """memfd, truncate or mmap failed: the arena goes to Failed (spec §19)."""


class RingRsAbi:
    """`RingAbi` backed by ring-rs's own layout arithmetic (one source of truth for the ABI)."""

    def range_alignment(self, alignment: int) -> int:
        return int(swactor_ring.RingLayout.range_alignment(alignment))

    def required_len(self, data_capacity: int, alignment: int) -> int:
        return int(swactor_ring.RingLayout.required_len(data_capacity, alignment))

    def mint(
        self, ring_id: int, arena_offset: int, data_capacity: int, alignment: int, total_len: int
    ) -> Layout:
        canon = swactor_ring.RingLayout.for_range(ring_id, arena_offset, data_capacity, alignment)
        # The range is page-rounded; the layout reports the whole range as total_len.
        return Layout(
            ring_id=canon.ring_id,
            arena_offset=canon.arena_offset,
            total_len=total_len,
            header_offset=canon.header_offset,
            data_offset=canon.data_offset,
            data_capacity=canon.data_capacity,
            alignment=canon.alignment,
        )


class ArenaMemory:
    """`RangeMemory` over the real memfd. Owns the fd and both mappings of this process."""

    def __init__(self, size: int, name: str = "swactor-arena") -> None:
        if size <= 0 or size % PAGE_SIZE:
            raise ArenaBootError(f"ceiling_bytes must be a positive multiple of {PAGE_SIZE}, got {size}")
        try:
            self.fd: int = swactor_ring.Arena.create_memfd(name, size)
        except (OSError, ValueError, MemoryError) as e:
            raise ArenaBootError(f"memfd_create/ftruncate of {size} bytes failed: {e}") from None
        try:
            self.arena = swactor_ring.Arena.from_fd(self.fd, size)
            self._madvise_map = mmap.mmap(
                self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except (OSError, ValueError, MemoryError) as e:
            os.close(self.fd)
            raise ArenaBootError(f"mmap of the {size}-byte arena failed: {e}") from None
        self.size = size

    def prepare(self, layout: Layout, prefault: bool) -> None:
        if prefault:
            try:
                self._madvise_map.madvise(MADV_POPULATE_WRITE, layout.arena_offset, layout.total_len)
            except OSError as e:  # e.g. ENOMEM under a memory cgroup limit
                raise RingInitError(f"pre-faulting ring {layout.ring_id} failed: {e.strerror}") from None
        try:
            swactor_ring.init_ring(self.arena, native_layout(layout))
        except (swactor_ring.RingError, ValueError, OSError) as e:
            raise RingInitError(f"ring {layout.ring_id} header init failed: {e}") from None

    def scrub(self, r: Range) -> None:
        # MADV_REMOVE on a shared shmem mapping punches a hole: the pages are freed and later
        # reads see zeros in every process that maps the memfd.
        self._madvise_map.madvise(mmap.MADV_REMOVE, r.offset, r.length)

    def allocated_bytes(self) -> int:
        """Bytes of the memfd currently backed by memory (st_blocks), for Stats, tests and benches."""
        return os.fstat(self.fd).st_blocks * 512

    def close(self) -> None:
        self._madvise_map.close()
        os.close(self.fd)
