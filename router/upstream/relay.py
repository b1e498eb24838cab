"""Relaying an engine's answer back to the client (sending the request: client.py).

The response body is streamed chunk by chunk as it arrives (SSE or JSON alike), and a
:class:`RelayObserver` hears of the first byte (prefill is over) and of the end, whatever the
end: complete, upstream failure, or client disconnect. The relay knows nothing of what the
observer does with it (booking, metrics: router/request/hooks.py); it only promises to report
the end exactly once, shielded from cancellation, so booked load is always released.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.core.disconnect import on_disconnect
from router.core.errors import UpstreamFailure
from router.core.shielded import shielded
from router.upstream.pool import UpstreamBody

log = logging.getLogger(__name__)

# Request headers worth passing to an engine; everything else (Host, hop-by-hop,
# Content-Length, cookies) stays at the router.
_FORWARDED = ("authorization", "accept", "user-agent", "openai-organization", "openai-project", "traceparent")
# Response headers passed back to the client (bytes are relayed as they come, so an encoding
# the engine applied anyway must travel with them). Not x-request-id: the gateway sets it.
_RETURNED = ("content-type", "content-encoding", "cache-control", "openai-processing-ms")
_MID_STREAM = f"data: {json.dumps(UpstreamFailure('upstream instance failed mid-stream', code='upstream_disconnected').body())}\n\n".encode()

Outcome = Literal["ok", "upstream_error", "client_disconnect"]


class RelayObserver(Protocol):
    """Hears how a relay goes: ``first_byte`` at most once, then ``end`` exactly once, with
    the last bytes relayed (the last three chunks: where an event stream's ``usage`` is, even
    when a read split its event, with the terminator after it)."""

    async def first_byte(self) -> None: ...

    async def end(self, outcome: Outcome, tail: tuple[bytes, ...] = ()) -> None: ...


@dataclass(frozen=True)
class Resumed:
    """A new upstream stream that continues a broken one: its response, first chunk, the rest,
    and the observer of its attempt."""

    upstream: httpx.Response
    first: bytes
    chunks: AsyncIterator[bytes]
    observer: RelayObserver


class StreamContinuer(Protocol):
    """Sees every chunk of a stream (and may rewrite it); asked to go on when the upstream breaks
    (router/request/continuation.py)."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...

    async def resume(self) -> Resumed | None: ...

    def ending(self) -> bytes | None: ...


def raw_chunks(upstream: httpx.Response) -> AsyncIterator[bytes]:
    """The body as it arrives, undecoded (the engine was asked for identity; an encoding it
    applied anyway travels on in ``content-encoding``). From UpstreamTransport, its body
    stream itself: httpx's chunker and per-chunk request context have nothing to do there.
    The caller closes ``upstream``."""
    stream = upstream.stream
    return stream.__aiter__() if isinstance(stream, UpstreamBody) else upstream.aiter_raw()


async def read_raw(upstream: httpx.Response) -> bytes:
    """The whole body, undecoded (as :func:`raw_chunks`); ``upstream`` is closed after.

    From UpstreamTransport, read and closed on its body stream directly: httpx's
    ``Response.aclose`` only wraps the same close in a generator-based context manager."""
    stream = upstream.stream
    if isinstance(stream, UpstreamBody):
        try:
            return await stream.read()
        finally:
            await stream.aclose()
            upstream.is_closed = True  # as Response.aclose leaves it
    try:
        parts = [chunk async for chunk in raw_chunks(upstream)]
    finally:
        await upstream.aclose()
    return parts[0] if len(parts) == 1 else b"".join(parts)


_FORWARDED_RAW = {name.encode(): name for name in _FORWARDED}
_RETURNED_RAW = frozenset(name.encode() for name in _RETURNED)


def upstream_headers(incoming: Mapping[str, str], request_id: str) -> dict[str, str]:
    raw = getattr(incoming, "raw", None)
    if isinstance(raw, list):  # Starlette's Headers: one pass over the ASGI list (lower-case names) instead of a scan per name
        headers: dict[str, str] = {}
        for name, value in raw:
            wanted = _FORWARDED_RAW.get(name)
            if wanted is not None and wanted not in headers:  # the first value of a name, as headers[name] gives
                headers[wanted] = value.decode("latin-1")
    else:
        headers = {k: incoming[k] for k in _FORWARDED if k in incoming}
    headers["x-request-id"] = request_id
    headers["content-type"] = "application/json"
    # The router relays raw bytes chunk by chunk and reads JSON answers itself (the vLLM
    # prefill leg): ask engines not to compress rather than httpx's default gzip/br offer.
    headers["accept-encoding"] = "identity"
    return headers


