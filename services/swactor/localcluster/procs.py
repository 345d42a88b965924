"""Service processes of the local cluster: started in their own session (so a service's children,
e.g. the worker's compute process, go with it), logged to a file, stopped SIGTERM-then-SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Service:
    """One running service: `name` like "h1/worker", its log and its process group."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(self, prefix: Sequence[str] = ()) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        env.pop("NOTIFY_SOCKET", None)  # not ours to notify
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([*prefix, *self.argv], stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def describe_exit(self) -> str:
        return f"{self.name} exited with status {self.exited()}; last lines of {self.log}:\n{tail(self.log)}"

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float) -> bool:
        """SIGTERM, wait, then SIGKILL the whole group. True when it stopped on SIGTERM alone."""
        self.signal(signal.SIGTERM)
        return self.finish(timeout_s)

    def finish(self, timeout_s: float) -> bool:
        """The rest of `stop` once SIGTERM was sent: wait, then SIGKILL the whole group."""
        if self.proc is None:
            return True
        clean = True
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            clean = False
        self.kill_group()
        return clean

    def kill_group(self) -> None:
        """SIGKILL whatever is left in the process group (the service's children) and reap."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        deadline = time.monotonic() + 5.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(1.0)
