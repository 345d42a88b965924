"""The pump FSMs of spec §25: one state enum and one transition table per direction, and the one
transition function (`Pump._set_state`) every state change of a pump goes through.

    recv  WaitingForSpecAndStream -> Streaming <-> Backpressured;  Streaming -> Closed
    send  WaitingForConnection -> WaitingForBytes -> OpenStream -> Streaming <-> Backpressured;
          Streaming (or WaitingForBytes: nothing was ever committed) -> Closed
    both  any live state -> Faulted | Stopped;  Closed | Faulted -> Stopped

Closed is entered only from Streaming: a recv pump closes its ring once every byte of the stream
is in it, a send pump sends FIN once every committed byte is in QUIC. Stopped is §25's "edge
teardown" (StopEdge): the pump never touches its ring again and the driver releases it.

Every transition is logged as `edge.pump_state {edge_id, ring_id, role, old, new}` (plus `reason`,
`detail` into Faulted). Streaming <-> Backpressured flaps with the ring and the network and is
logged at debug level; the rest at info.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from swactor.common.events import get_logger
from swactor.edge.objtap import ObjectTap
from swactor.edge.streamport import StreamPort
from swactor.v1 import common_pb2

log = get_logger(component="COMPONENT_EDGE_DRIVER")


class RecvState(enum.Enum):
    WAITING_FOR_SPEC_AND_STREAM = "WaitingForSpecAndStream"
    STREAMING = "Streaming"
    BACKPRESSURED = "Backpressured"  # the ingress ring has no free space: wait for RingWritable
    CLOSED = "Closed"
    FAULTED = "Faulted"
    STOPPED = "Stopped"


class SendState(enum.Enum):
    WAITING_FOR_CONNECTION = "WaitingForConnection"
    WAITING_FOR_BYTES = "WaitingForBytes"  # connected, no stream yet: nothing committed so far
    OPEN_STREAM = "OpenStream"
    STREAMING = "Streaming"
    BACKPRESSURED = "Backpressured"  # send_queue_limit bytes sit in QUIC: wait for ACK progress
    CLOSED = "Closed"
    FAULTED = "Faulted"
    STOPPED = "Stopped"


def _from_streaming(E: Any) -> dict[Any, frozenset[Any]]:
    """The rows both directions share, from Streaming on (they name the same states in each enum)."""
    return {
        E.STREAMING: frozenset({E.BACKPRESSURED, E.CLOSED, E.FAULTED, E.STOPPED}),
        E.BACKPRESSURED: frozenset({E.STREAMING, E.FAULTED, E.STOPPED}),
        E.CLOSED: frozenset({E.STOPPED}),
        E.FAULTED: frozenset({E.STOPPED}),
        E.STOPPED: frozenset(),
    }


@dataclass(frozen=True)
class PumpFsm:
    """One direction's §25 FSM: its role name in logs, start state, transition table, end states."""

    role: str  # "SEND" | "RECV"
    initial: Any
    transitions: dict[Any, frozenset[Any]]
    terminal: frozenset[Any]
    backpressured: Any


R, S = RecvState, SendState
RECV_FSM = PumpFsm(
    role="RECV",
    initial=R.WAITING_FOR_SPEC_AND_STREAM,
    transitions={R.WAITING_FOR_SPEC_AND_STREAM: frozenset({R.STREAMING, R.FAULTED, R.STOPPED}), **_from_streaming(R)},
    terminal=frozenset({R.CLOSED, R.FAULTED, R.STOPPED}),
    backpressured=R.BACKPRESSURED,
)
SEND_FSM = PumpFsm(
    role="SEND",
    initial=S.WAITING_FOR_CONNECTION,
    transitions={
        S.WAITING_FOR_CONNECTION: frozenset({S.WAITING_FOR_BYTES, S.FAULTED, S.STOPPED}),
        S.WAITING_FOR_BYTES: frozenset({S.OPEN_STREAM, S.CLOSED, S.FAULTED, S.STOPPED}),
        S.OPEN_STREAM: frozenset({S.STREAMING, S.FAULTED, S.STOPPED}),
        **_from_streaming(S),
    },
    terminal=frozenset({S.CLOSED, S.FAULTED, S.STOPPED}),
    backpressured=S.BACKPRESSURED,
)
_FLAPS = frozenset({(R.STREAMING, R.BACKPRESSURED), (R.BACKPRESSURED, R.STREAMING),
                    (S.STREAMING, S.BACKPRESSURED), (S.BACKPRESSURED, S.STREAMING)})


class InvalidTransition(RuntimeError):
    def __init__(self, role: str, edge_id: int, old: enum.Enum, new: enum.Enum) -> None:
        super().__init__(f"{role.lower()} pump of edge {edge_id}: {old.value} -> {new.value} is not a §25 transition")
        self.old, self.new = old, new


class Pump:
    """What both pumps share: identity, state, the fault that ended it, `_set_state`, the QUIC
    connection its stream is on (once there is one) and the per-object timing tap."""

    def __init__(self, fsm: PumpFsm, edge_id: int, ring_id: int, tap: ObjectTap | None) -> None:
        self.fsm = fsm
        self.edge_id = edge_id
        self.ring_id = ring_id
        self.tap = tap
        self.conn: StreamPort | None = None
        self.state: Any = fsm.initial  # the FSM's start; every later change goes through _set_state
        self.fault_reason = 0  # StreamFaultReason, set on the way into Faulted
        self.fault_detail = ""
        self.bytes = 0  # payload bytes moved (after the preamble)
        # Bound once: a pump lives as long as its edge, and a bound logger is cheap to call.
        self._log = log.bind(edge_id=edge_id, ring_id=ring_id, role=fsm.role)

    @property
    def done(self) -> bool:
        return self.state in self.fsm.terminal

    @property
    def backpressured(self) -> bool:
        return self.state is self.fsm.backpressured

    def _set_state(self, new: Any, reason: int = 0, detail: str = "") -> None:
        """The one transition function: validate against the direction's table, record, log."""
        old = self.state
        if new is old:
            return
        if new not in self.fsm.transitions[old]:
            raise InvalidTransition(self.fsm.role, self.edge_id, old, new)
        self.state = new
        if reason:
            self.fault_reason, self.fault_detail = reason, detail
            self._log.info("edge.pump_state", old=old.value, new=new.value,
                           reason=common_pb2.StreamFaultReason.Name(reason), detail=detail)  # type: ignore[arg-type]
        elif (old, new) in _FLAPS:
            self._log.debug("edge.pump_state", old=old.value, new=new.value)
        else:
            self._log.info("edge.pump_state", old=old.value, new=new.value)
