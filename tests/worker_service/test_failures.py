"""Exceptions out of role code become §37 reasons by their type (failures.py), never by their message."""

from __future__ import annotations

import numpy as np
import pytest
from tinygrad import Device, dtypes
from tinygrad.device import Buffer, CompileError

from swactor.edgeend.objects import SinkFailed
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import failures
from swactor.worker.process.roles import LoadCancelled, RoleError

STEP, LOAD = failures.STEP_FAILURES, failures.LOAD_FAILURES


@pytest.mark.parametrize(("exc", "reason", "known"), [
    (MemoryError("Allocation of 80 GB failed on CUDA"), pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY, True),
    (SinkFailed(pb.OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED, "8 bytes"), pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY, True),
    (SinkFailed(pb.OBJECT_FAILURE_DEVICE_COPY_FAILED, "device->host"), pb.STEP_FAILURE_OUTPUT_COPY_FAILED, True),
    (OSError(12, "Cannot allocate memory"), pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY, True),  # the CPU backend's mmap
    (OSError(5, "Input/output error"), pb.STEP_FAILURE_TINYGRAD_ERROR, True),
    (CompileError("bad kernel"), pb.STEP_FAILURE_TINYGRAD_ERROR, True),
    # By type only: a message that says "out of memory" does not make a RuntimeError an OOM.
    (RuntimeError("CUDA Error 2, out of memory"), pb.STEP_FAILURE_TINYGRAD_ERROR, False),
    (ValueError("runtime.start_pos must be an integer"), pb.STEP_FAILURE_TINYGRAD_ERROR, False),
])
def test_step_failures_by_type(exc: Exception, reason: int, known: bool) -> None:
    c = failures.classify(STEP, exc)
    assert (c.reason, c.known) == (reason, known)
    assert c.detail == getattr(exc, "detail", None) or type(exc).__name__ in c.detail


@pytest.mark.parametrize(("exc", "reason", "known"), [
    (LoadCancelled("at 3/30 layers"), pb.ROLE_FAILURE_LOAD_CANCELLED, True),
    (RoleError(pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND, "/m.gguf does not exist"), pb.ROLE_FAILURE_WEIGHTS_NOT_FOUND, True),
    (MemoryError(), pb.ROLE_FAILURE_DEVICE_OUT_OF_MEMORY, True),
    (OSError(12, "Cannot allocate memory"), pb.ROLE_FAILURE_DEVICE_OUT_OF_MEMORY, True),  # the CPU backend's mmap
    (OSError(5, "EIO"), pb.ROLE_FAILURE_WEIGHTS_LOAD_FAILED, True),
    (KeyError("tok_embeddings"), pb.ROLE_FAILURE_WEIGHTS_LOAD_FAILED, False),
])
def test_load_failures_by_type(exc: Exception, reason: int, known: bool) -> None:
    c = failures.classify(LOAD, exc)
    assert (c.reason, c.known) == (reason, known)


def test_what_tinygrad_raises_for_an_impossible_allocation_is_an_out_of_memory() -> None:
    """The table's premise, on this machine's default device: a failed allocation is a MemoryError."""
    with pytest.raises(Exception) as info:
        Buffer(Device.DEFAULT, 1 << 62, dtypes.uint8).allocate()
    assert failures.classify(STEP, info.value).reason == pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY, repr(info.value)


def test_the_device_bridge_reports_an_impossible_allocation_as_allocation_failed() -> None:
    from swactor.worker.process.device import DeviceBridge

    with pytest.raises(SinkFailed) as info:
        DeviceBridge().alloc(1 << 62)
    assert info.value.reason == pb.OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED
    assert failures.classify(STEP, info.value).reason == pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY


def test_numpy_out_of_memory_is_an_out_of_memory() -> None:
    with pytest.raises(MemoryError) as info:
        np.empty(1 << 62, np.uint8)
    assert failures.classify(STEP, info.value).reason == pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY


def test_a_device_memory_limit_fails_allocations_past_it_as_out_of_memory() -> None:
    """[worker].device_memory_limit_bytes: past the limit tinygrad raises what a full device gives."""
    from tinygrad.helpers import GlobalCounters

    from swactor.worker.process.device import DeviceBridge

    allocator = Device["CPU"].allocator
    try:
        bridge = DeviceBridge("CPU", GlobalCounters.mem_used_per_device["CPU"] + (1 << 20))
        small = bridge.alloc(4096)  # under the limit: served
        with pytest.raises(SinkFailed) as info:
            bridge.alloc(2 << 20)
        assert info.value.reason == pb.OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED
        with pytest.raises(MemoryError) as raw:
            Buffer("CPU", 2 << 20, dtypes.uint8).allocate()
        assert failures.classify(LOAD, raw.value).reason == pb.ROLE_FAILURE_DEVICE_OUT_OF_MEMORY
        assert "device memory limit" in str(raw.value.__cause__)
        bridge.free(small)
    finally:
        del allocator._alloc  # back to the class's allocator for the rest of this process
