"""The real arena memory: ring-rs layout arithmetic, header init, pre-fault and hole punching."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import swactor_ring
from swactor.arena.freelist import Range
from swactor.arena.memory import ArenaBootError, ArenaMemory, RingRsAbi
from swactor.arena.ports import RingInitError
from swactor.common.ringport import native_layout

from .fakes import FakeAbi

MIB = 1 << 20


@given(st.integers(0, 20), st.integers(1, 1 << 16), st.integers(0, 64))
def test_fake_abi_used_by_core_tests_agrees_with_ring_rs(align_log2: int, units: int, page: int) -> None:
    alignment = 1 << align_log2
    capacity = units * alignment
    real, fake = RingRsAbi(), FakeAbi()
    assert real.range_alignment(alignment) == fake.range_alignment(alignment)
    assert real.required_len(capacity, alignment) == fake.required_len(capacity, alignment)
    offset = page * max(4096, real.range_alignment(alignment))
    total = real.required_len(capacity, alignment) + 4096
    lay = real.mint(3, offset, capacity, alignment, total)
    assert lay == fake.mint(3, offset, capacity, alignment, total)
    native_layout(lay).validate(offset + total)


def test_header_init_prefault_and_punch_hole() -> None:
    mem = ArenaMemory(16 * MIB)
    try:
        lay = RingRsAbi().mint(7, 4 * MIB, 4 * MIB, 64, 4 * MIB + 4096)
        mem.prepare(lay, prefault=True)
        assert mem.allocated_bytes() >= 4 * MIB  # populated up front
        status = swactor_ring.open_ring(mem.arena, native_layout(lay))
        assert (status.ring_id, status.capacity, status.state) == (7, 4 * MIB, 1)
        mem.scrub(Range(lay.arena_offset, lay.total_len))
        assert mem.allocated_bytes() == 0
        with pytest.raises(swactor_ring.RingError):  # the header is gone with its pages
            swactor_ring.open_ring(mem.arena, native_layout(lay))
        before = mem.allocated_bytes()  # open_ring's read of the hole faulted one page back in
        lazy = RingRsAbi().mint(8, 0, MIB, 64, MIB + 4096)
        mem.prepare(lazy, prefault=False)
        assert mem.allocated_bytes() - before == 4096  # only the header page was touched
    finally:
        mem.close()


def test_bad_layout_is_a_ring_init_error_and_bad_size_a_boot_error() -> None:
    mem = ArenaMemory(MIB)
    try:
        beyond = RingRsAbi().mint(1, 0, 2 * MIB, 64, 2 * MIB + 4096)  # outside the 1 MiB arena
        with pytest.raises(RingInitError, match="ring 1"):
            mem.prepare(beyond, prefault=False)
    finally:
        mem.close()
    with pytest.raises(ArenaBootError, match="ceiling_bytes"):
        ArenaMemory(1000)
