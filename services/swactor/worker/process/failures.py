"""Which §37 reason an exception out of role code becomes: decided by its type, in the tables below.

The shell catches what a step (`Role.step`) or a load (`roles.load`, `Role.reset`) raises and asks
`classify`; the first row whose type matches names the reason. An exception no row names takes the
table's fallback reason and comes back `known=False`, so the shell logs its traceback: it is either
a bug or a failure worth a row of its own.

What tinygrad raises for out-of-memory (0.14): device allocations go through `Allocator.alloc`,
which re-raises a backend's `RuntimeError` or `MemoryError` as `MemoryError` (CUDA's `cuMemAlloc`
error, NV's `rm_alloc` NO_MEMORY, AMD's ENOMEM); the CPU backend's `mmap` failure is not caught
there and arrives as `OSError` with errno ENOMEM. numpy's allocation failure is a `MemoryError`.
Other CUDA driver errors (a kernel launch, a module load) are plain `RuntimeError`s whose only
distinction is their message: they stay TinygradError, like `CompileError`.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from tinygrad.device import CompileError

from swactor.common.reasons import ReasonError
from swactor.edgeend.objects import SinkFailed
from swactor.v1 import common_pb2 as pb
from swactor.worker.process.roles import LoadCancelled, RoleError

Reason = int | Callable[[Any], int]  # a fixed reason, or one read off the exception


@dataclass(frozen=True)
class Table:
    enum: EnumTypeWrapper  # what the reasons are values of
    rows: tuple[tuple[type[BaseException], Reason], ...]
    fallback: int


@dataclass(frozen=True)
class Classified:
    reason: int
    detail: str
    known: bool  # False: no row matched, the fallback reason was used


# SinkFailed out of a step: the device bridge could not allocate or copy a role output.
_SINK_STEP = {pb.OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED: pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY,
              pb.OBJECT_FAILURE_DEVICE_COPY_FAILED: pb.STEP_FAILURE_OUTPUT_COPY_FAILED}

STEP_FAILURES = Table(
    enum=pb.StepFailure,
    rows=(
        (SinkFailed, lambda e: _SINK_STEP.get(e.reason, pb.STEP_FAILURE_OUTPUT_COPY_FAILED)),
        (MemoryError, pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY),
        (OSError, lambda e: pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY if e.errno == errno.ENOMEM
         else pb.STEP_FAILURE_TINYGRAD_ERROR),
        (CompileError, pb.STEP_FAILURE_TINYGRAD_ERROR),
    ),
    fallback=pb.STEP_FAILURE_TINYGRAD_ERROR,
)

LOAD_FAILURES = Table(
    enum=pb.RoleFailure,
    rows=(
        (LoadCancelled, pb.ROLE_FAILURE_LOAD_CANCELLED),
        (RoleError, lambda e: e.reason),
        (MemoryError, pb.ROLE_FAILURE_DEVICE_OUT_OF_MEMORY),
        (OSError, lambda e: pb.ROLE_FAILURE_DEVICE_OUT_OF_MEMORY if e.errno == errno.ENOMEM
         else pb.ROLE_FAILURE_WEIGHTS_LOAD_FAILED),
    ),
    fallback=pb.ROLE_FAILURE_WEIGHTS_LOAD_FAILED,  # role code is not ours to trust: name the failure, never kill the worker
)


def classify(table: Table, exc: BaseException) -> Classified:
    # Our own reason-carrying exceptions say what happened in `detail`; any other by type and message.
    detail = exc.detail if isinstance(exc, ReasonError) else f"{type(exc).__name__}: {exc}"
    for kind, reason in table.rows:
        if isinstance(exc, kind):
            return Classified(reason(exc) if callable(reason) else reason, detail, True)
    return Classified(table.fallback, detail, False)
