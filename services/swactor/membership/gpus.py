"""GPU inventory for the gossiped metadata (from "KIND:NAME:MEMORY_BYTES" flags, or nvidia-smi), the device a worker
computes on when its config names none, and the device memory probes a worker advertises its stage memory by
(nvidia-smi's free memory, the host's MemAvailable)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from swactor.v1 import membership_pb2 as pb


def parse_gpu(text: str) -> pb.GpuDevice:
    kind, sep, rest = text.partition(":")
    name, sep2, memory = rest.rpartition(":")
    if not (sep and sep2 and kind and name):
        raise ValueError(f"GPU must be KIND:NAME:MEMORY_BYTES, got {text!r}")
    try:
        memory_bytes = int(memory)
    except ValueError:
        raise ValueError(f"GPU memory must be an integer byte count in {text!r}") from None
    if memory_bytes < 0:
        raise ValueError(f"GPU memory must not be negative in {text!r}")
    return pb.GpuDevice(kind=kind, name=name, memory_bytes=memory_bytes)


def _nvidia_smi(fields: str, timeout_s: float) -> list[list[str]]:
    """nvidia-smi's rows for the query `fields`, one list of values per GPU; [] without it or when it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        done = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    rows = [[v.strip() for v in line.rsplit(",", fields.count(","))] for line in done.stdout.splitlines()]
    return [r for r in rows if len(r) == fields.count(",") + 1]  # a malformed line is skipped


def detect_nvidia(timeout_s: float = 5.0) -> list[pb.GpuDevice]:
    """NVIDIA GPUs as nvidia-smi lists them; [] when there is no nvidia-smi or it fails."""
    out = []
    for name, mib in _nvidia_smi("name,memory.total", timeout_s):
        try:
            out.append(pb.GpuDevice(kind="CUDA", name=name, memory_bytes=int(mib) * 2**20))
        except ValueError:
            continue
    return out


def nvidia_memory(index: int, timeout_s: float = 5.0) -> tuple[int, int] | None:
    """(total, free) bytes of NVIDIA GPU `index` as nvidia-smi reports them; None without nvidia-smi or that GPU."""
    for row in _nvidia_smi("index,memory.total,memory.free", timeout_s):
        try:
            if int(row[0]) == index:
                return int(row[1]) * 2**20, int(row[2]) * 2**20
        except ValueError:
            continue
    return None


def host_memory_available(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The kernel's MemAvailable in bytes (what can be allocated without swapping); 0 when it cannot be read."""
    try:
        text = meminfo.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * 1024
    return 0


def compute_device(configured: str, detect: Callable[[], list[pb.GpuDevice]] = detect_nvidia) -> str:
    """The tinygrad device a worker's compute process uses: `configured` when set, else CUDA when nvidia-smi lists a
    GPU, else the CPU. Named rather than left to tinygrad's default, which tries its NV backend (its own driver
    interface) before CUDA, and NV does not know Hopper-class GPUs (H100/H200), which CUDA (driver API + NVRTC) runs."""
    if configured:
        return configured
    return "CUDA" if detect() else "CPU"
