"""Fixtures of the compute-process tests: a real memfd arena and a worker process spawned on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Arena, WorkerProc


@pytest.fixture
def arena() -> Iterator[Arena]:
    a = Arena()
    yield a
    a.close()


@pytest.fixture
def worker(arena: Arena) -> Iterator[WorkerProc]:
    w = WorkerProc(arena)
    yield w
    w.close()
