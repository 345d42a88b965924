"""A real swactor-arena process per test: tmp sockets, tmp state dir, small sparse ceiling."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MIB = 1 << 20


@dataclass
class ArenaProc:
    """A running service; a reader thread keeps its stderr drained (a full pipe would stall it)."""

    proc: subprocess.Popen[bytes]
    dir: Path
    socket: Path
    fd_socket: Path
    state_dir: Path
    ceiling: int
    events: list[dict] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    def start_reader(self) -> None:
        self._reader = threading.Thread(target=self._read, name="arena-stderr", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                ev = {"event": "_raw", "text": line.decode(errors="replace")}
            with self._cond:
                self.events.append(ev)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_event(self, name: str, timeout_s: float = 10.0, **match: object) -> dict:
        """The first event named `name` whose fields equal `match` (already seen or arriving)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for ev in self.events:
                    if ev.get("event") == name and all(ev.get(k) == v for k, v in match.items()):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0 or (self._reader is not None and not self._reader.is_alive()):
                    names = [e.get("event") for e in self.events]
                    raise AssertionError(f"no {name} {match} event; got {names}")
                self._cond.wait(left)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        return self.proc.returncode


def start_arena(
    base: Path, ceiling: int = 64 * MIB, extra: list[str] | None = None, env: dict[str, str] | None = None
) -> ArenaProc:
    cfg = base / "swactor.toml"
    if not cfg.exists():
        cfg.write_text("")
    state = base / "state"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swactor.arena.main",
            "--config",
            str(cfg),
            "--socket",
            str(base / "arena.sock"),
            "--fd-socket",
            str(base / "arena-fd.sock"),
            "--state-dir",
            str(state),
            "--ceiling-bytes",
            str(ceiling),
            *(extra or []),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    arena = ArenaProc(proc, base, base / "arena.sock", base / "arena-fd.sock", state, ceiling)
    arena.start_reader()
    arena.wait_event("arena_ready", timeout_s=30)
    return arena


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short path: Unix socket paths must fit in 108 bytes."""
    d = Path(tempfile.mkdtemp(prefix="sa-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def arena(short_dir: Path) -> Iterator[ArenaProc]:
    a = start_arena(short_dir)
    yield a
    a.stop()
