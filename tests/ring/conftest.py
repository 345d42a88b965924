"""Fixtures for the ring tests: a real sealed memfd arena and the two-process harness."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import swactor_ring as sr

_spec = importlib.util.spec_from_file_location("ringproc", Path(__file__).with_name("ringproc.py"))
assert _spec and _spec.loader
ringproc_module = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("ringproc", ringproc_module)
_spec.loader.exec_module(ringproc_module)


@pytest.fixture
def ringproc() -> ModuleType:
    return ringproc_module


@pytest.fixture
def arena_fd() -> Iterator[tuple[int, int]]:
    """(memfd, size) of a fresh 4 MiB arena; closed after the test."""
    size = 4 << 20
    fd = sr.Arena.create_memfd("swactor-ring-test", size)
    try:
        yield fd, size
    finally:
        os.close(fd)


@pytest.fixture
def arena(arena_fd: tuple[int, int]) -> sr.Arena:
    fd, size = arena_fd
    return sr.Arena.from_fd(fd, size)
