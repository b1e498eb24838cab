"""One id per client request: the caller's ``x-request-id`` when it is a sane token, else a new one.

It is assigned once, when the request enters (router/gateway/errors.py's middleware), kept in
the ASGI scope, forwarded to the engines and written on the answer and in the logs, so one id
follows a request through router, prefill and decode.
"""

from __future__ import annotations

import random

from starlette.types import Scope

from router.core.logs import REQUEST_ID_PATTERN

SCOPE_KEY = "pd_router.request_id"  # an ASGI scope extension key: the id of this request


def new_id() -> str:
    """128 random bits as 32 hex digits, what ``uuid4().hex`` gives, for a fifth of its cost.

    Not a secret (it is written on the answer), only unique: the module-level generator is
    seeded from os.urandom and re-seeded in every forked worker, so replicas and ``--workers``
    never share a sequence."""
    return f"{random.getrandbits(128):032x}"


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
    scope[SCOPE_KEY] = chosen = chosen or new_id()
    return chosen
