"""What the system tests share across their modules."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def compiled_graphs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled stage graphs the first system test's hosts made (test_install_host.keep_graphs), which the next
    test's hosts start with (seed_graphs): a stage's cold compile is ~100 s of the two cores, and one test of it is
    enough. Empty when that test has not run in this process."""
    return tmp_path_factory.mktemp("compiled-graphs")
