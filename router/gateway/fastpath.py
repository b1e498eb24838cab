"""A bare ASGI front for the two inference routes, ahead of Starlette's machinery.

Why: with zero-work engines, a third of the router's CPU per request went to the layers
between uvicorn and the handler (ServerErrorMiddleware, the exception-handler wrapper, the
request-id middleware, the router's path matching), each wrapping ``send`` once more, so
every chunk of every answer crossed four Python frames. Here ``POST /v1/completions`` and
``POST /v1/chat/completions`` go straight to their handler with the same contract as the
slow path: the request id on the answer, a RouterError as its OpenAI body, anything else
as a logged 500. Every other request, and these too whenever a middleware beyond the
request-id one is installed (API keys, limits: they must never be bypassed), takes
Starlette's ordinary route.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from router.core.errors import InternalError, RouterError
from router.core.logs import bind_request_id, unbind_request_id
from router.gateway.cycle import WHOLE_KEY
from router.gateway.errors import RequestIdMiddleware, error_response
from router.request.request_id import assign_request_id
from router.upstream.relay import WholeAnswer

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
# Responses whose __call__ only sends their status, raw_headers and body (then a background
# task, when there is one): the server's one-write path can send them instead.
_WHOLE: frozenset[type[Response]] = frozenset({Response, JSONResponse, WholeAnswer})


class RouterApp(FastAPI):
    """FastAPI with a direct path for ``fast_routes`` (POST path -> handler)."""

    fast_routes: Mapping[str, Handler] = {}
    retry_after_s: int = 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.fast_routes.get(scope["path"])
            if handler is not None and self._only_request_id_middleware():
                scope["app"] = self
                await self._serve(handler, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    _fast_ok: bool | None = None  # _only_request_id_middleware, once the middleware stack is built

    def _only_request_id_middleware(self) -> bool:
        known = self._fast_ok
        if known is not None:
            return known
        only = all(m.cls is RequestIdMiddleware for m in self.user_middleware)  # type: ignore[comparison-overlap]
        if self.middleware_stack is not None:  # built: Starlette refuses add_middleware from now on
            self._fast_ok = only
        return only

    async def _serve(self, handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = assign_request_id(scope)
        header = (b"x-request-id", request_id.encode())
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if not started and message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        token = bind_request_id(request_id)  # every log line of this request carries its id
        try:
            try:
                response = await handler(Request(scope, receive))
                whole = scope.get(WHOLE_KEY)
                if whole is not None and type(response) in _WHOLE and response.background is None:
                    started = True  # one write: status, headers and body (router/gateway/cycle.py)
                    await whole(response.status_code, [*response.raw_headers, header], response.body)
                else:
                    await response(scope, receive, send_with_id)
            except RouterError as refused:
                if started:
                    raise
                await error_response(refused, self.retry_after_s)(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s: unhandled error", request_id)
            if started:  # the answer is on its way: all that is left is to cut it short
                raise
            failed = InternalError("internal error; the router logged it under this request id")
            await error_response(failed, 0)(scope, receive, send_with_id)
        finally:
            unbind_request_id(token)
