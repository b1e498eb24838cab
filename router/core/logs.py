"""Log setup for ``pd-router serve``: text or one JSON object per line, with the request id.

The request id is the one the router forwards to the engines (``x-request-id``): the client's
when it sent a usable one, else a new one. The gateway's one request-id middleware
(router/gateway/errors.py) settles it before the app sees the request and binds it here, in a
context variable, so every line logged while serving that
request (the request line, retries, prefill failures, uvicorn's error report) carries it and
can be joined with the engines' logs. Prompt text is never logged.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

# The ids the router accepts from a client; the request path applies the same rule.
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("pd_router_request_id", default=None)

_TEXT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
# LogRecord attributes that are not extra fields a caller passed.
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "request_id", "color_message",  # uvicorn's coloured copy of the message
}


def current_request_id() -> str | None:
    return _REQUEST_ID.get()


def bind_request_id(request_id: str) -> contextvars.Token[str | None]:
    """Every line logged from now on in this task carries ``request_id``; undo with ``unbind``."""
    return _REQUEST_ID.set(request_id)


def unbind_request_id(token: contextvars.Token[str | None]) -> None:
    _REQUEST_ID.reset(token)


class RequestIdFilter(logging.Filter):
    """Puts the current request id (or ``-``) on every record as ``request_id``."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _REQUEST_ID.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, request_id, extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or _REQUEST_ID.get()
        if request_id and request_id != "-":
            out["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, ensure_ascii=False)


def logging_config(level: str, fmt: LogFormat) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict for the router and uvicorn alike.

    Handed to uvicorn as ``log_config``, which applies it in every worker process it starts
    (spawned workers inherit no logging set up in the parent)."""
    formatter: dict[str, Any] = {"()": f"{__name__}.JsonFormatter"} if fmt == "json" else {"format": _TEXT}
    quiet = max(logging.WARNING, logging.getLevelName(level.upper()))
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": f"{__name__}.RequestIdFilter"}},
        "formatters": {"default": formatter},
        "handlers": {
            "default": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                        "formatter": "default", "filters": ["request_id"]},
        },
        "root": {"handlers": ["default"], "level": level.upper()},
        "loggers": {
            # uvicorn's loggers propagate to the root handler instead of their own.
            "uvicorn": {"handlers": [], "propagate": True},
            "uvicorn.error": {"handlers": [], "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": True},
            # httpx logs every upstream request at INFO; the router's own request line says more.
            "httpx": {"level": logging.getLevelName(quiet)},
            "httpcore": {"level": logging.getLevelName(quiet)},
        },
    }


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
