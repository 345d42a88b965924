"""The owner's end of the lifeline to its reaper (reaper.py): a pipe whose write end only this process holds.

LocalCluster records here what it creates, before or as it creates it (owned.py); the kernel closes the pipe however
this process ends, and the reaper removes what is recorded unless `close(clean=True)` said it was all removed
already. The write end is close-on-exec, so no service inherits it; the owner must not fork *without* exec while the
pool runs (a forked copy would hold the pipe open, and the reaper would wait for that copy too).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from swactor.common.events import get_logger
from swactor.localcluster.owned import DIR, DONE, GROUP, NETNS, RELEASE, record

log = get_logger(component="localcluster")


class Lifeline:
    def __init__(self) -> None:
        """Start the reaper. stdin is the pipe; stdout stays clear of the owner's (the demo's answer); stderr is the
        owner's, for the reaper's one line when it acts."""
        self._proc = subprocess.Popen([sys.executable, "-m", "swactor.localcluster.reaper", "--owner", str(os.getpid())],
                                      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, bufsize=0,
                                      start_new_session=True)
        self._lost = False

    @property
    def reaper_pid(self) -> int:
        return self._proc.pid

    def _tell(self, line: bytes) -> None:
        pipe = self._proc.stdin
        if pipe is None or pipe.closed:
            return
        try:
            pipe.write(line)
        except BrokenPipeError:
            if not self._lost:  # nothing will clean up after this process if it dies now: say so, once
                self._lost = True
                log.warning("localcluster_reaper_gone", reaper_pid=self._proc.pid, status=self._proc.poll())

    def own_group(self, pgid: int) -> None:
        self._tell(record(GROUP, pgid))

    def release_group(self, pgid: int) -> None:
        """The group was stopped: its number may be reused by an unrelated process, so it must not be signalled."""
        self._tell(record(RELEASE, pgid))

    def own_netns(self, prefix: str) -> None:
        self._tell(record(NETNS, prefix))

    def own_dir(self, path: Path) -> None:
        self._tell(record(DIR, path))

    def close(self, *, clean: bool) -> None:
        """Close the pipe and wait for the reaper: with `clean`, after telling it that nothing is left; without,
        it removes whatever is still recorded (a teardown that failed part way) before it exits."""
        if clean:
            self._tell(record(DONE))
        if self._proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
        try:
            self._proc.wait(10.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
