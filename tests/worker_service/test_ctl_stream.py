"""GpuWorkerCtl reading a compute process's stdout (framing.py) from a stand-in process: a cut frame is a crash."""

from __future__ import annotations

import asyncio
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

import swactor_ring as sr
from swactor.worker.ctl import GpuWorkerCtl
from swactor.worker.ctl_fsm import CtlCore, WorkerCrashed
from swactor.worker.process import wire

from .harness import Arena

pytestmark = pytest.mark.timeout(60)

# Answers InitializeWorker as a worker would, then writes the first 8 bytes of a binary frame and exits.
STAND_IN = f"""#!{sys.executable}
import json, os, sys
init = json.loads(sys.stdin.readline())
ready = {{"type": "WorkerReady", "pid": os.getpid(), "worker_generation": init["worker_generation"],
          "ring_helper_abi": init["required_ring_helper_abi"], "backend": init["backend"]}}
sys.stdout.buffer.write(json.dumps(ready).encode() + b"\\n" + bytes((0x82, 24, 0, 0, 0)) + b"abc")
sys.stdout.flush()
"""


def test_a_frame_cut_short_at_the_end_of_stdout_is_a_crash(tmp_path: Path) -> None:
    stand_in = tmp_path / "worker"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    arena = Arena(1 << 20)

    async def body() -> list[Any]:
        ctl = GpuWorkerCtl(CtlCore(arena.size, sr.RING_VERSION, {"device": "CPU"}, init_timeout_s=30), arena.fd,
                           python=str(stand_in))
        seen: list[Any] = []
        ctl.subscribe(seen.append)
        ctl.start()
        try:
            async def crashed() -> None:
                while not any(isinstance(e, WorkerCrashed) for e in seen):
                    await asyncio.sleep(0.02)

            await asyncio.wait_for(crashed(), 30)
        finally:
            await ctl.close()
        return seen

    try:
        seen = asyncio.run(body())
    finally:
        arena.close()
    assert isinstance(seen[0], wire.WorkerReady) and seen[0].pid > 0
    (crash,) = [e for e in seen if isinstance(e, WorkerCrashed)]
    assert crash.detail == "malformed worker event: stdout ended inside a frame", crash
