"""A lean HTTP/1.1 keep-alive connection pool to engine instances, behind httpx's transport API.

Why not httpx's own pool (httpcore): under load it scanned every pooled connection and polled
each idle socket on every request, so the router got slower as concurrency rose (docs/
benchmarks.md, "Router overhead"). Here the event loop tells us when an engine closes a pooled
connection (``connection_lost``), responses are parsed by httptools (C), and an answer that
arrives in one read leaves as one chunk. Only plain ``http://`` GET/POST with an in-memory body
take this path; TLS, other methods and streamed request bodies go to httpx's own transport.
Callers keep httpx's API: ``httpx.AsyncClient(transport=UpstreamTransport(limits))``, the same
timeouts and the same exception types.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping

import httptools
import httpx

_HIGH_WATER = 256 * 1024  # upstream transport: stop reading an answer the client is slow to take beyond this


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to an instance, one request at a time.

    Why a protocol: the loop tells us when the peer closes a pooled connection
    (``connection_lost``), so reuse needs no socket poll, and an answer that arrives in one
    read is parsed (httptools, C) in one call and handed out as one chunk.
    """

    def __init__(self, key: tuple[str, int]) -> None:
        self.key, self.closed, self.idle_since = key, False, 0.0
        self.transport: asyncio.Transport | None = None
        self.request: httpx.Request | None = None
        self.active = False  # a request is out; data arriving while idle kills the connection
        # One parser for the connection's life: it is only reused after a complete message
        # (an error, an answer cut short or one ending with the connection closes it).
        self.parser = httptools.HttpResponseParser(self)
        self.reset()

    def reset(self) -> None:
        self.status, self.reason, self.headers, self.pending = 0, b"", [], []  # type: ignore[var-annotated]
        self.chunks: deque[bytes] = deque()
        self.buffered, self.headers_done, self.complete, self.eof_body, self.paused = 0, False, False, False, False
        self.keep_alive = self.set_cookie = False
        self.error: httpx.TransportError | None = None
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.active:
            return self.close()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = self.error or httpx.RemoteProtocolError(f"invalid response: {exc}", request=self.request)
            self.close()
        if self.pending:  # whatever arrived in one read leaves as one chunk
            chunk = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
            self.pending.clear()
            self.chunks.append(chunk)
            self.buffered += len(chunk)
            if self.buffered > _HIGH_WATER and not self.paused and not self.closed:
                self.paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
        self.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and self.eof_body and exc is None:
            self.complete = True  # a body with neither length nor chunking ends with the connection
        elif self.active and not self.complete and self.error is None:
            what = "peer closed connection without sending complete message body" if self.headers_done else \
                "Server disconnected without sending a response."
            self.error = httpx.RemoteProtocolError(what, request=self.request)
        self.wake()

    def on_status(self, reason: bytes) -> None:  # httptools callbacks, from here to on_message_complete
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        names = {n.lower() for n, _ in self.headers}
        self.eof_body = not names & {b"content-length", b"transfer-encoding"}
        self.set_cookie = b"set-cookie" in names
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if body:
            self.pending.append(body)

    def on_message_complete(self) -> None:
        self.complete, self.keep_alive = True, self.parser.should_keep_alive()  # valid only in this callback

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout: float | None, error: type[httpx.TimeoutException] = httpx.ReadTimeout) -> None:
        """Until the connection has news, or ``error``: a bare timer, cheaper than wait_for per chunk."""
        loop = asyncio.get_running_loop()
        self.waiter = waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, self._time_out, waiter, error)
        try:
            await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def _time_out(self, waiter: asyncio.Future[None], error: type[httpx.TimeoutException]) -> None:
        if not waiter.done():
            waiter.set_exception(error("timed out", request=self.request))

    async def send(self, data: bytes, request: httpx.Request | None, timeouts: Mapping[str, float | None]) -> None:
        """Write one request, wait for the status line and headers."""
        self.reset()
        self.active, self.request = True, request
        if self.closed or self.transport is None or self.transport.is_closing():
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        self.transport.write(data)  # buffered by the loop: a peer that stops reading ends in a read timeout
        while not self.headers_done and self.error is None:
            await self.wait(timeouts.get("read"))
        if not self.headers_done:
            raise self.error  # type: ignore[misc]

    async def next_chunk(self, timeout: float | None) -> bytes:
        """The next piece of the body, or b"" once it is complete."""
        while not self.chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self.wait(timeout)
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered <= _HIGH_WATER // 4 and not self.closed:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        return chunk

    def drained(self) -> bool:  # the whole body arrived and was handed out
        return self.complete and not self.chunks

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamBody(httpx.AsyncByteStream):
    """An answer's body as UpstreamTransport hands it out (``response.stream``).

    Its connection goes back to the pool on close, reused if the body was fully read.
    ``complete`` is public for the relay: once it is true after a chunk, that chunk was the
    last, so the relay can end the client's answer with it in one write instead of two.
    """

    def __init__(self, pool: UpstreamTransport, conn: _Connection, timeout: float | None) -> None:
        self._pool, self._conn, self._timeout, self._open = pool, conn, timeout, True
        # The answer's head as parsed, for the relay and the client (httpx's Headers re-derive
        # an encoding and rebuild lists on each look-up): raw (name, value) pairs, and whether
        # a set-cookie is among them.
        self.raw_headers: list[tuple[bytes, bytes]] = conn.headers
        self.set_cookie: bool = conn.set_cookie

    @property
    def complete(self) -> bool:
        """True once the whole body arrived and every chunk of it was handed out."""
        return self._conn.drained()

    def __aiter__(self) -> AsyncIterator[bytes]:
        # an iterator object, not an async generator: the loop registers every async generator
        # (a WeakSet entry and a finaliser per answer) and closing one costs a throw
        return _Chunks(self._conn, self._timeout)

    async def read(self) -> bytes:
        """The rest of the body at once (a JSON answer, read whole by the caller)."""
        conn, timeout = self._conn, self._timeout
        first = await conn.next_chunk(timeout)
        if not first:
            return b""
        parts = [first]
        while chunk := await conn.next_chunk(timeout):
            parts.append(chunk)
        return first if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self._pool.release(self._conn)


