"""The device memory this node offers a stage, advertised to the orchestrator's planner with NodeAvailable.

The configured budget (`[worker].memory_bytes`) when set; else measured on the device the compute process will use:
the free memory of its NVIDIA GPU (nvidia-smi), or on a CPU device a share of the host's MemAvailable (the rest is
left to this host's other services and the page cache), at most `[worker].device_memory_limit_bytes`. 0 = unknown (another device kind, no nvidia-smi): the
planner then places this node as it would without memory facts.
"""

from __future__ import annotations

from collections.abc import Callable

from swactor.membership.gpus import host_memory_available, nvidia_memory

CPU_SHARE = 0.8
HOST_KINDS = frozenset({"CPU", "CLANG", "LLVM"})
NVIDIA_KINDS = frozenset({"CUDA", "NV"})


def advertised_memory(device: str, budget: int, *, limit: int = 0,
                      gpu_memory: Callable[[int], tuple[int, int] | None] = nvidia_memory,
                      host_available: Callable[[], int] = host_memory_available) -> int:
    """Bytes a stage may use on `device` (a tinygrad device name; "" = tinygrad's default: the GPU when there is one);
    `limit`: the compute process's device memory limit (0 = none)."""
    if budget > 0:
        return budget
    measured = _measured(device, gpu_memory, host_available)
    return min(measured, limit) if measured and limit else measured or limit


def _measured(device: str, gpu_memory: Callable[[int], tuple[int, int] | None], host_available: Callable[[], int]) -> int:
    kind, _, index_text = device.upper().partition(":")
    index = int(index_text) if index_text.isdigit() else 0
    if kind == "" or kind in NVIDIA_KINDS:
        gpu = gpu_memory(index)
        if gpu is not None:
            return gpu[1]
        if kind:
            return 0
        kind = "CPU"  # no NVIDIA GPU: tinygrad's default device here is the CPU
    if kind in HOST_KINDS:
        return int(host_available() * CPU_SHARE)
    return 0
