"""The process adapter's stream (framing.py): the step's hot messages as binary frames, the rest as JSON lines."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import pytest

from swactor.v1 import common_pb2 as pb
from swactor.worker.process import framing, wire

HANDLE = wire.DeviceHandle(3, 2**64 - 1)
HOT: list[Any] = [
    wire.ObjectLoaded(5, 7, 1, 500, 12, 2304, HANDLE, flags=4, granted_step=9, at_us=1_700_000_000_123_456),
    wire.ObjectProduced(6, 7, 1, 500, 12, 8, at_us=1_700_000_000_123_999),
    wire.StepCompleted(9, 41, layers_us=870),
    wire.DeviceObjectReleased(HANDLE),
    wire.ReleaseDeviceObject(HANDLE),
    wire.RingReadable(5),
    wire.RingWritable(6),
    wire.ExecuteStep(9, 41, [wire.InputBinding(0, 500, 12, HANDLE), wire.InputBinding(0, 501, 3, wire.DeviceHandle(3, 4))],
                     [wire.OutputBinding(1, 6, 500, 12, 8, flags=2)], {"start_pos": 17, "rows": [1, 1]},
                     release_inputs_after=False),
    wire.ExecuteStep(9, 42, [], [], {}),
]
COLD: list[Any] = [
    wire.InitializeWorker(1, 1 << 26, 1, {"device": "CPU"}),
    wire.StepFailed(9, 41, pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY, "out of memory\non the device"),
    wire.WorkerFatal(pb.WORKER_FATAL_UNHANDLED_EXCEPTION, "KeyError"),
]


@dataclass(frozen=True)
class BoolHolder:
    id: int
    flag: bool


def either(data: bytes) -> Any:
    try:
        return framing.decode_event(data)
    except wire.MalformedMessage:
        return framing.decode_command(data)


@pytest.mark.parametrize("message", HOT, ids=lambda m: type(m).__name__)
def test_a_hot_message_is_one_binary_frame_that_comes_back_equal(message: Any) -> None:
    data = framing.frame(message)
    assert data[0] >= 0x80 and b"{" not in data[:1]
    back = either(data)
    assert back == message and type(back) is type(message)
    assert getattr(back, "at_us", None) == getattr(message, "at_us", None)  # compare=False: checked by hand
    assert getattr(back, "layers_us", None) == getattr(message, "layers_us", None)
    assert len(data) < len(wire.encode(message))


@pytest.mark.parametrize("message", COLD, ids=lambda m: type(m).__name__)
def test_other_messages_stay_json_lines(message: Any) -> None:
    data = framing.frame(message)
    assert data == wire.encode(message).encode() + b"\n"
    assert either(data.rstrip(b"\n")) == message


def test_a_json_line_of_a_hot_message_is_still_read() -> None:
    """People and tests may type any command as JSON (docs/worker.md): the binary form is an option of the writer."""
    step = HOT[7]
    assert framing.decode_command(wire.encode(step)) == step
    assert framing.decode_event(wire.encode(HOT[0]).encode()) == HOT[0]


def test_the_reader_splits_a_mixed_stream_wherever_its_chunks_end() -> None:
    messages = [COLD[0], *HOT, COLD[1], HOT[0]]
    stream = b"\n" + b"".join(framing.frame(m) for m in messages) + b"\n  \n"  # blank lines are skipped
    for size in (1, 2, 5, 64, len(stream)):
        reader = framing.FrameReader()
        frames = []
        for at in range(0, len(stream), size):
            frames += reader.feed(stream[at:at + size])
        assert [either(f) for f in frames] == messages, size
        assert not reader.partial
    reader = framing.FrameReader()
    assert reader.feed(framing.frame(HOT[0])[:-1]) == [] and reader.partial


def frame_of(tag: int, body: bytes) -> bytes:
    return bytes((tag,)) + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(("data", "says"), [
    (frame_of(0xFE, b""), "unknown binary command tag 0xfe"),
    (framing.frame(HOT[0]), "ObjectLoaded is not a command"),
    (framing.frame(HOT[5])[:-1] + b"", "length does not match"),
    (frame_of(0x85, b"\x05" * 9), "RingReadable: a 8-byte body expected, got 9"),
    (frame_of(0x87, struct.pack("<QQBII", 9, 41, 2, 0, 0) + b"{}"), "release_inputs_after: expected a boolean"),
    (frame_of(0x87, struct.pack("<QQBII", 9, 41, 1, 1000, 0) + b"{}"), "1000 inputs and 0 outputs do not fit"),
    (frame_of(0x87, struct.pack("<QQBII", 9, 41, 1, 0, 0) + b"[1]"), "runtime: expected an object, got list"),
    (frame_of(0x87, struct.pack("<QQBII", 9, 41, 1, 0, 0) + b"{"), "runtime: not valid JSON"),
    (frame_of(0x87, b"\x00" * 5), "shorter than its head"),
    (b'{"type": "FormatDisk"}', "unknown command type 'FormatDisk'"),
])
def test_a_malformed_command_frame_is_named(data: bytes, says: str) -> None:
    with pytest.raises(wire.MalformedMessage, match=says):
        framing.decode_command(data)


def test_a_bad_boolean_in_a_fixed_frame_is_named() -> None:
    """No hot message has a boolean of its own today (ExecuteStep's is checked in its head): a fixed struct's is."""
    codec = framing._FixedCodec(BoolHolder)
    with pytest.raises(wire.MalformedMessage, match=r"BoolHolder.flag: expected a boolean \(0 or 1\), got 7"):
        codec.unpack("BoolHolder", struct.pack("<QB", 1, 7))
    assert codec.unpack("BoolHolder", struct.pack("<QB", 1, 1)) == BoolHolder(1, True)


def test_an_oversized_frame_breaks_the_stream() -> None:
    with pytest.raises(wire.MalformedMessage, match="over the"):
        framing.FrameReader().feed(bytes((0x80,)) + struct.pack("<I", framing.MAX_FRAME + 1))
    with pytest.raises(wire.MalformedMessage, match="line over the"):
        framing.FrameReader().feed(b"{" + b" " * (framing.MAX_FRAME + 1))
