"""GPU inventory for the gossiped metadata: from "KIND:NAME:MEMORY_BYTES" flags, or nvidia-smi."""

from __future__ import annotations

import shutil
import subprocess

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


def detect_nvidia(timeout_s: float = 5.0) -> list[pb.GpuDevice]:
    """NVIDIA GPUs as nvidia-smi lists them; [] when there is no nvidia-smi or it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        done = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    out = []
    for line in done.stdout.splitlines():
        name, _, mib = line.rpartition(",")
        try:
            out.append(pb.GpuDevice(kind="CUDA", name=name.strip(), memory_bytes=int(mib.strip()) * 2**20))
        except ValueError:
            continue
    return out
