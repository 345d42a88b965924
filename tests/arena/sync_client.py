"""The arena-manager API, blocking: `swactor.arena.client.AsyncArenaClient` for tests and benchmarks
that drive the arena from plain threads (the services use the asyncio client)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import grpc

from swactor.arena.client import (
    DEFAULT_SOCKET,
    QUIESCED,
    ArenaCallError,
    ArenaHold,
    LeaseOutcome,
    LeaseUpdate,
    Queued,
    call_error,
    lease_request,
    lease_update,
)
from swactor.v1 import arena_pb2, arena_pb2_grpc, common_pb2


class ArenaClient:
    def __init__(self, hold: ArenaHold, socket_path: Path = DEFAULT_SOCKET) -> None:
        self.hold = hold
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")
        self._stub = arena_pb2_grpc.ArenaManagerStub(self._channel)

    def lease_updates(
        self,
        *,
        request_id: int,
        requester: str,
        edge_id: int,
        direction: common_pb2.RingDirection.ValueType,
        ring_spec: common_pb2.RingSpec,
        prefault: bool = False,
    ) -> Iterator[LeaseUpdate]:
        msg = lease_request(self.hold, request_id, requester, edge_id, direction, ring_spec, prefault)
        stream = self._stub.LeaseRing(msg)
        answered = False
        try:
            for update in stream:
                u = lease_update(update)
                answered = not isinstance(u, Queued)
                yield u
        except grpc.RpcError as e:
            raise call_error(e) from None
        finally:
            if not answered:
                stream.cancel()  # a caller that stops listening withdraws its still-queued request

    def lease(
        self,
        *,
        request_id: int,
        requester: str,
        edge_id: int,
        direction: common_pb2.RingDirection.ValueType,
        ring_spec: common_pb2.RingSpec,
        prefault: bool = False,
        queue_timeout_s: float | None = None,
    ) -> LeaseOutcome:
        """Blocking `AsyncArenaClient.lease`, same timeout semantics."""
        timer: threading.Timer | None = None
        try:
            for u in self.lease_updates(
                request_id=request_id,
                requester=requester,
                edge_id=edge_id,
                direction=direction,
                ring_spec=ring_spec,
                prefault=prefault,
            ):
                if isinstance(u, Queued):
                    if queue_timeout_s is not None:
                        timer = threading.Timer(queue_timeout_s, self._cancel_quietly, (request_id,))
                        timer.daemon = True
                        timer.start()
                    continue
                return u
        finally:
            if timer is not None:
                timer.cancel()
        raise ArenaCallError(grpc.StatusCode.INTERNAL, f"LeaseRing {request_id} ended without an outcome")

    def _cancel_quietly(self, request_id: int) -> None:
        with contextlib.suppress(ArenaCallError):  # already answered: the stream has the outcome
            self.cancel(request_id)

    def cancel(self, request_id: int) -> None:
        self._unary(
            self._stub.CancelLease,
            arena_pb2.CancelLeaseRequest(request_id=request_id, holder_id=self.hold.holder_id),
        )

    def release(self, ring_id: int, proof: int = QUIESCED, *, when_detached: bool = False) -> int:
        msg = arena_pb2.ReleaseRingRequest(
            ring_id=ring_id, holder_id=self.hold.holder_id, proof=proof, when_detached=when_detached
        )
        resp: arena_pb2.ReleaseRingResponse = self._unary(self._stub.ReleaseRing, msg)
        return resp.reclaimed_bytes

    def attach(self, ring_id: int, role: int) -> common_pb2.RingLayout:
        msg = arena_pb2.AttachRingRequest(ring_id=ring_id, holder_id=self.hold.holder_id, role=role)
        resp: arena_pb2.AttachRingResponse = self._unary(self._stub.AttachRing, msg)
        return resp.layout

    def detach(self, ring_id: int, proof: int) -> bool:
        msg = arena_pb2.DetachRingRequest(ring_id=ring_id, holder_id=self.hold.holder_id, proof=proof)
        resp: arena_pb2.DetachRingResponse = self._unary(self._stub.DetachRing, msg)
        return resp.reclaimed

    def stats(self) -> arena_pb2.ArenaStats:
        return self._unary(self._stub.Stats, arena_pb2.ArenaStatsRequest())

    def shutdown(self) -> arena_pb2.ArenaShutdownResponse:
        return self._unary(self._stub.Shutdown, arena_pb2.ArenaShutdownRequest())

    def _unary(self, method, msg):  # type: ignore[no-untyped-def]
        try:
            return method(msg)
        except grpc.RpcError as e:
            raise call_error(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
