"""ObjectHeader (spec §17): 40-byte little-endian encoding and every validation, mapped to ObjectFailure."""

from __future__ import annotations

import struct

import pytest

import swactor_ring as sr

FMT = "<IHHQQQII"  # magic, version, header_len, object_id, sequence, extent, flags, reserved


def raw(**overrides: int) -> bytes:
    f = (
        dict(
            magic=sr.OBJECT_MAGIC,
            version=1,
            header_len=40,
            object_id=7,
            sequence=3,
            extent=4096,
            flags=5,
            reserved=0,
        )
        | overrides
    )
    return struct.pack(FMT, *f.values())


def test_encode_is_the_documented_wire_layout() -> None:
    h = sr.ObjectHeader(7, 3, 4096, flags=5)
    assert h.encode() == raw()
    assert len(h.encode()) == sr.ObjectHeader.SIZE == sr.OBJECT_HEADER_LEN == struct.calcsize(FMT) == 40
    assert h.encode()[:4] == b"SWOB"
    assert sr.ObjectHeader.MAGIC == sr.OBJECT_MAGIC and sr.ObjectHeader.VERSION == 1
    assert (h.object_id, h.sequence, h.extent, h.flags) == (7, 3, 4096, 5)
    assert sr.ObjectHeader(7, 3, 4096).flags == 0


def test_parse_roundtrip_from_any_bytes_like() -> None:
    h = sr.ObjectHeader(2**64 - 1, 2**63, 2**40, 2**32 - 1)
    enc = h.encode()
    assert sr.ObjectHeader.parse(enc, 2**64 - 1) == h
    assert sr.ObjectHeader.parse(bytearray(enc) + b"payload", 2**40, 64) == h  # trailing payload ignored
    assert sr.ObjectHeader.parse(memoryview(enc), 2**40, 2**31) == h  # alignment is a u32
    assert hash(h) == hash(sr.ObjectHeader.parse(enc, 2**64 - 1))


@pytest.mark.parametrize(
    ("buf", "max_extent", "alignment", "failure"),
    [
        (raw()[:39], 4096, 1, "HeaderMalformed"),
        (b"", 4096, 1, "HeaderMalformed"),
        (raw(magic=0x12345678), 4096, 1, "HeaderMalformed"),
        (raw(version=0), 4096, 1, "UnsupportedObjectVersion"),
        (raw(version=2), 4096, 1, "UnsupportedObjectVersion"),
        (raw(header_len=48), 4096, 1, "HeaderMalformed"),
        (raw(header_len=0), 4096, 1, "HeaderMalformed"),
        (raw(reserved=1), 4096, 1, "HeaderMalformed"),
        (raw(extent=4097), 4096, 1, "ExtentExceedsMax"),
        (raw(extent=2**64 - 1), 2**64 - 2, 1, "ExtentExceedsMax"),
        (raw(extent=4095), 4096, 4, "ExtentAlignmentInvalid"),
        (raw(extent=4096), 8192, 8192, "ExtentAlignmentInvalid"),
    ],
)
def test_each_violation_maps_to_its_object_failure(
    buf: bytes, max_extent: int, alignment: int, failure: str
) -> None:
    with pytest.raises(sr.ObjectError) as e:
        sr.ObjectHeader.parse(buf, max_extent, alignment)
    assert e.value.failure == failure
    assert failure in str(e.value)
    assert isinstance(e.value, ValueError)


def test_bad_spec_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="power of two"):
        sr.ObjectHeader.parse(raw(), 4096, 3)
    with pytest.raises(ValueError, match="power of two"):
        sr.ObjectHeader.parse(raw(), 4096, 0)
    with pytest.raises(OverflowError):
        sr.ObjectHeader(-1, 0, 0)
    with pytest.raises(TypeError):
        sr.ObjectHeader.parse("not bytes", 4096)


def test_header_parsed_straight_from_a_ring_span(arena: sr.Arena) -> None:
    layout = sr.RingLayout.for_range(1, 0, 4096, 64)
    sr.init_ring(arena, layout)
    p, c = sr.Producer(arena, layout), sr.Consumer(arena, layout)
    h = sr.ObjectHeader(1, 0, 64)
    assert p.write(h.encode() + bytes(64)) == 104
    assert sr.ObjectHeader.parse(c.readable_span(40), 1 << 20, 64) == h