def _raw(upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
    stream = upstream.stream
    return stream.raw_headers if isinstance(stream, UpstreamBody) else upstream.headers.raw


def returned_headers(upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
    """The headers passed back, as ASGI wants them, in one pass over the engine's raw list."""
    return [(name, value) for n, value in _raw(upstream) if (name := n.lower()) in _RETURNED_RAW]


def is_event_stream(upstream: httpx.Response) -> bool:
    """Whether the answer is ``text/event-stream`` (its first content-type, as ``headers.get`` reads)."""
    for name, value in _raw(upstream):
        if name.lower() == b"content-type":
            return value.startswith(b"text/event-stream")
    return False


class WholeAnswer(Response):
    """An engine's complete answer relayed as it came: status, body and the returned headers
    (Starlette's Response would re-derive and re-encode them)."""

    def __init__(self, body: bytes, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code, self.body, self.background = status, body, None
        self.raw_headers = [*headers, (b"content-length", b"%d" % len(body))]


class RelayResponse(Response):
    """An ASGI response that streams an upstream event stream to the client.

    Its headers are held until the first upstream chunk arrived (the caller reads ``first``,
    so that a failure before it is still retried elsewhere); ``chunks`` yields the rest, each
    within ``idle_timeout_s`` of the previous one. ``request_id`` only names the request in
    log lines. A JSON answer is read whole by the caller instead: a body cut short must never
    reach the client as a success."""

    def __init__(self, upstream: httpx.Response, request_id: str, observer: RelayObserver, first: bytes,
                 chunks: AsyncIterator[bytes], idle_timeout_s: float | None = None,
                 continuer: StreamContinuer | None = None) -> None:
        self.status_code, self.background = upstream.status_code, None
        self._upstream, self._request_id, self._observer = upstream, request_id, observer
        self._first, self._chunks, self._idle = first, chunks, idle_timeout_s
        self._continuer = continuer
        self._is_sse = is_event_stream(upstream)
        self._tail: tuple[bytes, bytes, bytes] = (b"", b"", first)  # the last three chunks relayed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome: Outcome = "client_disconnect"
        task = asyncio.current_task()
        assert task is not None
        disconnected = False

        def gone() -> None:
            nonlocal disconnected
            disconnected = True
            task.cancel()

        # A callback and Task.uncancel(): what an anyio task group did here, for less (it was ~8% of the CPU).
        stop = on_disconnect(scope, receive, gone)
        try:
            outcome = await self._relay(send)
        except asyncio.CancelledError:
            if not disconnected or task.uncancel() > 0:  # cancelled from outside, not by the watcher
                raise
        finally:
            stop()
            await shielded(self._close(self._upstream, self._observer, outcome, self._tail))

    @staticmethod
    async def _close(upstream: httpx.Response, observer: RelayObserver, outcome: Outcome,
                     tail: tuple[bytes, ...] = ()) -> None:
        await upstream.aclose()
        await observer.end(outcome, tail)

    def continue_with(self, continuer: StreamContinuer) -> None:
        self._continuer = continuer

    def detach(self) -> Resumed:
        """This response's stream, for a relay already under way (a continuation) to go on with."""
        return Resumed(self._upstream, self._first, self._chunks, self._observer)

    async def _relay(self, send: Send) -> Outcome:
        await send({"type": "http.response.start", "status": self._upstream.status_code,
                    "headers": returned_headers(self._upstream)})
        while True:
            try:
                return await self._pump(send)
            except (httpx.HTTPError, TimeoutError) as exc:
                log.warning("request %s: upstream failed mid-response: %s", self._request_id, type(exc).__name__)
                resumed = None if self._continuer is None else await self._continuer.resume()
                if resumed is None:
                    # a whole answer whose engine broke before its terminator ends as it would have
                    ending = None if self._continuer is None else self._continuer.ending()
                    if self._is_sse and ending != b"":
                        await send({"type": "http.response.body", "body": _MID_STREAM if ending is None else ending,
                                    "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return "upstream_error"
            # the broken attempt ends here; the relay goes on with the one that continues it
            await shielded(self._close(self._upstream, self._observer, "upstream_error"))
            self._upstream, self._first, self._chunks, self._observer = (
                resumed.upstream, resumed.first, resumed.chunks, resumed.observer)
            self._tail = (b"", b"", resumed.first)

    async def _pump(self, send: Send) -> Outcome:
        # From UpstreamTransport: once the whole body arrived, the last chunk goes out with the
        # end of the body in one write instead of two (same bytes, one syscall less).
        body = self._upstream.stream if isinstance(self._upstream.stream, UpstreamBody) else None
        chunks, feed = self._chunks, self._continuer
        chunk = self._first
        if body is not None and body.complete:  # the whole answer came with its first chunk: no wait, no idle timer
            if feed is not None:
                chunk = feed.feed(chunk) + feed.flush()
            await send({"type": "http.response.body", "body": chunk, "more_body": False})
            return "ok"
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as idle:
            while True:
                if feed is not None:
                    chunk = feed.feed(chunk)
                if body is not None and body.complete:
                    rest = b"" if feed is None else feed.flush()
                    await send({"type": "http.response.body", "body": chunk + rest, "more_body": False})
                    return "ok"
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if self._idle is not None:  # armed while waiting on the engine only, not on a slow client
                    idle.reschedule(loop.time() + self._idle)
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                idle.reschedule(None)
                if chunk:
                    tail = self._tail
                    self._tail = (tail[1], tail[2], chunk)
        rest = b"" if feed is None else feed.flush()
        await send({"type": "http.response.body", "body": rest, "more_body": False})
        return "ok"
