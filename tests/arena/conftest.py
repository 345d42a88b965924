"""A real swactor-arena process per test: tmp sockets, tmp state dir, small sparse ceiling."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MIB = 1 << 20


@dataclass
class ArenaProc:
    proc: subprocess.Popen[bytes]
    dir: Path
    socket: Path
    fd_socket: Path
    state_dir: Path
    ceiling: int
    events: list[dict] = field(default_factory=list)
    _buf: bytes = b""

    def read_events(self, timeout_s: float = 0.0) -> list[dict]:
        """Drain the service's JSON event lines that are available within `timeout_s`."""
        assert self.proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            if not sel.select(left):
                break
            chunk = os.read(self.proc.stderr.fileno(), 65536)
            if not chunk:
                break
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                try:
                    self.events.append(json.loads(line))
                except json.JSONDecodeError:
                    self.events.append({"event": "_raw", "text": line.decode(errors="replace")})
            if time.monotonic() >= deadline:
                break
        sel.close()
        return self.events

    def wait_event(self, name: str, timeout_s: float = 10.0, **match: object) -> dict:
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            events = self.read_events(0.05)
            for ev in events[seen:]:
                if ev.get("event") == name and all(ev.get(k) == v for k, v in match.items()):
                    return ev
            seen = len(events)
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"no {name} {match} event; got {[e.get('event') for e in events]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.read_events(0.1)
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
