"""The compute process's test-only step hook (worker/process/testhooks.py): off unless its environment
variable names a step; then exactly that step raises, classified as role code that raises."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from swactor.v1 import common_pb2 as pb
from swactor.worker.process import messages as m
from swactor.worker.process import testhooks
from swactor.worker.process.core import WorkerCore
from swactor.worker.process.shell import Shell


def test_the_hook_is_off_unless_its_variable_names_a_step() -> None:
    assert testhooks.fail_step({}) is None
    assert testhooks.fail_step({testhooks.FAIL_STEP_ENV: ""}) is None
    assert testhooks.fail_step({testhooks.FAIL_STEP_ENV: "3"}) == 3
    for bad in ("0", "-1", "three", "2.5"):
        with pytest.raises(ValueError, match=testhooks.FAIL_STEP_ENV):
            testhooks.fail_step({testhooks.FAIL_STEP_ENV: bad})


class Echo:
    key = ()

    def step(self, inputs: list, runtime: dict) -> list:
        return list(inputs)


def test_the_named_step_raises_as_role_code_would_and_no_other() -> None:
    shell = Shell(WorkerCore(4096), lambda ev: None, arena_fd=-1, arena_bytes=4096, fail_step=2)
    assert shell._run_step(1, Echo(), ["x"], {}) == m.StepRan(1, ["x"])
    out = shell._run_step(2, Echo(), ["x"], {})
    assert isinstance(out, m.StepRaised) and out.reason == pb.STEP_FAILURE_TINYGRAD_ERROR
    assert testhooks.FAIL_STEP_ENV in out.detail and "InjectedStepFailure" in out.detail
    assert shell._run_step(3, Echo(), ["x"], {}) == m.StepRan(3, ["x"])


def test_a_bad_hook_value_is_a_named_worker_fatal_not_a_traceback() -> None:
    env = {**os.environ, "SWACTOR_ARENA_FD": "0", "SWACTOR_ARENA_BYTES": "4096", testhooks.FAIL_STEP_ENV: "soon"}
    done = subprocess.run([sys.executable, "-m", "swactor.worker.process"], input="", capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    (line,) = done.stdout.splitlines()
    event = json.loads(line)
    assert "BACKEND_INIT_FAILED" in line and testhooks.FAIL_STEP_ENV in line, event
    assert "Traceback" not in done.stderr
