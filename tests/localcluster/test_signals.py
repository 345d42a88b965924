"""A foreground pool holds until SIGTERM even when the kernel hands the signal to another thread (one of gRPC's, as
under load in CI): `hold_until_signalled` must wake the main thread to run the handler."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from swactor.localcluster.signals import EXIT_TERMINATED

# SIGINT starts ignored, as in a background job. The signals go, in order, to a side thread with pthread_kill: the
# case the kernel may pick for a signal sent to the process.
PROGRAM = textwrap.dedent("""
    import signal, sys, threading, time
    from swactor.localcluster.signals import Terminated, hold_until_signalled, terminate_on_signals
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    terminate_on_signals()
    started = threading.Event()
    def side():
        started.set()
        threading.Event().wait()
    t = threading.Thread(target=side, daemon=True)
    t.start()
    started.wait()
    def send():
        for name in sys.argv[1:]:
            time.sleep(0.2)
            signal.pthread_kill(t.ident, getattr(signal, name))
    threading.Thread(target=send, daemon=True).start()
    try:
        hold_until_signalled()
    except Terminated as e:
        sys.exit(e.exit_status)
""")


@pytest.mark.parametrize(("sent", "status"), [(["SIGTERM"], EXIT_TERMINATED), (["SIGHUP"], 128 + signal.SIGHUP),
                                              (["SIGINT", "SIGTERM"], EXIT_TERMINATED)])
def test_a_signal_taken_by_another_thread_ends_the_hold(sent: list[str], status: int) -> None:
    """An ignored SIGINT stays ignored (the hold goes on past it); SIGTERM and SIGHUP end it with 128 + the signal."""
    proc = subprocess.run([sys.executable, "-c", PROGRAM, *sent], capture_output=True, text=True, timeout=30)
    assert proc.returncode == status, proc.stderr
