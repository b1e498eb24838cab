"""OpenAI-style error bodies: ``{"error": {"message", "type", "code"}}`` with the right status."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


class RouterError(Exception):
    """An error the client should see as an OpenAI-style JSON body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, *, type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> RouterError:
    return RouterError(400, message, param=param, code=code)


def no_capacity(message: str, retry_after_s: int) -> RouterError:
    return RouterError(
        503,
        message,
        type="service_unavailable",
        code="no_healthy_instance",
        headers={"Retry-After": str(retry_after_s)},
    )
