"""SIGTERM for the local pool's foreground programs (`python -m swactor.localcluster`, `swactor demo`).

A program started in the background of a script, by a test harness, CI or a service manager often
inherits SIGINT *ignored*; re-raising SIGINT from a SIGTERM handler then does nothing and the whole
pool keeps running. So SIGTERM raises `Terminated` (a KeyboardInterrupt: every Ctrl-C path tears the
pool down the same way) in the main thread directly, whatever SIGINT's disposition.
"""

from __future__ import annotations

import signal
from typing import Any

EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: tear down as for Ctrl-C, exit EXIT_TERMINATED."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def terminate_on_sigterm() -> Any:
    """Install the SIGTERM handler (main thread only); returns the previous one."""
    return signal.signal(signal.SIGTERM, _raise_terminated)
