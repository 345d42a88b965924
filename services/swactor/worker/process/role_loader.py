"""A cold ConfigureRole load on its own thread, so the compute process keeps serving its command loop.

Loading a GGUF range takes seconds (minutes for a big model). While it runs the §31 loop still reads
stdin (UninstallRing, ShutdownWorker, CancelRole) and pumps rings. The thread only calls
`roles.load`; everything it has to say (layer progress, the role or the failure) goes through a queue
and a self-pipe that wakes the loop, so events are written on the loop's thread only.

Abandoning a load (`cancel`) sets a flag the progress callback checks once the GGUF is parsed and
after every layer: the load raises `LoadCancelled` there and unwinds, dropping what it had read (the
parse itself and the final upload to the device have no such point). A load that finishes after a
cancel is discarded the same way. For CancelRole the loop reports the outcome once the thread has
ended, so no weights outlive the cancelled role; ShutdownWorker does not wait: the process exits and
takes the thread with it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swactor.common.events import get_logger
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import roles


class LoadCancelled(Exception):
    """Raised inside the load (from its progress callback) once the load was cancelled."""


@dataclass(frozen=True)
class LoadProgress:
    done: int
    total: int


@dataclass(frozen=True)
class LoadDone:
    role: Any  # roles.Role


@dataclass(frozen=True)
class LoadFailed:
    reason: int  # RoleFailure
    detail: str


LoadEvent = LoadProgress | LoadDone | LoadFailed


class Wakeup:
    """A self-pipe the loop selects on: the loader thread writes a byte after queueing an event."""

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
    """One cold load of `config` for `role_id`; `events()` returns what the thread has reported since."""

    def __init__(self, role_id: int, config: dict[str, Any], load: Callable[[Callable[[int, int], None]], Any],
                 wakeup: Wakeup) -> None:
        self.role_id = role_id
        self.config = config
        self.key = roles.weights_key(config)
        self._load = load
        self._wakeup = wakeup
        self._queue: queue.SimpleQueue[LoadEvent] = queue.SimpleQueue()
        self._cancel = threading.Event()
        self.cancel_reason: tuple[int, str] | None = None  # (RoleFailure, detail) once cancelled
        self.ended = False  # the thread has reported its outcome (LoadDone / LoadFailed)
        self._thread = threading.Thread(target=self._run, name=f"{THREAD_PREFIX}{role_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self, reason: int, detail: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = (reason, detail)
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _post(self, ev: LoadEvent) -> None:
        self._queue.put(ev)
        self._wakeup.set()

    def _progress(self, done: int, total: int) -> None:
        if self._cancel.is_set():
            raise LoadCancelled(f"load of role {self.role_id} cancelled at {done}/{total} layers")
        self._post(LoadProgress(done, total))

    def _run(self) -> None:
        outcome: LoadEvent
        try:
            outcome = LoadDone(self._load(self._progress))
        except LoadCancelled as e:
            outcome = LoadFailed(pb.ROLE_FAILURE_LOAD_CANCELLED, str(e))
        except roles.RoleError as e:
            outcome = LoadFailed(e.reason, e.detail)
        except MemoryError as e:
            outcome = LoadFailed(pb.ROLE_FAILURE_WEIGHTS_LOAD_FAILED, f"MemoryError: {e}")
        except Exception as e:  # role code is not ours to trust: name the failure, never kill the worker
            get_logger(component="worker").error("role_load_failed", role_id=self.role_id, detail=repr(e),
                                                 tb=traceback.format_exc())
            outcome = LoadFailed(pb.ROLE_FAILURE_WEIGHTS_LOAD_FAILED, f"{type(e).__name__}: {e}")
        self._post(outcome)

    def events(self) -> list[LoadEvent]:
        out: list[LoadEvent] = []
        while True:
            try:
                ev = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(ev, LoadDone | LoadFailed):
                self._thread.join()  # it has posted its last event: joining is immediate
                self.ended = True
            out.append(ev)
        return out
