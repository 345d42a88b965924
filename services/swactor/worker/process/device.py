"""Device bridge of spec §33 over tinygrad buffers (CPU here, CUDA/NV on GPU hosts).

Objects live in device memory as flat uint8 buffers of exactly `extent` bytes; ring spans are
copied in and out by byte range, so an object may be larger than its ring. Copies are synchronous:
when `host_to_device` / `device_to_host` return, the host bytes may be released or published.
`wrap` gives role code a typed tinygrad Tensor over the same allocation, without a copy.

A `DeviceAllocation` is what the compute process's tables hold: the ingress parser writes into it
(`objects.ObjectBuffer`), roles take and return it, the egress producer reads out of it
(`objects.ObjectSource`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.device import Buffer
from tinygrad.dtype import DType
from tinygrad.helpers import GlobalCounters
from tinygrad.uop.ops import UOp

from swactor.edgeend.objects import HeaderFacts, SinkFailed
from swactor.v1 import common_pb2 as pb

DTYPES: dict[tuple[str, int], DType] = {
    ("Float", 4): dtypes.float32,
    ("Float", 2): dtypes.float16,
    ("Bfloat", 2): dtypes.bfloat16,
    ("Int", 4): dtypes.int32,
    ("Int", 8): dtypes.int64,
    ("Uint", 4): dtypes.uint32,
    ("Uint", 1): dtypes.uint8,
}


def tinygrad_dtype(family: str, width: int) -> DType:
    try:
        return DTYPES[(family, width)]
    except KeyError:
        raise ValueError(f"dtype {family}{width * 8} is not supported by the device bridge") from None


def _writable_alias(src: memoryview) -> memoryview:
    """A writable-typed view of read-only bytes (consumer ring spans are read-only exports).

    tinygrad's copy-in takes the buffer through ctypes `from_buffer`, which insists on writable
    memory although it only reads. SAFETY: the alias is used only as the *source* of the copy and
    only while `src` (which pins the ring span) is alive in the caller; nothing writes through it.
    """
    arr = np.frombuffer(src, dtype=np.uint8)
    alias = (ctypes.c_char * len(src)).from_address(arr.ctypes.data)
    return memoryview(alias).cast("B")


@dataclass(eq=False)
class DeviceAllocation:
    """One device object: a flat byte buffer of `extent` bytes on `bridge`'s device."""

    buffer: Buffer
    extent: int
    bridge: DeviceBridge

    def write(self, offset: int, data: memoryview) -> None:
        """`objects.ObjectBuffer`: an ingress prefix lands at `offset`."""
        self.bridge.host_to_device(data, self, offset)

    def read_into(self, offset: int, dest: memoryview) -> None:
        """`objects.ObjectSource`: an egress prefix leaves from `offset`."""
        self.bridge.device_to_host(self, offset, dest)


def limit_device_memory(device: str, limit: int) -> None:
    """Cap what this process allocates on `device` (tinygrad's count of live buffers) at `limit` bytes
    ([worker].device_memory_limit_bytes: a GPU shared with other tenants). Past it the device allocator fails
    as the device itself does when full, so tinygrad raises the same MemoryError a real out-of-memory gives
    (failures.py), from the same place: weights, KV cache and activations alike."""
    allocator = Device[device].allocator
    inner = allocator._alloc

    def _alloc(size: int, options: Any) -> Any:
        used = GlobalCounters.mem_used_per_device[device]
        if used + size > limit:
            raise MemoryError(f"{size} bytes more than the {limit}-byte device memory limit allows ({used} in use)")
        return inner(size, options)

    allocator._alloc = _alloc  # type: ignore[method-assign]


