"""One id per client request: the caller's ``x-request-id`` when it is a sane token, else a new one.

It is assigned once, when the request enters (router/gateway/errors.py's middleware), kept in
the ASGI scope, forwarded to the engines and written on the answer and in the logs, so one id
follows a request through router, prefill and decode.
"""

from __future__ import annotations

import os

from starlette.types import Scope

from router.core.logs import REQUEST_ID_PATTERN

SCOPE_KEY = "pd_router.request_id"  # an ASGI scope extension key: the id of this request


def assign_request_id(scope: Scope) -> str:
    """The request's id, chosen now if nobody has yet, and remembered in ``scope``."""
    known: str | None = scope.get(SCOPE_KEY)
    if known is not None:
        return known
    chosen = ""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            incoming = value.decode("latin-1")
            if REQUEST_ID_PATTERN.match(incoming):
                chosen = incoming
            break
    scope[SCOPE_KEY] = chosen = chosen or os.urandom(16).hex()  # what uuid4().hex gives, for less
    return chosen
