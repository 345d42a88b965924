"""How the process adapter's messages travel on stdin / stdout: JSON lines, and binary frames for the step's hot path.

A decode step crosses between the node service and the compute process several times (ObjectLoaded, ExecuteStep,
ObjectProduced, StepCompleted, ReleaseDeviceObject and DeviceObjectReleased; a standing grant leaves the events).
As JSON each message cost 7-40 us to encode and as much to decode, on both sides of every step of every stage, so
those messages (`BINARY`) travel as fixed binary structs instead; everything else (initialisation, roles, rings,
grants, failures: rare, and read by people in tests and docs) stays a JSON line (wire.py).

The stream is a sequence of frames, told apart by their first byte:
- below 0x80: a JSON line (wire.py's codec), up to its newline; blank lines are skipped;
- 0x80 and up: a binary frame: the tag byte (0x80 + the message's index in `BINARY`), the body's length (u32 LE),
  then the body: the message's fields in dataclass order, nested dataclasses flattened, ints as u64, booleans as one
  byte (0 or 1), all little-endian. ExecuteStep's lists are preceded by their counts and its
  runtime dict follows as JSON text (it is small and open-ended).

Decoding is as strict as the JSON codec's: an unknown tag, a body of the wrong length, a boolean other than 0 or 1,
an event's tag where a command is read (or the reverse), or a frame over `MAX_FRAME` bytes is a `wire.MalformedMessage` naming it.
Both ends are the same installed package (GpuWorkerCtl spawns `python -m swactor.worker.process` from its own
interpreter), so the structs need no version of their own.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import struct
from collections.abc import Callable, Iterator
from typing import Any

from swactor.worker.process import wire

MAX_FRAME = 1 << 20  # bytes: a JSON line or binary body longer than this is malformed (a runaway writer)
_FIRST_BINARY_TAG = 0x80
_LENGTH = struct.Struct("<I")


class _FixedCodec:
    """One dataclass of scalar fields (and nested dataclasses of them) as one struct."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self._paths, fmt = self._layout(cls, "")
        self.struct = struct.Struct("<" + fmt)
        self._bools = [i for i, code in enumerate(fmt) if code == "B"]
        self._make = self._maker(cls)
        getter = operator.attrgetter(*self._paths)
        self._values = (lambda m: (getter(m),)) if len(self._paths) == 1 else getter

    @classmethod
    def _layout(cls, dc: type, prefix: str) -> tuple[list[str], str]:
        """Each scalar's dotted path, and the struct format."""
        paths: list[str] = []
        fmt = ""
        hints = wire._hints(dc)
        for f in dataclasses.fields(dc):  # type: ignore[arg-type]
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                inner_paths, inner = cls._layout(hint, f"{prefix}{f.name}.")  # type: ignore[arg-type]
                paths += inner_paths
                fmt += inner
                continue
            if hint is bool:
                fmt += "B"
            elif hint is int:
                fmt += "Q"
            else:  # a reason, a string, a list: not on the hot path, so not worth a binary form
                raise TypeError(f"{dc.__name__}.{f.name}: {hint!r} has no fixed binary form")
            paths.append(prefix + f.name)
        return paths, fmt

    def pack(self, message: Any) -> bytes:
        return self.struct.pack(*self._values(message))

    def build(self, path: str, values: tuple[Any, ...]) -> Any:
        """The message from its unpacked values, each checked as the JSON codec would."""
        for i in self._bools:
            if values[i] > 1:
                raise wire.MalformedMessage(f"{path}.{self._paths[i]}: expected a boolean (0 or 1), got {values[i]}")
        return self._make(iter(values))

    @staticmethod
    def _maker(cls: type) -> Callable[[Iterator[Any]], Any]:
        """A function that builds `cls` from the flat values in struct order, nested dataclasses included."""
        hints = wire._hints(cls)
        parts: list[Callable[[Iterator[Any]], Any]] = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                parts.append(_FixedCodec._maker(hint))  # type: ignore[arg-type]
            else:
                parts.append((lambda it: bool(next(it))) if hint is bool else next)
        return lambda it: cls(*[part(it) for part in parts])

    def unpack(self, path: str, body: bytes) -> Any:
        if len(body) != self.struct.size:
            raise wire.MalformedMessage(f"{path}: a {self.struct.size}-byte body expected, got {len(body)}")
        return self.build(path, self.struct.unpack(body))


