"""What the gateway's tests share: a local pool serving the OpenAI API, and a fake WatchRun call."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.v1 import orchestrator_pb2 as opb

MODEL = "smollm2-135m-instruct"  # the default model's name in a local pool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gateway_pool(**orchestrator: object) -> Iterator[LocalCluster]:
    """A 2-host pool whose runs take a stage on each host (so every answer crosses both), serving the OpenAI API on
    a free port of 127.0.0.1; `orchestrator` adds [orchestrator] keys."""
    spec = ClusterSpec(hosts=2, openai_port=free_port(), orchestrator={"default_stages": 2, **orchestrator})
    with LocalCluster(spec, progress=lambda line: print(line, flush=True)) as c:
        yield c


def token_of(pool: LocalCluster) -> str:
    assert pool.openai_token_file is not None
    return pool.openai_token_file.read_text().strip()


class FakeCall:
    """A WatchRun call's stand-in: `updates`, then (with `hold`) a stream that stays open until it is set."""

    def __init__(self, updates: list[opb.RunUpdate], hold: asyncio.Event | None = None) -> None:
        self.updates, self.hold, self.cancelled = updates, hold, False

    def cancel(self) -> None:
        self.cancelled = True

    async def _gen(self) -> AsyncIterator[opb.RunUpdate]:
        for u in self.updates:
            yield u
        if self.hold is not None:
            await self.hold.wait()

    def __aiter__(self) -> AsyncIterator[opb.RunUpdate]:
        return self._gen()