class _Chunks:
    """The chunks of one answer's body as they arrive (``async for`` over an UpstreamBody)."""

    __slots__ = ("_conn", "_timeout")

    def __init__(self, conn: _Connection, timeout: float | None) -> None:
        self._conn, self._timeout = conn, timeout

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._conn.next_chunk(self._timeout)
        if not chunk:
            raise StopAsyncIteration
        return chunk


class UpstreamResponse(httpx.Response):
    """An httpx.Response whose ``headers`` are built from the parsed raw list on first look.

    Why: httpx.Response's constructor normalises every header into an ``httpx.Headers`` (~2 µs
    of a request's CPU), yet the router's hot path never looks at them that way: the relay and
    the service read the raw pairs (``UpstreamBody.raw_headers``). Everything else is the
    httpx.Response a caller expects (same attributes, same methods); only an error answer,
    cookies or a caller asking for ``headers`` pays for building them."""

    def __init__(self, status_code: int, raw: list[tuple[bytes, bytes]], stream: UpstreamBody, reason: bytes,
                 request: httpx.Request | None = None) -> None:
        # httpx.Response.__init__ with a stream and no content, minus the header normalisation
        self.status_code, self._raw_headers = status_code, raw
        self._headers: httpx.Headers | None = None
        self._request, self.next_request = request, None
        self.extensions = {"http_version": b"HTTP/1.1", "reason_phrase": reason}
        self.history, self.is_closed, self.is_stream_consumed = [], False, False
        self.default_encoding, self.stream, self._num_bytes_downloaded = "utf-8", stream, 0

    @property
    def headers(self) -> httpx.Headers:
        headers = self._headers
        if headers is None:
            headers = self._headers = httpx.Headers(self._raw_headers)
        return headers

    @headers.setter
    def headers(self, value: httpx.Headers) -> None:
        self._headers = httpx.Headers(value)


