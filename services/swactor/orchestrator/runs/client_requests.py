"""Client request ids: a SubmitRun sent again with the same `client_request_id` gets the run the first one
created instead of a second run. A client whose SubmitRun timed out or lost its connection cannot tell whether
the orchestrator took it; with an id it can simply send it again.

`decide` is the pure core: from what the run store recorded for the id and what a submit still in progress
holds, it says whether this submit repeats a run, conflicts with one, waits for the one in progress, or goes on
to create the run. `RequestIds` is its shell: the ids of submits in progress live in memory (from the check to
the run's record, which spans the tokenizer's await), the recorded ones in the run store (store.py), where they
are written with their run's first record and deleted with the run.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.api.validation import check_client_request_id
from swactor.v1 import orchestrator_pb2 as opb


@dataclass(frozen=True)
class RequestKey:
    request_id: str
    digest: bytes  # SHA-256 of the request without its id: what "the same request" means


def request_key(req: opb.SubmitRunRequest) -> RequestKey | None:
    """The request's key; None when it has no id. RequestError when the id is malformed."""
    check_client_request_id(req.client_request_id)
    if not req.client_request_id:
        return None
    bare = opb.SubmitRunRequest()
    bare.CopyFrom(req)
    bare.ClearField("client_request_id")
    # Digested as parsed and re-serialized deterministically: a retry that encodes the same values differently
    # (field order, a zero sent explicitly) is still the same request.
    return RequestKey(req.client_request_id, hashlib.sha256(bare.SerializeToString(deterministic=True)).digest())


@dataclass(frozen=True)
class Repeat:
    run_id: int


@dataclass(frozen=True)
class Conflict:
    message: str


@dataclass(frozen=True)
class Wait:
    """A submit with the same key is being admitted: its outcome decides (a repeat of its run, or, if it
    was refused, this submit goes on in its place)."""


@dataclass(frozen=True)
class Admit:
    """No run has this id yet: this submit creates it."""


Decision = Repeat | Conflict | Wait | Admit


def decide(key: RequestKey, recorded: tuple[int, bytes] | None, pending: bytes | None) -> Decision:
    """`recorded`: (run_id, digest) the store holds for the id; `pending`: the digest of a submit with the id
    still in progress."""
    if recorded is not None:
        run_id, digest = recorded
        if digest == key.digest:
            return Repeat(run_id)
        return Conflict(f"client_request_id {key.request_id!r} was used for run {run_id} with a different request; "
                        "a new request needs a new id")
    if pending is not None:
        if pending == key.digest:
            return Wait()
        return Conflict(f"client_request_id {key.request_id!r} is in use by a SubmitRun still being admitted with a "
                        "different request; a new request needs a new id")
    return Admit()


class RequestIds:
    """Claims on client request ids for SubmitRun: `claim` before admitting, `release` once the run is
    recorded or the submit refused. `recorded` looks an id up in the run store."""

    def __init__(self, recorded: Callable[[str], tuple[int, bytes] | None]) -> None:
        self._recorded = recorded
        self._pending: dict[str, tuple[bytes, asyncio.Event]] = {}

    async def claim(self, key: RequestKey) -> int | None:
        """The run an earlier submit with this key created; None when this submit is to create it (and must
        `release` the key whatever happens)."""
        while True:
            pending = self._pending.get(key.request_id)
            match decide(key, self._recorded(key.request_id), pending[0] if pending else None):
                case Repeat(run_id):
                    return run_id
                case Conflict(message):
                    # ALREADY_EXISTS, not INVALID_ARGUMENT: the request is valid on its own, what is taken is its
                    # key. An operator reads INVALID_ARGUMENT as "fix a field's value"; this says "that id already
                    # names a run" (a conflict, HTTP 409 through a gateway), which a client must not retry as is.
                    raise RequestError(grpc.StatusCode.ALREADY_EXISTS, message)
                case Wait():
                    assert pending is not None
                    await pending[1].wait()  # then look again: the store has its run, or it was refused
                case Admit():
                    self._pending[key.request_id] = (key.digest, asyncio.Event())
                    return None

    def release(self, key: RequestKey) -> None:
        entry = self._pending.pop(key.request_id, None)
        if entry is not None:
            entry[1].set()