def nvrtc_wheel_library() -> Path | None:
    """libnvrtc from the PyPI wheel nvidia-cuda-nvrtc-cu12 (the `cuda` extra) when it is installed, else None."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except ModuleNotFoundError:  # no nvidia.* wheel at all
        return None
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        lib = Path(root) / "lib" / "libnvrtc.so.12"
        if lib.exists():
            return lib
    return None


def find_nvrtc(device: str) -> None:
    """tinygrad's CUDA device compiles every kernel with NVRTC, which it looks for by name or at $NVRTC_PATH; a rented
    GPU host's driver-only image has none, so the wheel's copy is named unless the operator named one."""
    if device.split(":")[0] == "CUDA" and "NVRTC_PATH" not in os.environ and (lib := nvrtc_wheel_library()) is not None:
        os.environ["NVRTC_PATH"] = str(lib)


class DeviceBridge:
    """alloc / free / host_to_device / device_to_host / wrap of §33 for one tinygrad device."""

    def __init__(self, device: str | None = None, memory_limit: int = 0) -> None:
        self.device = Device.canonicalize(device) if device else Device.DEFAULT
        find_nvrtc(self.device)
        Device[self.device]  # opens the backend now: a bad device fails at init
        if memory_limit:
            limit_device_memory(self.device, memory_limit)
        self._synchronous_host = self.device.split(":")[0] in ("CPU", "CLANG", "LLVM", "PYTHON")

    def alloc(self, extent: int) -> DeviceAllocation:
        try:
            return DeviceAllocation(Buffer(self.device, extent, dtypes.uint8).allocate(), extent, self)
        except (MemoryError, RuntimeError, OSError) as e:  # OSError: the CPU backend's mmap (failures.py)
            raise SinkFailed(pb.OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED, f"{extent} bytes on {self.device}: {e}") from None

    def free(self, alloc: DeviceAllocation) -> None:
        if alloc.buffer.is_allocated():
            alloc.buffer.deallocate()

    def _range(self, alloc: DeviceAllocation, offset: int, length: int) -> Buffer:
        if offset < 0 or offset + length > alloc.extent:
            raise SinkFailed(pb.OBJECT_FAILURE_DEVICE_COPY_FAILED, f"range {offset}+{length} outside object of {alloc.extent} bytes")
        return alloc.buffer.view(length, dtypes.uint8, offset).ensure_allocated()

    def host_to_device(self, src: memoryview, alloc: DeviceAllocation, offset: int) -> None:
        view = self._range(alloc, offset, len(src))
        if src.readonly:
            src = _writable_alias(src)
        try:
            view.allocator._copyin(view._buf, src)
            if not self._synchronous_host:
                Device[self.device].synchronize()  # the host bytes are released right after
        except Exception as e:
            raise SinkFailed(pb.OBJECT_FAILURE_DEVICE_COPY_FAILED, f"host->device {len(src)} bytes: {e}") from None

    def device_to_host(self, alloc: DeviceAllocation, offset: int, dest: memoryview) -> None:
        view = self._range(alloc, offset, len(dest))
        try:
            Device[self.device].synchronize()
            view.allocator._copyout(dest, view._buf)
        except Exception as e:
            raise SinkFailed(pb.OBJECT_FAILURE_DEVICE_COPY_FAILED, f"device->host {len(dest)} bytes: {e}") from None

    def wrap(self, alloc: DeviceAllocation, dtype: DType, shape: tuple[int, ...]) -> Tensor:
        """A typed tensor view of the allocation (no copy)."""
        return Tensor(UOp.from_buffer(alloc.buffer), device=self.device).bitcast(dtype).reshape(shape)

    def to_numpy(self, alloc: DeviceAllocation, dtype: np.dtype[Any]) -> np.ndarray:
        """The object's bytes as a host array (for role code that takes numpy)."""
        out = np.empty(alloc.extent // np.dtype(dtype).itemsize, dtype=dtype)
        self.device_to_host(alloc, 0, memoryview(out).cast("B"))
        return out

    def from_numpy(self, a: np.ndarray) -> DeviceAllocation:
        a = np.ascontiguousarray(a)
        out = self.alloc(a.nbytes)
        self.host_to_device(memoryview(a).cast("B"), out, 0)
        return out

    def from_tensor(self, t: Tensor) -> DeviceAllocation:
        """Realize role output into its own device allocation (flat bytes)."""
        t = t.to(self.device).contiguous().realize()
        buf = t.uop.buffer
        out = self.alloc(buf.nbytes)
        out.buffer.copy_from(buf.view(buf.nbytes, dtypes.uint8, 0).ensure_allocated())
        return out


class DeviceSink:
    """`objects.ObjectSink` that lands ingress objects in device memory."""

    def __init__(self, bridge: DeviceBridge) -> None:
        self.bridge = bridge

    def allocate(self, facts: HeaderFacts) -> DeviceAllocation:
        return self.bridge.alloc(facts.extent)

    def discard(self, buffer: DeviceAllocation) -> None:
        self.bridge.free(buffer)
