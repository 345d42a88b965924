"""The llama role's step runtime (llama_role.py): a rewind is applied to the run's slot before its rows, every_row is
passed on, and malformed values are step failures naming the field (a fake model behind a real CPU device bridge)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from swactor.worker.process.device import DeviceBridge
from swactor.worker.process.llama_role import LlamaStageRole


class RecordingModel:
    is_first = is_last = True
    hidden_dim, slots = 4, 2

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def rewind(self, slot: int, rows: int) -> None:
        self.calls.append(("rewind", slot, rows))

    def step(self, x: np.ndarray, start_pos: int, **kw: Any) -> np.ndarray:
        self.calls.append(("step", x.tolist(), start_pos, kw))
        return np.arange(len(x), dtype=np.int32) if kw.get("every_row") else np.array([9], np.int32)

    def step_batch(self, batch: list) -> list[np.ndarray]:
        self.calls.append(("step_batch", [(r.slot, r.start_pos) for r in batch]))
        return [np.array([9], np.int32) for _ in batch]


@pytest.fixture
def role() -> tuple[LlamaStageRole, RecordingModel, DeviceBridge]:
    bridge, model = DeviceBridge("CPU"), RecordingModel()
    return LlamaStageRole(model, bridge, ()), model, bridge


def test_rewind_comes_before_the_rows_and_every_row_is_passed_on(role) -> None:
    r, model, bridge = role
    (out,) = r.step([bridge.from_numpy(np.array([5, 6, 7], np.int32))],
                    {"start_pos": 10, "slot": 1, "rewind": 2, "every_row": True})
    assert model.calls == [("rewind", 1, 2), ("step", [5, 6, 7], 10, {"sample": True, "slot": 1, "every_row": True})]
    assert bridge.to_numpy(out, np.dtype(np.int32)).tolist() == [0, 1, 2]
    model.calls.clear()
    r.step([bridge.from_numpy(np.array([5], np.int32)), bridge.from_numpy(np.array([6], np.int32))],
           {"rows": [{"slot": 0, "start_pos": 3, "rewind": 1}, {"slot": 1, "start_pos": 8}]})
    assert model.calls == [("rewind", 0, 1), ("rewind", 1, 0), ("step_batch", [(0, 3), (1, 8)])]


@pytest.mark.parametrize(("runtime", "says"), [
    ({"start_pos": 1, "rewind": -1}, "runtime.rewind must be a non-negative integer, got -1"),
    ({"start_pos": 1, "rewind": True}, "runtime.rewind must be a non-negative integer, got True"),
    ({"start_pos": 1, "every_row": "yes"}, "runtime.every_row must be a boolean, got 'yes'"),
])
def test_malformed_runtime_is_refused_by_name_before_anything_changes(role, runtime: dict, says: str) -> None:
    r, model, bridge = role
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        r.step([bridge.from_numpy(np.array([5], np.int32))], runtime)
    assert model.calls == []
