"""What other swactor services import to use the arena (edge-driver, worker, orchestrator).

    hold = connect_holder()                       # receives the memfd; keep it open while you map it
    arena = hold.map()                            # swactor_ring.Arena over the whole memfd
    async with AsyncArenaClient(hold) as client:
        outcome = await client.lease(request_id=rid, requester="edge-driver", edge_id=e,
                                     direction=common_pb2.RING_DIRECTION_INGRESS, ring_spec=spec)
        match outcome:
            case Leased(layout=layout): ...       # swactor_ring.Producer(arena, outcome.ring_layout())
            case Rejected(reason=r): ...          # RingLeaseRejected: fault the edge
            case Cancelled(): ...                 # CancelLease (StopEdge) won the race
        await client.attach(ring_id, role)        # every process that touches the ring: pump, worker
        await client.detach(ring_id, proof)       # ...and proves it stopped touching it
        await client.release(ring_id)             # the owner, once nobody is attached, or
                                                  # when_detached=True: the last detach frees it

Every call may raise ArenaCallError (code + message naming the field). A holder's leases and attachments outlive a dropped gRPC channel; they end on
explicit release/detach or when the process that holds the hand-out connection exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import grpc

from swactor.common import sockets
from swactor.common.grpcio import LocalClient
from swactor.v1 import arena_pb2, arena_pb2_grpc, common_pb2

if TYPE_CHECKING:
    import swactor_ring

DEFAULT_SOCKET = sockets.ARENA
DEFAULT_FD_SOCKET = sockets.ARENA_FD

# The exit status of a service that retires because its arena-manager is gone (ArenaHold.on_end):
# non-zero, so that the service manager's Restart=on-failure starts it again on the new arena.
EXIT_ARENA_LOST = os.EX_TEMPFAIL

QUIESCED = arena_pb2.RELEASE_PROOF_QUIESCED
NEVER_INSTALLED = arena_pb2.RELEASE_PROOF_NEVER_INSTALLED


class ArenaHandoutError(RuntimeError):
    """The fd hand-out socket refused this process (SO_PEERCRED) or spoke nonsense."""


class ArenaCallError(RuntimeError):
    """A gRPC call to the arena failed; `code` is the status, the message names the bad field."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


# ---- the fd hand-out: one per process ----


