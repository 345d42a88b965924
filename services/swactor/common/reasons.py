"""Spec §37 reasons are the common.proto enums, everywhere: a reason is the enum's int value
(`common_pb2.RING_FAULT_HEADER_MALFORMED`), logs and the compute process's JSON wire carry its
value name ("RING_FAULT_HEADER_MALFORMED").

`ReasonError` is the one exception shape that carries such a reason with a detail; `NamedReason` is
its sibling for stable string reasons where common.proto has no enum (model files, distribution).
Two helpers for the edges of the rule: `name` for a log field, and `from_ring_rs` for the one place names arrive in
another spelling: ring-rs reports its RingFaultReason / ObjectFailure in CamelCase
(`HeaderMalformed`), which maps to the proto value of the same meaning.
"""

from __future__ import annotations

import re
from typing import Any

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from swactor.v1 import common_pb2 as pb

# enum -> the prefix of its value names in common.proto
_PREFIX = {
    pb.RingFaultReason: "RING_FAULT_",
    pb.ObjectFailure: "OBJECT_FAILURE_",
}


class ReasonError(Exception):
    """A failure with a reason (a common.proto enum value; each subclass says which enum) and a
    detail naming what went wrong; str() is the detail."""

    def __init__(self, reason: int, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class NamedReason(Exception):
    """A failure with a stable string reason ("NotFound", "Truncated", ...) and a detail; str() is "reason: detail"."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def name(enum: EnumTypeWrapper, value: int) -> str:
    """The value's name for a log field; an unknown number is shown as such rather than raising."""
    try:
        return str(enum.Name(value))
    except ValueError:
        return f"{enum.DESCRIPTOR.name}({value})"


def from_ring_rs(enum: EnumTypeWrapper, camel: Any, default: int) -> int:
    """ring-rs' CamelCase name of a RingFaultReason / ObjectFailure as the proto value; `default`
    when ring-rs gave none or one common.proto does not know."""
    if not isinstance(camel, str) or not camel:
        return default
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", camel).upper()
    try:
        return int(enum.Value(_PREFIX[enum] + snake))
    except ValueError:
        return default


def stream_fault_run_reason(reason: int, *, established: bool) -> int:
    """The RunFaultReason of an edge driver's StreamFault: before DriverEdgeReady the edge never came
    up (§36 edge establishment failure, e.g. the peer never answered the dial); a pump that met a
    broken ring is a ring fault; any other is a stream fault."""
    if not established:
        return pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED
    return pb.RUN_FAULT_RING_FAULT if reason == pb.STREAM_FAULT_RING_FAULT else pb.RUN_FAULT_STREAM_FAULT