class UpstreamTransport(httpx.AsyncBaseTransport):
    """A lean HTTP/1.1 keep-alive pool for ``http://`` instances; the rest (TLS, other methods,
    streamed request bodies) goes to httpx's own transport, built with the same limits.

    Same contract as httpx's: ``Limits`` (connections, idle connections, keep-alive expiry),
    connect/read/pool timeouts, the httpx exception for each failure, and a body stream
    (:class:`UpstreamBody`) that returns its connection to the pool once fully read and
    closes it otherwise.
    """

    def __init__(self, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's defaults
        self._fallback = httpx.AsyncHTTPTransport(limits=limits)
        self._max, self._expiry = limits.max_connections or 1 << 30, limits.keepalive_expiry
        self._max_idle = limits.max_keepalive_connections if limits.max_keepalive_connections is not None else self._max
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._idle_count = self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http" or request.method not in ("GET", "POST") or not isinstance(request.stream, httpx.ByteStream):
            return await self._fallback.handle_async_request(request)
        head = [request.method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        return await self.exchange((url.host, url.port or 80), b"".join(head) + request.content,
                                   request.extensions.get("timeout", {}), request)

    async def exchange(self, key: tuple[str, int], data: bytes, timeouts: Mapping[str, float | None],
                       request: httpx.Request | None = None) -> httpx.Response:
        """Send ``data`` (a whole HTTP/1.1 request, head and body) to ``key`` = (host, port) on a
        pooled connection; return once the status line and headers arrived, the body unread.
        ``request`` only goes into the exceptions (the client's short cut has none)."""
        conn = await self._acquire(key, request, timeouts)
        try:
            await conn.send(data, request, timeouts)
        except BaseException:
            self.release(conn, reuse=False)
            raise
        return UpstreamResponse(conn.status, conn.headers, UpstreamBody(self, conn, timeouts.get("read")), conn.reason, request)

    async def _acquire(self, key: tuple[str, int], request: httpx.Request | None, timeouts: Mapping[str, float | None]) -> _Connection:
        # the warmest idle connection to ``key``, else a new one, else wait for a free slot
        while True:
            idle, now = self._idle.get(key), time.monotonic()
            while idle:
                conn = idle.pop()
                self._idle_count -= 1
                if not conn.closed and (self._expiry is None or now - conn.idle_since < self._expiry):
                    return conn
                self._discard(conn)
            if self._open >= self._max and self._idle_count:  # full: make room by dropping the oldest idle one
                oldest = min((c for conns in self._idle.values() for c in conns), key=lambda c: c.idle_since)
                self._idle[oldest.key].remove(oldest)
                self._idle_count -= 1
                self._discard(oldest)
            if self._open < self._max:
                break
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:  # a waiter that timed out stays queued, done: _wake_one skips it
                await asyncio.wait_for(waiter, timeouts.get("pool"))
            except TimeoutError:
                raise httpx.PoolTimeout("timed out waiting for a connection", request=request) from None
        self._open += 1
        try:
            _, conn = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                lambda: _Connection(key), key[0], key[1]), timeouts.get("connect"))
        except BaseException as exc:
            self._discard(None)
            if isinstance(exc, TimeoutError):
                raise httpx.ConnectTimeout("timed out connecting to the instance", request=request) from None
            if isinstance(exc, OSError):
                raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
            raise
        return conn

    def release(self, conn: _Connection, reuse: bool = True) -> None:  # to the idle pool if reusable, else closed
        conn.active = False
        if reuse and conn.complete and conn.keep_alive and not conn.closed and self._idle_count < self._max_idle:
            conn.idle_since = time.monotonic()
            self._idle.setdefault(conn.key, []).append(conn)
            self._idle_count += 1
            self._wake_one()
        else:
            self._discard(conn)

    def _discard(self, conn: _Connection | None) -> None:  # None: a connection that never opened
        if conn is not None:
            conn.close()
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for conn in [c for conns in self._idle.values() for c in conns]:
            conn.close()
        self._idle, self._idle_count = {}, 0
        await self._fallback.aclose()
