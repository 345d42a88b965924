"""MembershipClientPort against a real membership process: the node's state survives a restart of
the membership service (which keeps what local services told it in memory only)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swactor.v1 import common_pb2
from swactor.v1 import membership_pb2 as pb
from swactor.worker.membership import MembershipClientPort
from tests.membership.test_service_loopback import Proc

pytestmark = pytest.mark.timeout(60)


def self_state(proc: Proc) -> tuple[int, str, str, int]:
    md = proc.get_self().self.metadata
    return md.state, md.state_reason, md.control_endpoint, md.worker_generation


async def until(cond, what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("faulted", [False, True], ids=["available", "faulted"])
def test_state_is_said_again_after_the_membership_service_restarts(tmp_path: Path, faulted: bool) -> None:
    proc = Proc(tmp_path, "m")

    async def main() -> None:
        nonlocal proc
        async with MembershipClientPort(proc.socket) as port:
            keeper = asyncio.create_task(port.keep_published(retry_s=0.1))
            await port.set_available("10.0.0.9:7441", 3)
            if faulted:
                await port.set_faulted(common_pb2.RUN_FAULT_WORKER_CRASHED, 3)
            want = ((pb.NODE_STATE_FAULTED, "RUN_FAULT_WORKER_CRASHED", "10.0.0.9:7441", 3) if faulted
                    else (pb.NODE_STATE_AVAILABLE, "", "10.0.0.9:7441", 3))
            assert self_state(proc) == want
            proc.close()
            proc = Proc(tmp_path, "m")  # a fresh process: it starts Booting, no control endpoint
            await until(lambda: self_state(proc) == want, f"the state {want} said again")
            keeper.cancel()

    try:
        asyncio.run(main())
    finally:
        proc.close()
