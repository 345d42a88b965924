"""The one error type of the arena core: a status code plus the offending field's name.

The gRPC servicer maps `code` to a grpc.StatusCode in one place; the table is unchanged whenever
one of these is raised (every check happens before the first mutation).
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"


class ArenaError(Exception):
    def __init__(self, code: Code, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.code = code
        self.field = field
        self.message = message


def invalid(field: str, message: str) -> ArenaError:
    return ArenaError(Code.INVALID_ARGUMENT, field, message)


def not_found(field: str, message: str) -> ArenaError:
    return ArenaError(Code.NOT_FOUND, field, message)


def precondition(field: str, message: str) -> ArenaError:
    return ArenaError(Code.FAILED_PRECONDITION, field, message)
