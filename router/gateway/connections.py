"""Client connections: a cap below the file limit and a deadline for each request head.

Why: uvicorn arms its keep-alive timeout only after a response, so a socket that connects
and sends nothing (or one header byte now and then) is held forever; ~1,100 of them used up
``nofile`` 1024 and denied service to everyone, with nothing logged. ``limit_concurrency``
does not help (it answers 503 once a request head is complete, and holds the sockets).

:class:`GuardedProtocols` is given to uvicorn as its ``http`` protocol factory (a picklable
callable, so ``--workers N`` children get it too). Each connection beyond ``max_connections``
is closed at once (logged, at most every 10 s); each request head (the first of a connection,
and each later one from its first byte) must be complete within ``header_timeout_s`` and hold
at most ``max_header_bytes`` (URL and headers), else 431 (httptools sets no limit of its own).
Each request's scope also carries a :class:`router.core.disconnect.Disconnect`, fired when
its connection is lost before the answer ended.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal

import httptools
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.core.disconnect import SCOPE_KEY, Disconnect
from router.gateway.cycle import FastCycle

log = logging.getLogger("router.gateway")

_TOO_LARGE_BODY = (b'{"error": {"message": "request head exceeds the size limit", "type": "invalid_request_error", '
                   b'"param": null, "code": "headers_too_large"}}')
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\nconnection: close\r\n"
              b"content-length: " + str(len(_TOO_LARGE_BODY)).encode() + b"\r\n\r\n" + _TOO_LARGE_BODY)
_FD_RESERVE = 64  # files the process needs besides client sockets (logs, Redis, metrics files)


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    max_header_bytes: int = 64 * 1024


def connection_cap(configured: int, upstream_connections: int) -> int:
    """``configured``, lowered so that client and engine sockets together stay below the soft
    file limit (past it, accept() fails for everyone and nothing says why)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    room = soft - upstream_connections - _FD_RESERVE
    if room < configured:
        log.warning("server.max_connections %d lowered to %d: the file limit is %d (%d kept for engine connections)",
                    configured, max(1, room), soft, upstream_connections)
    return max(1, min(configured, room))


class _Refusals:
    """Refused connections, logged at most every 10 s (a flood must not flood the log)."""

    def __init__(self) -> None:
        self.count = 0
        self._logged_at = 0.0
        self._logged_count = 0

    def refused(self, cap: int) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._logged_at >= 10:
            log.warning("connection cap reached (%d open): %d connection(s) refused since the last report",
                        cap, self.count - self._logged_count)
            self._logged_at, self._logged_count = now, self.count


class GuardedProtocols:
    """A factory of guarded httptools protocols for uvicorn's ``http`` setting."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.refusals = _Refusals()

    def __getstate__(self) -> dict[str, Any]:
        return {"limits": self.limits}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limits"])  # type: ignore[misc]

    def __call__(self, *args: Any, **kwargs: Any) -> GuardedHttpTools:
        return GuardedHttpTools(self, *args, **kwargs)


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the connection cap, the head deadline and size limit,
    and the router's cycle.

    Both waits a connection may owe — a request head complete within ``header_timeout_s`` of its
    first byte, the next request begun within ``timeout_keep_alive`` of an answer (uvicorn's
    rule) — are one deadline kept on one timer per connection, moved by assignment: uvicorn
    and the head guard each created and cancelled a timer per request (two ``call_later`` and
    two ``cancel`` on every request's path, ~1% of its CPU). The timer, when it fires, acts
    only if the deadline it finds has passed, and otherwise re-arms itself for it (at most
    once per timeout while requests keep coming)."""

    def __init__(self, guard: GuardedProtocols, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._deadline: float | None = None  # loop time by which the connection must go on; None while a request is served
        self._waiting_for: Literal["head", "request"] = "head"
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._head_bytes = 0
        self._refused = False  # the head was too large: answered 431, nothing more is read

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        full = len(self.connections) >= self._guard.limits.max_connections
        super().connection_made(transport)
        if full:
            self._guard.refusals.refused(self._guard.limits.max_connections)
            transport.abort()
            return
        self._expect("head", self._guard.limits.header_timeout_s)

    def _expect(self, what: Literal["head", "request"], within_s: float) -> None:
        at = self.loop.time() + within_s
        self._deadline, self._waiting_for = at, what
        if self._timer is not None and self._timer_at <= at:
            return  # fires first, finds the deadline ahead, re-arms for it
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at, self._timer = at, self.loop.call_at(at, self._on_timer)

    def _disarm(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        at = self._deadline
        if at is None:  # a request is being served: the next wait arms a new timer
            return
        if at > self.loop.time():
            self._timer_at, self._timer = at, self.loop.call_at(at, self._on_timer)
        elif self._waiting_for == "head":
            self._head_timeout()
        else:
            self._deadline = None
            self.timeout_keep_alive_handler()

    def _head_timeout(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.info("connection from %s closed: no complete request head within %.1fs",
                     self.client[0] if self.client else "?", self._guard.limits.header_timeout_s)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._deadline is None or self._waiting_for == "request":  # a later request of a kept-alive connection
            self._expect("head", self._guard.limits.header_timeout_s)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._guard.limits.max_header_bytes and not self._refused:
            self._refused = True
            self._disarm()
            self.transport.write(_TOO_LARGE)
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's on_header with the size count inline: three Python calls per header were one
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self._guard.limits.max_header_bytes:
            self._count(0)
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def data_received(self, data: bytes) -> None:
        if self._waiting_for == "request":  # any byte ends the keep-alive wait, as uvicorn's timer cancel did
            self._deadline = None
        if not self._refused:
            super().data_received(data)

    def on_headers_complete(self) -> None:
        self._deadline = None  # the timer, if armed, finds nothing to do
        if self._refused:
            return
        self.scope[SCOPE_KEY] = Disconnect()  # type: ignore[literal-required]
        # uvicorn's on_headers_complete, with the router's cycle (router/gateway/cycle.py)
        http_version = self.parser.get_http_version()
        self.scope["method"] = self.parser.get_method().decode("ascii")
        if http_version != "1.1":
            self.scope["http_version"] = http_version
        if self.parser.should_upgrade() and self._should_upgrade():
            return
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        self.scope["path"] = self.root_path + path
        self.scope["raw_path"] = self.root_path.encode("ascii") + url.path
        self.scope["query_string"] = url.query or b""
        app = self.app
        if self.limit_concurrency is not None and (
                len(self.connections) >= self.limit_concurrency or len(self.tasks) >= self.limit_concurrency):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        existing = self.cycle
        self.cycle = FastCycle(
            scope=self.scope, transport=self.transport, flow=self.flow, logger=self.logger,
            access_logger=self.access_logger, access_log=self.access_log,
            default_headers=self.server_state.default_headers, message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and self.parser.should_keep_alive(), on_response=self.on_response_complete)
        if existing is None or existing.response_complete:
            self._start_asgi_task(self.cycle, app)
        else:  # a pipelined request waits for the one before it
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, app))

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive wait as this connection's deadline instead of a new timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._expect("request", self.timeout_keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            signal = cycle.scope.get(SCOPE_KEY)
            if isinstance(signal, Disconnect):
                signal.fire()
