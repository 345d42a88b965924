"""A test-only role for the compute process: doubles float32 rows (factory kind, see worker.roles)."""

from __future__ import annotations

from typing import Any

from tinygrad import dtypes
from tinygrad.device import Buffer

from swactor.worker.process.device import DeviceAllocation, DeviceBridge


class DoublingRole:
    key: tuple[Any, ...] = ()

    def __init__(self, bridge: DeviceBridge) -> None:
        self.bridge = bridge
        self.resets = 0
        self.seen_start_pos: list[int] = []

    def step(self, inputs: list[DeviceAllocation], runtime: dict[str, Any]) -> list[DeviceAllocation]:
        (x,) = inputs
        self.seen_start_pos.append(int(runtime.get("start_pos", 0)))
        if runtime.get("fail"):
            raise RuntimeError("role asked to fail")
        if runtime.get("oom"):  # what the device itself raises for an allocation it cannot make
            Buffer(self.bridge.device, 1 << 62, dtypes.uint8).allocate()
        t = self.bridge.wrap(x, dtypes.float32, (x.extent // 4,))
        return [self.bridge.from_tensor(t * 2)]

    def reset(self, config: dict[str, Any]) -> None:
        self.resets += 1


def make_doubling(config: dict[str, Any], bridge: DeviceBridge, progress: Any) -> DoublingRole:
    for i in range(int(config.get("layers", 2))):
        progress(i + 1, int(config.get("layers", 2)))
    return DoublingRole(bridge)