class _ExecuteStepCodec:
    """ExecuteStep: role_id, step_id, release_inputs_after, the inputs' and outputs' counts; the bindings; the
    runtime dict as JSON text (the rest of the body)."""

    cls = wire.ExecuteStep
    head = struct.Struct("<QQBII")

    def __init__(self) -> None:
        self.input = _FixedCodec(wire.InputBinding)
        self.output = _FixedCodec(wire.OutputBinding)

    def pack(self, step: wire.ExecuteStep) -> bytes:
        parts = [self.head.pack(step.role_id, step.step_id, step.release_inputs_after, len(step.inputs),
                                len(step.outputs))]
        parts += [self.input.pack(b) for b in step.inputs]
        parts += [self.output.pack(b) for b in step.outputs]
        parts.append(json.dumps(step.runtime, separators=(",", ":")).encode())
        return b"".join(parts)

    def unpack(self, path: str, body: bytes) -> wire.ExecuteStep:
        if len(body) < self.head.size:
            raise wire.MalformedMessage(f"{path}: body of {len(body)} bytes is shorter than its head")
        role_id, step_id, release, n_in, n_out = self.head.unpack_from(body)
        if release > 1:
            raise wire.MalformedMessage(f"{path}.release_inputs_after: expected a boolean (0 or 1), got {release}")
        at = self.head.size
        bindings_end = at + n_in * self.input.struct.size + n_out * self.output.struct.size
        if bindings_end > len(body):
            raise wire.MalformedMessage(f"{path}: {n_in} inputs and {n_out} outputs do not fit its {len(body)} bytes")
        inputs = []
        for i in range(n_in):
            inputs.append(self.input.build(f"{path}.inputs[{i}]", self.input.struct.unpack_from(body, at)))
            at += self.input.struct.size
        outputs = []
        for i in range(n_out):
            outputs.append(self.output.build(f"{path}.outputs[{i}]", self.output.struct.unpack_from(body, at)))
            at += self.output.struct.size
        try:
            runtime = json.loads(body[at:])
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise wire.MalformedMessage(f"{path}.runtime: not valid JSON: {e}") from None
        if not isinstance(runtime, dict):
            raise wire.MalformedMessage(f"{path}.runtime: expected an object, got {type(runtime).__name__}")
        return wire.ExecuteStep(role_id, step_id, inputs, outputs, runtime, bool(release))


# The hot path's messages, by tag (0x80 + index): append only, so a tag keeps its meaning.
BINARY: tuple[Any, ...] = (
    _FixedCodec(wire.ObjectLoaded),
    _FixedCodec(wire.ObjectProduced),
    _FixedCodec(wire.StepCompleted),
    _FixedCodec(wire.DeviceObjectReleased),
    _FixedCodec(wire.ReleaseDeviceObject),
    _FixedCodec(wire.RingReadable),
    _FixedCodec(wire.RingWritable),
    _ExecuteStepCodec(),
)
_TAG_OF = {codec.cls: _FIRST_BINARY_TAG + i for i, codec in enumerate(BINARY)}


def frame(message: Any) -> bytes:
    """The bytes that carry `message` on the stream: its binary frame, or its JSON line with the newline."""
    tag = _TAG_OF.get(type(message))
    if tag is None:
        return wire.encode(message).encode() + b"\n"
    body = BINARY[tag - _FIRST_BINARY_TAG].pack(message)
    return bytes((tag,)) + _LENGTH.pack(len(body)) + body


def _decode(data: bytes, table: dict[str, type], what: str, decode_json: Any) -> Any:
    if not data or data[0] < _FIRST_BINARY_TAG:
        return decode_json(data)
    index = data[0] - _FIRST_BINARY_TAG
    if index >= len(BINARY):
        raise wire.MalformedMessage(f"unknown binary {what} tag 0x{data[0]:02x}")
    codec = BINARY[index]
    name = codec.cls.__name__
    if name not in table:
        raise wire.MalformedMessage(f"{name} is not a {what}")
    if len(data) < 1 + _LENGTH.size or _LENGTH.unpack_from(data, 1)[0] != len(data) - 1 - _LENGTH.size:
        raise wire.MalformedMessage(f"{name}: the frame's length does not match its body")
    return codec.unpack(name, data[1 + _LENGTH.size:])


def decode_command(data: bytes | str) -> wire.Command:
    """One frame from `FrameReader` (or a JSON line) as a command."""
    return _decode(data.encode() if isinstance(data, str) else data, wire.COMMANDS, "command", wire.decode_command)  # type: ignore[no-any-return]


def decode_event(data: bytes | str) -> wire.Event:
    """One frame from `FrameReader` (or a JSON line) as an event."""
    return _decode(data.encode() if isinstance(data, str) else data, wire.EVENTS, "event", wire.decode_event)  # type: ignore[no-any-return]


class FrameReader:
    """Splits a byte stream into whole frames (each still to be decoded); keeps the tail of a partial one."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """The frames `chunk` completed, in order. Raises MalformedMessage for a frame over MAX_FRAME bytes (the
        stream cannot be trusted after it: the caller treats the other end as broken)."""
        buf = self._buf
        buf += chunk
        frames: list[bytes] = []
        at = 0
        while at < len(buf):
            if buf[at] >= _FIRST_BINARY_TAG:
                if len(buf) - at < 1 + _LENGTH.size:
                    break
                (length,) = _LENGTH.unpack_from(buf, at + 1)
                if length > MAX_FRAME:
                    raise wire.MalformedMessage(f"a binary frame of {length} bytes is over the {MAX_FRAME}-byte limit")
                end = at + 1 + _LENGTH.size + length
                if end > len(buf):
                    break
                frames.append(bytes(buf[at:end]))
                at = end
            else:
                newline = buf.find(b"\n", at)
                if newline < 0:
                    if len(buf) - at > MAX_FRAME:
                        raise wire.MalformedMessage(f"a line over the {MAX_FRAME}-byte limit")
                    break
                line = bytes(buf[at:newline])
                if line.strip():
                    frames.append(line)
                at = newline + 1
        del buf[:at]
        return frames

    @property
    def partial(self) -> bool:
        """Bytes of an unfinished frame are held (at end of stream: it was cut short)."""
        return bool(self._buf.strip())
