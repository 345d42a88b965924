"""Ring header and layout validation (spec §18, §20): corrupt input raises RingError naming the field."""

from __future__ import annotations

import mmap
import os
import struct

import pytest

import swactor_ring as sr

# Byte offsets of the header fields (docs/ring.md).
OFFSETS = {
    "magic": (0, "<I"),
    "version": (4, "<H"),
    "header_len": (6, "<H"),
    "ring_id": (8, "<Q"),
    "capacity": (16, "<Q"),
    "commit": (64, "<Q"),
    "consume": (128, "<Q"),
    "state": (192, "<I"),
    "wake": (196, "<I"),
}


@pytest.fixture
def raw(arena_fd: tuple[int, int]) -> mmap.mmap:
    """A second, independent mapping of the arena memfd, to play a corrupting peer."""
    fd, size = arena_fd
    m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    yield m
    m.close()


def test_header_bytes_match_the_documented_abi(arena: sr.Arena, raw: mmap.mmap) -> None:
    layout = sr.RingLayout.for_range(0x1122334455, 8192, 4096, 64)
    sr.init_ring(arena, layout)
    base = layout.header_offset

    def field(name: str) -> int:
        off, fmt = OFFSETS[name]
        return struct.unpack_from(fmt, raw, base + off)[0]

    assert raw[base : base + 4] == b"SWRG"
    assert field("magic") == sr.RING_MAGIC
    assert (field("version"), field("header_len"), field("ring_id"), field("capacity")) == (
        1,
        256,
        0x1122334455,
        4096,
    )
    assert (field("commit"), field("consume"), field("state"), field("wake")) == (0, 0, 1, 0)
    p = sr.Producer(arena, layout)
    assert p.write(b"abc") == 3
    assert field("commit") == 3
    assert raw[layout.data_offset : layout.data_offset + 3] == b"abc"
    c = sr.Consumer(arena, layout)
    assert c.read(2) == b"ab"
    assert field("consume") == 2
    assert not c.wait_readable(0.0) or c.readable() == 1
    p.close()
    assert field("state") == 2
    c.fault()
    assert field("state") == 3
    assert sr.HEADER_LEN == 256


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("magic", 0xDEADBEEF, "RingLayoutInvalid"),
        ("version", 2, "UnsupportedRingVersion"),
        ("header_len", 64, "RingLayoutInvalid"),
        ("capacity", 8192, "RingLayoutInvalid"),
        ("ring_id", 8, "RingLayoutInvalid"),
        ("state", 0, "RingStateInvalid"),
        ("state", 9, "RingStateInvalid"),
        ("wake", 0x100, "RingStateInvalid"),
        ("commit", 4097, "RingStateInvalid"),
        ("consume", 1, "RingStateInvalid"),
    ],
)
def test_corrupt_header_field_is_named(
    arena: sr.Arena, raw: mmap.mmap, field: str, value: int, reason: str
) -> None:
    layout = sr.RingLayout.for_range(7, 0, 4096, 64)
    sr.init_ring(arena, layout)
    off, fmt = OFFSETS[field]
    struct.pack_into(fmt, raw, layout.header_offset + off, value)
    for opener in (sr.open_ring, sr.Producer, sr.Consumer):
        with pytest.raises(sr.RingError) as e:
            opener(arena, layout)
        assert e.value.field == field
        assert e.value.reason == reason
        assert isinstance(e.value, ValueError)


def test_uninitialised_range_is_not_a_ring(arena: sr.Arena) -> None:
    with pytest.raises(sr.RingError) as e:
        sr.Consumer(arena, sr.RingLayout.for_range(1, 1 << 20, 4096, 64))
    assert e.value.field == "magic"


def test_peer_scribbling_cursors_at_runtime_raises_instead_of_overrunning(
    arena: sr.Arena, raw: mmap.mmap
) -> None:
    layout = sr.RingLayout.for_range(3, 0, 4096, 64)
    sr.init_ring(arena, layout)
    p = sr.Producer(arena, layout)
    c = sr.Consumer(arena, layout)
    p.write(b"x" * 100)
    struct.pack_into("<Q", raw, 64, 1 << 40)  # commit far beyond capacity
    with pytest.raises(sr.RingError) as e:
        c.readable_span()
    assert (e.value.field, e.value.reason) == ("commit", "RingStateInvalid")
    struct.pack_into("<Q", raw, 64, 100)
    struct.pack_into("<Q", raw, 128, 5000)  # consume ahead of the producer
    with pytest.raises(sr.RingError) as e:
        p.writable_span()
    assert e.value.field == "consume"
    struct.pack_into("<I", raw, 192, 42)
    with pytest.raises(sr.RingError) as e:
        _ = p.state
    assert e.value.field == "state"


