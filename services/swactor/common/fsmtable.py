"""A state machine's transitions as a table, `(state, input) -> next state`, and the one error for a
pair the table does not hold. The arena's lifecycle (§19) and the compute process (§31) are such
tables; each keeps its own enums and its `transition` is a `TransitionTable`."""

from __future__ import annotations

import enum
from typing import Generic, TypeVar

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)


class InvalidTransition(RuntimeError):
    def __init__(self, machine: str, state: enum.Enum, event: enum.Enum) -> None:
        super().__init__(f"{machine} FSM: {event.value} is not allowed in state {state.value}")
        self.state = state
        self.event = event


class TransitionTable(Generic[S, E]):
    def __init__(self, machine: str, table: dict[tuple[S, E], S]) -> None:
        self.machine = machine
        self.table = table

    def __call__(self, state: S, event: E) -> S:
        """The next state, or InvalidTransition when `event` is not allowed in `state`."""
        try:
            return self.table[(state, event)]
        except KeyError:
            raise InvalidTransition(self.machine, state, event) from None
