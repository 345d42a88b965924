"""SubmitRun request checks that need no model: size (on the received bytes, before parsing), UTF-8
(named by field path), NaN/inf and range of the sampling values, max_tokens, raw, client_request_id's form.

protobuf refuses a string field that is not UTF-8 while parsing, and gRPC would answer INTERNAL
without saying which; `SubmitDeserializer` parses leniently instead: a refused request reaches the
servicer as a `RefusedRequest` naming what was wrong, which it answers INVALID_ARGUMENT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from swactor.common.objflags import MAX_DRAFT
from swactor.orchestrator.api.errors import RequestError
from swactor.v1 import orchestrator_pb2 as opb

MAX_REQUEST_BYTES = 1 << 20
# A client request id is a key in the run store and goes into logs as is: short, and only visible ASCII so that it
# cannot carry control characters or look-alike spaces into either (UUIDs, ULIDs and base64 all fit).
MAX_CLIENT_REQUEST_ID = 128
_ID_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F))


@dataclass(frozen=True)
class RefusedRequest:
    """What the deserializer hands the servicer for bytes it will not parse."""

    message: str


class SubmitDeserializer:
    def __init__(self, max_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.max_bytes = max_bytes

    def __call__(self, data: bytes) -> opb.SubmitRunRequest | RefusedRequest:
        if len(data) > self.max_bytes:
            return RefusedRequest(f"the request is {len(data)} bytes; this orchestrator takes at most "
                                  f"{self.max_bytes} ([orchestrator].max_request_bytes)")
        try:
            return opb.SubmitRunRequest.FromString(data)
        except DecodeError as e:
            return RefusedRequest(utf8_error(data, opb.SubmitRunRequest.DESCRIPTOR) or f"the request does not parse: {e}")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def utf8_error(data: bytes, descriptor: Descriptor, path: str = "") -> str | None:
    """The first string field in `data` (a `descriptor` message) that is not UTF-8, by path; None if none."""
    pos, seen = 0, dict[int, int]()
    try:
        while pos < len(data):
            tag, pos = _varint(data, pos)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                _, pos = _varint(data, pos)
                continue
            if wire in (1, 5):
                pos += 8 if wire == 1 else 4
                continue
            if wire != 2:
                return None
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ValueError("truncated field")
            chunk, pos = data[pos:pos + size], pos + size
            field = descriptor.fields_by_number.get(number)
            if field is None:
                continue
            name = f"{path}{field.name}"
            if field.is_repeated:
                index = seen.get(number, 0)
                seen[number] = index + 1
                name = f"{name}[{index}]"
            if field.type == FieldDescriptor.TYPE_STRING:
                try:
                    chunk.decode("utf-8")
                except UnicodeDecodeError as e:
                    return f"{name} is not valid UTF-8 (byte {e.start}: {e.reason})"
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                inner = utf8_error(chunk, field.message_type, f"{name}.")
                if inner is not None:
                    return inner
    except ValueError:
        return None
    return None


def check_fields(req: opb.SubmitRunRequest) -> None:
    """Refuse (INVALID_ARGUMENT, naming the field) what no model could run."""
    if req.max_tokens <= 0:
        raise RequestError.invalid(f"max_tokens must be positive, got {req.max_tokens}")
    s = req.sampling
    for name, value in (("temperature", s.temperature), ("top_p", s.top_p)):
        if not math.isfinite(value):
            raise RequestError.invalid(f"sampling.{name} must be a finite number, got {value}")
    if s.temperature < 0:
        raise RequestError.invalid(f"sampling.temperature must be >= 0, got {s.temperature}")
    if not 0 <= s.top_p <= 1:
        raise RequestError.invalid(f"sampling.top_p must be in [0, 1] (0 or 1 = no nucleus cut), got {s.top_p}")
    if req.raw and req.WhichOneof("input") != "prompt":
        raise RequestError.invalid("raw applies to prompt only (messages always use the chat template, "
                                   "prompt_ids are sent as is)")
    if req.speculate > MAX_DRAFT:
        raise RequestError.invalid(f"speculate must be at most {MAX_DRAFT} drafted tokens per step, got {req.speculate}")
    if req.drafter not in opb.Drafter.values():
        raise RequestError.invalid(f"drafter must be one of {', '.join(opb.Drafter.keys())}, got {req.drafter}")
    check_client_request_id(req.client_request_id)


def check_client_request_id(value: str) -> None:
    """"" (no id) or 1..MAX_CLIENT_REQUEST_ID visible ASCII characters; RequestError naming the field otherwise."""
    if len(value) > MAX_CLIENT_REQUEST_ID:
        raise RequestError.invalid(f"client_request_id is {len(value)} characters; at most {MAX_CLIENT_REQUEST_ID}")
    bad = next((i for i, c in enumerate(value) if c not in _ID_CHARS), None)
    if bad is not None:
        raise RequestError.invalid(f"client_request_id[{bad}] is {value[bad]!r}: only visible ASCII (0x21-0x7E) is "
                                   "allowed")


def check_max_tokens(req: opb.SubmitRunRequest, context: int) -> None:
    if req.max_tokens > context:
        raise RequestError.invalid(f"max_tokens {req.max_tokens} is more than the context holds ({context} tokens, "
                                   "prompt included)")