GOOD = dict(
    ring_id=1,
    arena_offset=0,
    total_len=256 + 4096,
    header_offset=0,
    data_offset=256,
    data_capacity=4096,
    alignment=64,
)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"alignment": 3}, "alignment"),
        ({"alignment": 0}, "alignment"),
        ({"data_capacity": 0}, "data_capacity"),
        ({"data_capacity": 1000}, "data_capacity"),  # not a multiple of the alignment
        ({"header_offset": 32}, "header_offset"),  # misaligned header
        ({"data_offset": 200}, "data_offset"),  # overlaps the header
        ({"data_offset": 320}, "data_offset"),  # misaligned for 128
        ({"arena_offset": (4 << 20) - 1024}, "total_len"),  # outside the arena
        ({"total_len": 1 << 40}, "total_len"),
        ({"arena_offset": 2**64 - 64}, "total_len"),  # overflow
        ({"total_len": 4000}, "data_capacity"),  # data beyond the leased range
    ],
)
def test_bad_layouts_raise_before_touching_memory(
    arena: sr.Arena, changes: dict[str, int], field: str
) -> None:
    fields = GOOD | changes
    if changes.get("data_offset") == 320:
        fields["alignment"] = 128
        fields["data_capacity"] = 4096
    layout = sr.RingLayout(**fields)
    for op in (sr.init_ring, sr.open_ring, sr.Producer, sr.Consumer):
        with pytest.raises(sr.RingError) as e:
            op(arena, layout)
        assert e.value.field == field, (op, e.value)
        assert e.value.reason == "RingLayoutInvalid"
    with pytest.raises(sr.RingError):
        layout.validate(arena.size)


def test_layout_helpers_mint_valid_layouts() -> None:
    assert sr.RingLayout.range_alignment(16) == 64
    assert sr.RingLayout.range_alignment(4096) == 4096
    assert sr.RingLayout.required_len(4096, 64) == 256 + 4096
    assert sr.RingLayout.required_len(8192, 4096) == 4096 + 8192
    layout = sr.RingLayout.for_range(9, 4096, 8192, 4096)
    assert (layout.header_offset, layout.data_offset, layout.total_len) == (4096, 8192, 12288)
    layout.validate(4096 + 12288)
    assert layout == sr.RingLayout(9, 4096, 12288, 4096, 8192, 8192, 4096)
    assert hash(layout) == hash(sr.RingLayout(9, 4096, 12288, 4096, 8192, 8192, 4096))
    with pytest.raises(sr.RingError) as e:
        sr.RingLayout.for_range(9, 100, 8192, 64)
    assert e.value.field == "arena_offset"
    with pytest.raises(sr.RingError) as e:
        sr.RingLayout.required_len(100, 64)
    assert e.value.field == "data_capacity"


def test_arena_and_eventfd_inputs_are_checked(arena_fd: tuple[int, int], arena: sr.Arena) -> None:
    fd, size = arena_fd
    with pytest.raises(ValueError, match="smaller"):
        sr.Arena.from_fd(fd, size * 2)
    with pytest.raises(ValueError):
        sr.Arena.from_fd(fd, 0)
    with pytest.raises(sr.RingError):
        sr.Arena.from_fd(-1, size)
    r, w = os.pipe()
    try:
        with pytest.raises(ValueError, match="smaller"):
            sr.Arena.from_fd(r, 4096)  # a pipe has no size to map
        layout = sr.RingLayout.for_range(1, 0, 4096, 64)
        sr.init_ring(arena, layout)
        with pytest.raises(ValueError, match="not an eventfd"):
            sr.Consumer(arena, layout, readable_fd=r)
    finally:
        os.close(r)
        os.close(w)
    closed = sr.eventfd()
    os.close(closed)
    with pytest.raises(OSError):
        sr.Producer(arena, sr.RingLayout.for_range(1, 0, 4096, 64), readable_fd=closed, writable_fd=closed)
    with pytest.raises(ValueError):
        sr.Arena.create_memfd("bad\0name", 4096)


def test_memfd_is_sealed_against_shrinking(arena_fd: tuple[int, int]) -> None:
    fd, size = arena_fd
    with pytest.raises(PermissionError):
        os.ftruncate(fd, size // 2)
