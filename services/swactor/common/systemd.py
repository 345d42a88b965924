"""sd_notify glue: readiness, a human-readable STATUS= line and watchdog pings; a no-op outside
systemd."""

from __future__ import annotations

import asyncio
import faulthandler
import os

import sdnotify

_notifier: sdnotify.SystemdNotifier | None = None
_watchdog: asyncio.Task[None] | None = None


def _send(message: str) -> None:
    global _notifier
    if not os.environ.get("NOTIFY_SOCKET"):
        return
    if _notifier is None:
        _notifier = sdnotify.SystemdNotifier()
        # A full notify socket must never stall a service's event loop: a dropped STATUS= is
        # harmless, the next one replaces it (sdnotify swallows the resulting BlockingIOError).
        if _notifier.socket is not None:
            _notifier.socket.setblocking(False)
    _notifier.notify(message)


def notify_ready(status: str) -> None:
    _send(f"READY=1\nSTATUS={status}")


def notify_status(status: str) -> None:
    _send(f"STATUS={status}")


def notify_stopping(status: str) -> None:
    _send(f"STOPPING=1\nSTATUS={status}")


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half the unit's WatchdogSec=, as sd_watchdog_enabled(3)
    advises), or None when systemd armed no watchdog for this very process. WATCHDOG_PID names the
    main process: a child that inherited the environment (the worker's compute process, clang)
    is not the one systemd watches."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not os.environ.get("NOTIFY_SOCKET") or not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


def start_watchdog() -> asyncio.Task[None] | None:
    """Ping systemd's watchdog from a task on the running event loop, so the pings stop exactly
    when the loop stops turning (a blocking call, a deadlock, SIGSTOP): systemd then sends
    SIGABRT and Restart=on-failure brings the service back. faulthandler prints every thread's
    Python stack to the journal on that SIGABRT, naming where the loop hung. Idempotent; None
    (and nothing started) outside systemd or without WatchdogSec=."""
    global _watchdog
    interval = watchdog_interval()
    if interval is None:
        return None
    if _watchdog is None or _watchdog.done():
        faulthandler.enable(all_threads=True)
        _watchdog = asyncio.get_running_loop().create_task(_ping(interval), name="systemd-watchdog")
    return _watchdog


async def _ping(interval: float) -> None:
    while True:
        _send("WATCHDOG=1")
        await asyncio.sleep(interval)
