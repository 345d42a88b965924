"""Errors in the OpenAI API's JSON shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP status a
client library maps to its exception (400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 429
RateLimitError, 503 and 500 InternalServerError)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    # Seconds a client should wait before sending again (429, 503): the Retry-After header.
    retry_after_s: int | None = None

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}

    @classmethod
    def bad_param(cls, param: str, message: str) -> ApiError:
        return cls(400, message, param=param, code="invalid_value")

    @classmethod
    def unsupported(cls, param: str, message: str) -> ApiError:
        return cls(400, message, param=param, code="unsupported_value")


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type="authentication_error", code="invalid_api_key")


def not_found(message: str, param: str | None = None, code: str = "not_found") -> ApiError:
    return ApiError(404, message, param=param, code=code)


def busy(message: str, retry_after_s: int) -> ApiError:
    return ApiError(429, message, type="rate_limit_error", code="queue_full", retry_after_s=retry_after_s)


def unavailable(message: str, code: str = "pool_not_ready", retry_after_s: int = 5) -> ApiError:
    return ApiError(503, message, type="server_error", code=code, retry_after_s=retry_after_s)


def server_error(message: str, code: str) -> ApiError:
    return ApiError(500, message, type="server_error", code=code)
