"""The gRPC servicer of swactor.v1.ArenaManager: protobuf in, one ArenaNode call, protobuf out.

ArenaError becomes a gRPC status in exactly one place (`_call`), with the field name first in the
message; nothing else is caught here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import grpc

from swactor.arena import convert
from swactor.arena.errors import ArenaError
from swactor.arena.model import (
    LeaseCancelled,
    LeaseQueued,
    LeaseRejected,
    RingLeased,
    RingReclaimed,
    RingReleased,
)
from swactor.arena.node import ArenaNode, Terminal
from swactor.v1 import arena_pb2, arena_pb2_grpc

SERVICE_NAME = arena_pb2.DESCRIPTOR.services_by_name["ArenaManager"].full_name

T = TypeVar("T")


async def _call(context: grpc.aio.ServicerContext, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ArenaError as e:
        await context.abort(grpc.StatusCode[e.code.value], f"{e.field}: {e.message}")
        raise AssertionError("unreachable: abort raises") from e


class ArenaServicer(arena_pb2_grpc.ArenaManagerServicer):
    def __init__(self, node: ArenaNode) -> None:
        self.node = node

    async def LeaseRing(
        self, request: arena_pb2.LeaseRingRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[arena_pb2.LeaseRingUpdate]:
        req = convert.ring_request(request)
        events = await _call(context, lambda: self.node.lease(req))
        first = next(
            e
            for e in events
            if isinstance(e, LeaseQueued | RingLeased | LeaseRejected | LeaseCancelled) and e.request is req
        )
        if not isinstance(first, LeaseQueued):
            yield convert.lease_update(first)
            return
        # Registered before the first await, so no grant can slip past unseen.
        waiter = self.node.watch(req.request_id)
        answer: Terminal | None = None
        delivered = False
        try:
            yield convert.lease_update(first)
            answer = await waiter.get()
            # Counted as delivered once handed to gRPC: a grant the caller may have seen is never
            # undone behind its back (an unseen one is still reclaimed when its holder exits).
            delivered = True
            yield convert.lease_update(answer)
        finally:
            self.node.unwatch(req.request_id)
            if not delivered:
                self.node.abandon(req, answer if answer is not None else _pending(waiter))

    async def CancelLease(
        self, request: arena_pb2.CancelLeaseRequest, context: grpc.aio.ServicerContext
    ) -> arena_pb2.CancelLeaseResponse:
        await _call(context, lambda: self.node.cancel(request.request_id, request.holder_id))
        return arena_pb2.CancelLeaseResponse(request_id=request.request_id)

    async def ReleaseRing(
        self, request: arena_pb2.ReleaseRingRequest, context: grpc.aio.ServicerContext
    ) -> arena_pb2.ReleaseRingResponse:
        r = request
        events = await _call(
            context, lambda: self.node.release(r.ring_id, r.holder_id, r.proof, r.when_detached)
        )
        deferred = any(isinstance(e, RingReleased) and e.deferred for e in events)
        reclaimed = sum(
            e.range.length for e in events if isinstance(e, RingReclaimed) and e.ring_id == r.ring_id
        )
        return arena_pb2.ReleaseRingResponse(ring_id=r.ring_id, reclaimed_bytes=reclaimed, deferred=deferred)

    async def AttachRing(
        self, request: arena_pb2.AttachRingRequest, context: grpc.aio.ServicerContext
    ) -> arena_pb2.AttachRingResponse:
        lease = await _call(
            context, lambda: self.node.attach(request.ring_id, request.holder_id, request.role)
        )
        return arena_pb2.AttachRingResponse(
            layout=lease.layout.to_pb(),
            edge_id=lease.request.edge_id,
            direction=lease.request.direction,
        )

    async def DetachRing(
        self, request: arena_pb2.DetachRingRequest, context: grpc.aio.ServicerContext
    ) -> arena_pb2.DetachRingResponse:
        reclaimed = await _call(
            context, lambda: self.node.detach(request.ring_id, request.holder_id, request.proof)
        )
        return arena_pb2.DetachRingResponse(ring_id=request.ring_id, reclaimed=reclaimed)

    async def Stats(
        self, request: arena_pb2.ArenaStatsRequest, context: grpc.aio.ServicerContext
    ) -> arena_pb2.ArenaStats:
        return convert.stats_to_pb(self.node.stats(), self.node.now())

    async def Shutdown(
        self, request: arena_pb2.ArenaShutdownRequest, context: grpc.aio.ServicerContext
    ) -> arena_pb2.ArenaShutdownResponse:
        self.node.shutdown("Shutdown RPC")
        return arena_pb2.ArenaShutdownResponse(state=convert.STATE_TO_PB[self.node.stats().state.value])


def _pending(waiter: asyncio.Queue[Terminal]) -> Terminal | None:
    """An answer put in the waiter but not yet taken (the stream died in between)."""
    return None if waiter.empty() else waiter.get_nowait()


def add_to_server(server: grpc.aio.Server, node: ArenaNode) -> None:
    arena_pb2_grpc.add_ArenaManagerServicer_to_server(ArenaServicer(node), server)
