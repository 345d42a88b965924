"""SIGTERM and SIGHUP for the local pool's foreground programs (`python -m swactor.localcluster`, `swactor demo`).

A program started in the background of a script, by a test harness, CI or a service manager often
inherits SIGINT *ignored*; re-raising SIGINT from a SIGTERM handler then does nothing and the whole
pool keeps running. So SIGTERM raises `Terminated` (a KeyboardInterrupt: every Ctrl-C path tears the
pool down the same way) in the main thread directly, whatever SIGINT's disposition.

SIGHUP (the terminal closed, the ssh session dropped) asks the same: without a handler Python dies at once and the
pool is left to the reaper (reaper.py); with one it goes down in order, and the program exits 128 + 1. A SIGHUP
inherited ignored (`nohup`) stays ignored: that caller asked for the program to outlive its terminal.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: tear down as for Ctrl-C, exit `exit_status` (128 + the signal)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


def terminate_on_signals() -> Callable[[], None]:
    """Install the SIGTERM and SIGHUP handlers (main thread only); returns what puts the previous ones back."""
    old = {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_terminated)}
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        old[signal.SIGHUP] = signal.signal(signal.SIGHUP, _raise_terminated)

    def restore() -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return restore


def hold_until_signalled() -> NoReturn:
    """Block the main thread until a signal's handler raises (Ctrl-C, `Terminated`).

    The kernel gives a signal sent to the process to any thread that does not block it, often one of gRPC's. Python's
    C handler then only marks it pending; a main thread asleep in a lock or a sleep is not woken to run the Python
    handler, and the signal is in effect lost (seen: SIGTERM left a loaded pool running for good). Whichever thread
    takes the signal writes to the wakeup fd, so a main thread reading it always wakes and runs the handler.
    """
    r, w = os.pipe()
    os.set_blocking(w, False)  # a handler must never block writing to it
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        while True:
            os.read(r, 512)  # a signal arrived; its handler runs as this returns, and raises if it stops us
    finally:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
