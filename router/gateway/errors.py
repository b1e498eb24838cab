"""Where errors become HTTP answers, and where every answer gets its ``x-request-id``.

The one mapping from the error model (router/core/errors.py) to the wire: a RouterError, a
Starlette HTTPException (unknown path, wrong method) and anything unforeseen all leave as an
OpenAI error body with the class's status, ``Retry-After`` for 429/503, and the request id.

Why an ASGI middleware and not Starlette's BaseHTTPMiddleware: the latter runs the app in a
task of its own and copies the body through a stream, too dear on the hot path. This one only
wraps ``send`` to add one header, and catches what no exception handler did (it sits inside
Starlette's ServerErrorMiddleware, which would answer plain text without the id).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.core.errors import (
    Forbidden,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RouterError,
    Unauthorized,
)
from router.core.logs import bind_request_id, unbind_request_id
from router.request.request_id import assign_request_id

log = logging.getLogger(__name__)

_BY_STATUS: dict[int, type[RouterError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed, 413: PayloadTooLarge,
}


def error_response(error: RouterError, default_retry_after_s: int, status: int | None = None) -> JSONResponse:
    """The HTTP answer for ``error``; ``status`` overrides the class's only for foreign errors."""
    headers = dict(error.headers)
    if error.says_retry_after:
        seconds = error.retry_after_s if error.retry_after_s is not None else default_retry_after_s
        headers["Retry-After"] = str(max(1, round(seconds)))
    return JSONResponse(error.body(), status_code=status or error.status, headers=headers)


def install_error_handlers(app: FastAPI, default_retry_after_s: int) -> None:
    """RouterError and HTTPException handlers, and the request-id middleware around them."""

    async def router_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RouterError)
        return error_response(exc, default_retry_after_s)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = _BY_STATUS.get(exc.status_code, InvalidRequest if exc.status_code < 500 else InternalError)
        error = kind(f"{request.method} {request.url.path}: {exc.detail}", headers=exc.headers)
        return error_response(error, default_retry_after_s, status=exc.status_code)

    app.add_exception_handler(RouterError, router_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_middleware(RequestIdMiddleware)


class RequestIdMiddleware:
    """Gives each HTTP request its id (a valid incoming ``x-request-id``, else a new one), puts
    it on the response, whatever the response, and turns an unhandled exception into a 500 body.

    This is the only place that sets ``x-request-id`` on an answer: responses leave it out.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = (b"x-request-id", assign_request_id(scope).encode())
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        token = bind_request_id(header[1].decode())
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s: unhandled error", header[1].decode())
            if started:  # the answer is on its way: all that is left is to cut it short
                raise
            error = InternalError("internal error; the router logged it under this request id")
            await error_response(error, 0)(scope, receive, send_with_id)
        finally:
            unbind_request_id(token)
