"""Test-only fault hooks of the compute process (tests/faults/, docs/faults.md). Each is off unless the
process's own environment turns it on: the worker service passes its environment down, and nothing a
peer, the orchestrator or a config file sends can set one. Never set these in production.

SWACTOR_TEST_FAIL_STEP=N: the role step whose ExecuteStep.step_id is N (the stage's N-th step of a
run: 1 is the first prompt chunk) raises InjectedStepFailure in every run this process serves, as
role code that raises would: the stage faults RUN_FAULT_STEP_FAILED.
"""

from __future__ import annotations

import os

FAIL_STEP_ENV = "SWACTOR_TEST_FAIL_STEP"


class InjectedStepFailure(RuntimeError):
    """What a step raises when SWACTOR_TEST_FAIL_STEP names it."""


def fail_step(environ: dict[str, str] | None = None) -> int | None:
    """The step id SWACTOR_TEST_FAIL_STEP names (None: off); a value that is no positive integer is an error
    naming it, so a mistyped hook cannot silently test nothing."""
    text = (os.environ if environ is None else environ).get(FAIL_STEP_ENV, "")
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{FAIL_STEP_ENV}={text!r}: must be a positive step id")
    return int(text)


def check_step(armed: int | None, step_id: int) -> None:
    if armed is not None and step_id == armed:
        raise InjectedStepFailure(f"{FAIL_STEP_ENV}: step {step_id} fails (test hook)")
