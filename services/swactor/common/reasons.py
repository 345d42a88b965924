"""Spec §37 reason names: CamelCase on the JSON process adapter, proto enum names elsewhere.

The source of truth is common.proto; the CamelCase spellings are derived from it so the two can
never drift. `RingFaultReason.HeaderMalformed` <-> `RING_FAULT_HEADER_MALFORMED`.
"""

from __future__ import annotations

import re
from functools import cache

from swactor.v1 import common_pb2

# enum name -> prefix of its value names in common.proto
_PREFIX = {
    "RingFaultReason": "RING_FAULT_",
    "ObjectFailure": "OBJECT_FAILURE_",
    "StepFailure": "STEP_FAILURE_",
    "WorkerFatalReason": "WORKER_FATAL_",
    "UninstallReason": "UNINSTALL_",
    "WorkerStoppedReason": "WORKER_STOPPED_",
    "RunFaultReason": "RUN_FAULT_",
}


def _camel(upper_snake: str) -> str:
    return "".join(part.capitalize() for part in upper_snake.split("_"))


def _upper_snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).upper()


@cache
def names(enum: str) -> frozenset[str]:
    """The CamelCase reason names of `enum` (UNSPECIFIED excluded)."""
    prefix = _PREFIX[enum]
    desc = common_pb2.DESCRIPTOR.enum_types_by_name[enum]
    return frozenset(_camel(v.name[len(prefix):]) for v in desc.values if v.number != 0)


def proto_name(enum: str, camel: str) -> str:
    """`proto_name("ObjectFailure", "EofMidObject")` -> "OBJECT_FAILURE_EOF_MID_OBJECT"."""
    if camel not in names(enum):
        raise ValueError(f"{camel!r} is not a {enum}; known: {', '.join(sorted(names(enum)))}")
    return _PREFIX[enum] + _upper_snake(camel)


def proto_value(enum: str, camel: str) -> int:
    desc = common_pb2.DESCRIPTOR.enum_types_by_name[enum]
    return desc.values_by_name[proto_name(enum, camel)].number


def check(enum: str, camel: str) -> str:
    """`camel` unchanged if it names a value of `enum`, else ValueError naming the enum."""
    proto_name(enum, camel)
    return camel
