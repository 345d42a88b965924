"""`python -m swactor.localcluster` started in the background of a script (SIGINT inherited ignored,
as a non-interactive shell's `&`, test harnesses, CI and service managers start it) stops on SIGTERM
and tears the whole pool down (issue 12)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from swactor.localcluster.signals import EXIT_TERMINATED

from .conftest import needs_model, processes_mentioning

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), needs_model]


def _background() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `cmd &` in a script leaves the child


def test_sigterm_stops_a_background_localcluster_and_tears_the_pool_down() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "swactor.localcluster", "--hosts", "1", "--no-openai"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_background)
    root: Path | None = None
    try:
        assert proc.stderr is not None and proc.stdout is not None
        first = proc.stderr.readline()
        m = re.search(r"dir (/\S+)", first)
        assert m, first
        root = Path(m[1])
        ready_line = proc.stdout.readline()  # printed once the pool is ready
        assert "--address unix:" in ready_line, ready_line + proc.stderr.read()
        assert len(processes_mentioning(str(root))) >= 4
        proc.send_signal(signal.SIGINT)  # ignored, as in a background job...
        proc.send_signal(signal.SIGTERM)  # ...but SIGTERM stops it
        assert proc.wait(60) == EXIT_TERMINATED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert root is not None
    assert processes_mentioning(str(root)) == []
    assert not root.exists()
