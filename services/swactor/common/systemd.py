"""sd_notify glue: readiness and a human-readable STATUS= line; a no-op outside systemd."""

from __future__ import annotations

import os

import sdnotify

_notifier: sdnotify.SystemdNotifier | None = None


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