@dataclass
class ArenaHold:
    """This process's hand-out connection: the arena memfd and the holder id naming the process.

    Keep it open for as long as the process may touch arena memory; close it (or exit) only after
    detaching/releasing. Both fds are close-on-exec: a child that maps the arena either connects
    on its own or inherits `fd` *and* `connection_fileno()` (see there).
    """

    holder_id: int
    fd: int
    arena_len: int
    page_size: int
    arena_pid: int
    _sock: socket.socket = field(repr=False)
    _arena: swactor_ring.Arena | None = field(default=None, repr=False)
    _end_loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)  # on_end's watcher

    def map(self) -> swactor_ring.Arena:
        """The whole arena mapped once (MAP_SHARED) through ring-rs; cached."""
        if self._arena is None:
            import swactor_ring

            self._arena = swactor_ring.Arena.from_fd(self.fd, self.arena_len)
        return self._arena

    def connection_fileno(self) -> int:
        """The hand-out connection's fd, for a parent that lets a child process map the arena.

        Pass it to the child together with `fd` (subprocess pass_fds): the arena then counts this
        holder as gone only when the connection's last copy is closed *and* this process exited,
        so nothing the holder kept is reclaimed while the child may still touch it.
        """
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._sock.fileno() < 0

    def on_end(self, callback: Callable[[str], None]) -> None:
        """Call `callback(detail)` once, on the running loop, when the arena-manager's end of the
        hand-out connection closes: the arena-manager that owns this memfd is gone (a new one hands
        out a new memfd, with new holder ids). Holders send nothing and the arena-manager sends
        nothing after the hand-out, so any readable state but data is the end."""
        loop = asyncio.get_running_loop()
        fd = self._sock.fileno()

        def readable() -> None:
            try:
                data = self._sock.recv(256, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as e:
                data, why = b"", f"hand-out connection failed: {e}"
            else:
                why = f"arena-manager (pid {self.arena_pid}) closed the hand-out connection"
            if data:
                return  # not part of the protocol; ignore rather than guess
            loop.remove_reader(fd)
            self._end_loop = None
            callback(why)

        loop.add_reader(fd, readable)
        self._end_loop = loop

    def close(self) -> None:
        """End the holder connection and close the memfd (an existing mapping stays valid)."""
        if not self.closed:
            if self._end_loop is not None and not self._end_loop.is_closed():
                self._end_loop.remove_reader(self._sock.fileno())
            self._sock.close()
            os.close(self.fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_holder(fd_socket: Path = DEFAULT_FD_SOCKET, timeout_s: float = 5.0) -> ArenaHold:
    """Connect to the hand-out socket and receive the memfd (SCM_RIGHTS)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(fd_socket))
        data, fds, _, _ = socket.recv_fds(sock, 4096, 1)
    except OSError as e:
        sock.close()
        raise ArenaHandoutError(f"fd hand-out socket {fd_socket}: {e}") from None
    sock.settimeout(None)
    try:
        msg = arena_pb2.ArenaHandout.FromString(data)
    except Exception as e:  # a DecodeError: not our protocol on the other end
        for fd in fds:
            os.close(fd)
        sock.close()
        raise ArenaHandoutError(f"fd hand-out socket {fd_socket}: malformed handout ({e})") from None
    if msg.denied or len(fds) != 1 or msg.holder_id == 0:
        for fd in fds:
            os.close(fd)
        sock.close()
        raise ArenaHandoutError(msg.denied or f"fd hand-out socket {fd_socket}: no memfd in the handout")
    os.set_inheritable(fds[0], False)
    return ArenaHold(msg.holder_id, fds[0], msg.arena_len, msg.page_size, msg.arena_pid, sock)


# ---- lease outcomes ----


@dataclass(frozen=True)
class Queued:
    request_id: int
    position: int
    needed_bytes: int


@dataclass(frozen=True)
class Leased:
    request_id: int
    edge_id: int
    layout: common_pb2.RingLayout

    @property
    def ring_id(self) -> int:
        return self.layout.ring_id

    def ring_layout(self) -> swactor_ring.RingLayout:
        from swactor.common.ringport import native_layout

        return native_layout(self.layout)


@dataclass(frozen=True)
class Rejected:
    request_id: int
    reason: int  # arena_pb2.LeaseRejectReason, e.g. LEASE_REJECT_EXCEEDS_CEILING
    detail: str


@dataclass(frozen=True)
class Cancelled:
    request_id: int
    reason: int  # arena_pb2.LeaseCancelReason


LeaseOutcome = Leased | Rejected | Cancelled
LeaseUpdate = Queued | Leased | Rejected | Cancelled


def lease_update(msg: arena_pb2.LeaseRingUpdate) -> LeaseUpdate:
    match msg.WhichOneof("update"):
        case "queued":
            q = msg.queued
            return Queued(q.request_id, q.position, q.needed_bytes)
        case "leased":
            return Leased(msg.leased.request_id, msg.leased.edge_id, msg.leased.layout)
        case "rejected":
            r = msg.rejected
            return Rejected(r.request_id, r.reason, r.detail)
        case "cancelled":
            c = msg.cancelled
            return Cancelled(c.request_id, c.reason)
    raise ArenaCallError(grpc.StatusCode.INTERNAL, f"LeaseRing sent an empty update: {msg}")


def lease_request(
    hold: ArenaHold,
    request_id: int,
    requester: str,
    edge_id: int,
    direction: common_pb2.RingDirection.ValueType,
    ring_spec: common_pb2.RingSpec,
    prefault: bool,
) -> arena_pb2.LeaseRingRequest:
    return arena_pb2.LeaseRingRequest(
        request_id=request_id,
        requester=requester,
        edge_id=edge_id,
        direction=direction,
        ring_spec=ring_spec,
        holder_id=hold.holder_id,
        prefault=prefault,
    )


def call_error(e: grpc.RpcError) -> ArenaCallError:
    # Both grpc.Call (sync) and grpc.aio.AioRpcError carry code() and details().
    if isinstance(e, grpc.Call | grpc.aio.AioRpcError):
        return ArenaCallError(e.code(), e.details() or "")
    return ArenaCallError(grpc.StatusCode.UNKNOWN, str(e))


# ---- asyncio client ----


class AsyncArenaClient(LocalClient):
    def __init__(self, hold: ArenaHold, socket_path: Path = DEFAULT_SOCKET) -> None:
        super().__init__(socket_path)
        self.hold = hold
        self._stub = arena_pb2_grpc.ArenaManagerStub(self._channel)

    async def lease_updates(
        self,
        *,
        request_id: int,
        requester: str,
        edge_id: int,
        direction: common_pb2.RingDirection.ValueType,
        ring_spec: common_pb2.RingSpec,
        prefault: bool = False,
    ) -> AsyncIterator[LeaseUpdate]:
        """Queued (at most once), then exactly one Leased | Rejected | Cancelled."""
        msg = lease_request(self.hold, request_id, requester, edge_id, direction, ring_spec, prefault)
        call = self._stub.LeaseRing(msg)
        answered = False
        try:
            async for update in call:
                u = lease_update(update)
                answered = not isinstance(u, Queued)
                yield u
        except grpc.RpcError as e:
            raise call_error(e) from None
        finally:
            if not answered:
                call.cancel()  # a caller that stops listening withdraws its still-queued request

    async def lease(self, *, queue_timeout_s: float | None = None, **request: Any) -> LeaseOutcome:
        """Wait for the lease `request` (the keywords of `lease_updates`). After `queue_timeout_s` queued,
        CancelLease is sent and the outcome is Cancelled, unless the grant won the race (then Leased:
        release it if unwanted)."""
        request_id = request["request_id"]
        updates = self.lease_updates(**request)
        canceller: asyncio.Task[None] | None = None

        async def cancel_later(delay: float) -> None:
            await asyncio.sleep(delay)
            await self._cancel_quietly(request_id)

        try:
            async for u in updates:
                if isinstance(u, Queued):
                    if queue_timeout_s is not None:
                        canceller = asyncio.create_task(cancel_later(queue_timeout_s))
                    continue
                return u
        finally:
            if canceller is not None and not canceller.done():
                canceller.cancel()
            await updates.aclose()
        raise ArenaCallError(grpc.StatusCode.INTERNAL, f"LeaseRing {request_id} ended without an outcome")

    async def _cancel_quietly(self, request_id: int) -> None:
        with contextlib.suppress(ArenaCallError):  # already answered: the stream has the outcome
            await self.cancel(request_id)

    async def cancel(self, request_id: int) -> None:
        """CancelLease: a waiting `lease()` then returns Cancelled."""
        await self._unary(
            self._stub.CancelLease,
            arena_pb2.CancelLeaseRequest(request_id=request_id, holder_id=self.hold.holder_id),
        )

    async def release(self, ring_id: int, proof: int = QUIESCED, *, when_detached: bool = False) -> int:
        """ReleaseRing (owner only). Returns the bytes given back to the free list now. With holders
        still attached: ArenaCallError FAILED_PRECONDITION, or, with `when_detached`, 0 and the
        range goes back when the last holder detaches (or exits)."""
        msg = arena_pb2.ReleaseRingRequest(
            ring_id=ring_id, holder_id=self.hold.holder_id, proof=proof, when_detached=when_detached
        )
        resp: arena_pb2.ReleaseRingResponse = await self._unary(self._stub.ReleaseRing, msg)
        return resp.reclaimed_bytes

    async def attach(self, ring_id: int, role: int) -> common_pb2.RingLayout:
        msg = arena_pb2.AttachRingRequest(ring_id=ring_id, holder_id=self.hold.holder_id, role=role)
        resp: arena_pb2.AttachRingResponse = await self._unary(self._stub.AttachRing, msg)
        return resp.layout

    async def detach(self, ring_id: int, proof: int) -> bool:
        """True when this was the last hold and the range went back to the free list."""
        msg = arena_pb2.DetachRingRequest(ring_id=ring_id, holder_id=self.hold.holder_id, proof=proof)
        resp: arena_pb2.DetachRingResponse = await self._unary(self._stub.DetachRing, msg)
        return resp.reclaimed

    async def stats(self) -> arena_pb2.ArenaStats:
        return await self._unary(self._stub.Stats, arena_pb2.ArenaStatsRequest())

    async def _unary(self, method, msg):  # type: ignore[no-untyped-def]
        try:
            return await method(msg)
        except grpc.RpcError as e:
            raise call_error(e) from None

