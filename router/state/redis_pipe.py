"""One pipelined connection for the standalone store's hot call (EVALSHA of lua/ops.lua).

Why: the store's calls used a connection each, taken from a list of idle ones (redis_calls.Line).
With more calls in flight than the list kept (64), every extra call opened a connection and
closed it after: a TCP connect, CLIENT SETINFO, and redis-py resolving its own version from the
package metadata for each (``DriverInfo``: 12% of the router's CPU at 256 streams in flight,
loadtests/cpu_per_request.py, Redis row). Redis runs one command at a time whatever the number of
connections, so nothing is gained by more than one: here every call is written on one
connection as it comes (several calls in one loop pass leave in one ``send``) and the replies,
which Redis sends in order, are matched to the calls in order, parsed by hiredis as they arrive.

The rules that keep a reply from ever being read as another call's: a call's slot is queued in
the same synchronous step as its bytes are written; a reply error (NOSCRIPT) is that call's
exception, parsed whole, so the stream stays in step; a call that times out closes the
connection (Redis is not answering: the calls behind it fail too, as they would have timed out)
and the next call opens a new one; a lost connection fails every call in flight on it. The
errors are redis-py's (ConnectionError, TimeoutError, its ResponseError classes), so the store
handles them as it did. TCP and unix sockets; a TLS URL keeps redis_calls.Line.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import Sequence
from typing import Any

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, ConnectionPool, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

Arg = str | int | float | bytes


_C_PACK = getattr(hiredis, "pack_command", None)  # hiredis >= 2.1: the packer in C, 2.6x faster


def pack_command(args: Sequence[Any], encode: Any = None) -> bytes:
    """A command in RESP, joined once (redis_calls.LinearPackConnection says why): by hiredis
    for str, int, float and bytes arguments, else here (``encode`` for other kinds)."""
    if _C_PACK is not None:
        try:
            return _C_PACK(args if type(args) is tuple else tuple(args))  # type: ignore[no-any-return]
        except TypeError:  # an argument hiredis does not pack
            pass
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)
        if kind is str:
            data = arg.encode()
        elif kind is int:
            data = b"%d" % arg
        elif kind is bytes:
            data = arg
        elif encode is not None:
            data = encode(arg)
        elif kind is float:
            data = repr(arg).encode()
        else:
            raise TypeError(f"cannot send a {kind.__name__} to Redis")
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


class _Wire(asyncio.Protocol):
    """The socket: writes as they come, replies to the calls in order. A call's timeout is
    one watch per connection, not a timer per call (``asyncio.timeout`` per call was 4% of
    the router's samples): armed at the oldest call's deadline, it closes the connection
    when that call is still unanswered then, failing it and those behind it with TimeoutError."""

    def __init__(self, encoding: str | None, timeout_s: float | None) -> None:
        kwargs: dict[str, Any] = {"protocolError": InvalidResponse, "replyError": BaseParser.parse_error}
        if encoding:
            kwargs["encoding"] = encoding
        self._reader = hiredis.Reader(**kwargs)
        self.pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._sent: collections.deque[float] = collections.deque()  # when each pending call was written
        self._out: list[bytes] = []  # commands of this loop pass, not yet written
        self._timeout_s = timeout_s
        self._watch: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are no asyncio.Transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data: bytes) -> asyncio.Future[Any]:
        """Write one command; the future of its reply (slot queued in the same step)."""
        if self.lost is not None or self.transport is None:
            raise RedisConnectionError(f"Redis connection lost: {self.lost}")
        loop = self._loop
        future = loop.create_future()
        self.pending.append(future)
        self._sent.append(loop.time())
        if not self._out:  # the calls of this loop pass leave in one write, at its end
            loop.call_soon(self._flush)
        self._out.append(data)
        if self._watch is None and self._timeout_s is not None:
            self._watch = loop.call_at(self._sent[0] + self._timeout_s, self._check)
        return future

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and self.lost is None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _check(self) -> None:
        self._watch = None
        if not self._sent:
            return
        deadline = self._sent[0] + (self._timeout_s or 0.0)
        if self._loop.time() >= deadline:  # Redis is not answering in time: a late reply must never meet a new call
            self.close(TimeoutError("a Redis call timed out"), timed_out=True)
        else:
            self._watch = self._loop.call_at(deadline, self._check)

    def data_received(self, data: bytes) -> None:
        reader, pending = self._reader, self.pending
        try:
            reader.feed(data)
            while (reply := reader.gets()) is not False:
                if not pending:
                    raise InvalidResponse("a reply no call asked for")
                future = pending.popleft()
                self._sent.popleft()
                if future.done():  # its caller went away (cancelled): the reply is dropped, in step
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except Exception as exc:  # a protocol error: nothing after it can be matched to a call
            self.close(RedisConnectionError(f"Redis protocol error: {exc}"))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drain(self) -> None:
        if not self._writable.is_set():
            await self._writable.wait()

    def close(self, why: BaseException, timed_out: bool = False) -> None:
        if self.lost is None:
            self.lost = why
        self._sent.clear()
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(TimeoutError(str(why)) if timed_out else RedisConnectionError(str(why)))
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._writable.set()  # a call waiting to write wakes to its failed reply
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(exc or RedisConnectionError("Redis closed the connection"))


class PipedLine:
    """Calls over one pipelined connection (module docstring); the same ``call`` as Line."""

    def __init__(self, pool: ConnectionPool, timeout_s: float | None) -> None:
        kwargs = pool.connection_kwargs
        self._unix = issubclass(pool.connection_class, UnixDomainSocketConnection)
        self._path = str(kwargs.get("path", ""))
        self._host, self._port = str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379))
        self._db = int(kwargs.get("db", 0) or 0)
        self._username, self._password = kwargs.get("username"), kwargs.get("password")
        self._encoding = kwargs.get("encoding", "utf-8") if kwargs.get("decode_responses") else None
        self._timeout_s = timeout_s
        self._wire: _Wire | None = None
        self._connecting: asyncio.Task[_Wire] | None = None

    @staticmethod
    def serves(pool: ConnectionPool) -> bool:
        """TCP and unix sockets without TLS (a TLS URL keeps redis_calls.Line)."""
        cls = pool.connection_class
        return issubclass(cls, (Connection, UnixDomainSocketConnection)) and not issubclass(cls, SSLConnection)

    async def _open(self) -> _Wire:
        loop = asyncio.get_running_loop()
        encoding, timeout_s = self._encoding, self._timeout_s
        if self._unix:
            _, wire = await loop.create_unix_connection(lambda: _Wire(encoding, timeout_s), self._path)
        else:
            _, wire = await loop.create_connection(lambda: _Wire(encoding, timeout_s), self._host, self._port)
        hello: list[asyncio.Future[Any]] = []
        if self._password is not None:
            auth = ("AUTH", self._username, self._password) if self._username else ("AUTH", self._password)
            hello.append(wire.send(pack_command(auth)))
        if self._db:
            hello.append(wire.send(pack_command(("SELECT", self._db))))
        try:
            for reply in hello:
                await reply  # a refused AUTH raises redis-py's AuthenticationError here
        except BaseException as exc:
            wire.close(exc)
            raise
        return wire

    async def _connected(self) -> _Wire:
        wire = self._wire
        if wire is not None and wire.lost is None:
            return wire
        if self._connecting is None:  # one connect, shared by the calls that arrive meanwhile
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            wire = await asyncio.shield(connecting)
        except OSError as exc:
            raise RedisConnectionError(f"Error connecting to Redis: {exc}") from exc
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None
        self._wire = wire
        return wire

    async def call(self, *args: Arg) -> Any:
        data = pack_command(args)
        wire = self._wire
        if wire is None or wire.lost is not None:
            async with asyncio.timeout(self._timeout_s):  # the connect (and AUTH, SELECT) in time
                wire = await self._connected()
        reply = wire.send(data)  # timed by the connection's watch (_Wire)
        await wire.drain()
        return await reply

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(BaseException):
                await self._connecting
        wire, self._wire = self._wire, None
        if wire is not None:
            wire.close(RedisConnectionError("closed"))
