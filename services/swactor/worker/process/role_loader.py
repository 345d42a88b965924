"""A cold ConfigureRole load on its own thread, so the compute process keeps serving its command loop.

Loading a GGUF range takes seconds (minutes for a big model). While it runs the §31 loop still reads
stdin (UninstallRing, ShutdownWorker, CancelRole) and pumps rings. The thread only calls the load;
everything it has to say (layer progress, the role or the failure, `messages.LoadEvent`) goes
through a queue and a self-pipe that wakes the loop, so the core sees it on the loop's thread only.

Abandoning a load (`cancel`) sets a flag the progress callback checks once the GGUF is parsed,
after every layer and after every graph call while the role compiles: the load raises `roles.LoadCancelled` there and unwinds, dropping what it had
read (the parse itself and the final upload to the device have no such point). Whether a cancelled
load's outcome is waited for is the core's decision: CancelRole waits, so no weights outlive the
cancelled role; ShutdownWorker does not, the process exits and takes the thread with it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any

from swactor.common.events import get_logger
from swactor.worker.process import failures
from swactor.worker.process.messages import LoadDone, LoadEvent, LoadFailed, LoadProgress
from swactor.worker.process.roles import LoadCancelled


class Wakeup:
    """A self-pipe the loop selects on: a loader thread writes a byte after queueing an event."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)

    def fileno(self) -> int:
        return self.r

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError):  # the pipe is full: the loop has wakeups pending already
            os.write(self.w, b"\0")

    def ack(self) -> None:
        try:
            while os.read(self.r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


THREAD_PREFIX = "role-load-"


def loads_running() -> bool:
    """A load thread is still alive (one a ShutdownWorker abandoned): exiting must not wait for it."""
    return any(t.name.startswith(THREAD_PREFIX) and t.is_alive() for t in threading.enumerate())


class RoleLoader:
    """One cold load for `role_id`; `events()` returns what its thread has reported since."""

    def __init__(self, role_id: int, load: Callable[[Callable[..., None]], Any],
                 events: queue.SimpleQueue[LoadEvent], wakeup: Wakeup) -> None:
        self.role_id = role_id
        self._load = load
        self._events = events
        self._wakeup = wakeup
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{THREAD_PREFIX}{role_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def join(self) -> None:
        """After its last event (LoadDone / LoadFailed): returns at once."""
        self._thread.join()

    def _post(self, ev: LoadEvent) -> None:
        self._events.put(ev)
        self._wakeup.set()

    def _progress(self, done: int, total: int, phase: str = "weights") -> None:
        if self._cancel.is_set():
            what = "layers" if phase == "weights" else "graph calls"
            raise LoadCancelled(f"load of role {self.role_id} cancelled at {done}/{total} {what}")
        self._post(LoadProgress(self.role_id, done, total, phase))

    def _run(self) -> None:
        try:
            outcome: LoadEvent = LoadDone(self.role_id, self._load(self._progress))
        except Exception as e:
            c = failures.classify(failures.LOAD_FAILURES, e)
            if not c.known:
                get_logger(component="worker").error("role_load_failed", role_id=self.role_id, detail=c.detail,
                                                     tb=traceback.format_exc())
            outcome = LoadFailed(self.role_id, c.reason, c.detail)
        self._post(outcome)


class Loaders:
    """The load threads of this process and the one queue + wakeup pipe they report through."""

    def __init__(self) -> None:
        self.wakeup = Wakeup()
        self._events: queue.SimpleQueue[LoadEvent] = queue.SimpleQueue()
        self._running: dict[int, RoleLoader] = {}

    def start(self, role_id: int, load: Callable[[Callable[..., None]], Any]) -> None:
        loader = RoleLoader(role_id, load, self._events, self.wakeup)
        self._running[role_id] = loader
        loader.start()

    def cancel(self, role_id: int) -> None:
        loader = self._running.get(role_id)
        if loader is not None:
            loader.cancel()

    def events(self) -> list[LoadEvent]:
        """Everything reported since the last call; a load that reported its outcome is joined."""
        self.wakeup.ack()
        out: list[LoadEvent] = []
        while True:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                return out
            if isinstance(ev, LoadDone | LoadFailed):
                loader = self._running.pop(ev.role_id, None)
                if loader is not None:
                    loader.join()
            out.append(ev)
