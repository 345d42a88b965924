"""Request errors: a gRPC status code and a message naming what was wrong."""

from __future__ import annotations

import grpc


class RequestError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def invalid(cls, message: str) -> RequestError:
        return cls(grpc.StatusCode.INVALID_ARGUMENT, message)

    @classmethod
    def not_found(cls, message: str) -> RequestError:
        return cls(grpc.StatusCode.NOT_FOUND, message)

    @classmethod
    def precondition(cls, message: str) -> RequestError:
        return cls(grpc.StatusCode.FAILED_PRECONDITION, message)
