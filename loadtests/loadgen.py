"""A small closed-loop HTTP/1.1 load generator on raw asyncio (uvloop + httptools when present).

Why not httpx, aiohttp or Locust: on a 2-core machine the load generator competes with the
router it measures, and a general-purpose client costs 100-300 µs of CPU per request, more
than the routers add. Here each connection is an ``asyncio.Protocol`` writing pre-encoded
requests and parsing answers with the httptools C parser (content-length or chunked), so the
client's share is a few tens of µs per request and equal for every target.

Each of ``concurrency`` connections sends a request, waits for the whole answer, records the
latency and sends the next one (keep-alive; reconnects after an error). Requests that *start*
in the warm-up are not recorded; throughput counts answers completed in the measured window.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httptools


def encode_post(host: str, port: int, path: str, body: dict[str, object]) -> bytes:
    """A complete keep-alive POST with a JSON body, ready to write."""
    data = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"accept: application/json\r\ncontent-length: {len(data)}\r\n\r\n")
    return head.encode() + data


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``waiter`` resolves to the status of the next full answer."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad response: {exc}"))

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"connection lost: {exc}"))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


@dataclass
class LoadResult:
    """Latencies (seconds) of the recorded requests, answers in the window, errors."""

    latencies: list[float] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    window_s: float = 0.0
    error_sample: str = ""

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def rps(self) -> float:
        return self.completed / self.window_s if self.window_s > 0 else 0.0

    def merge(self, other: LoadResult) -> LoadResult:
        """Pool two runs of the same cell (interleaved rounds) into one sample."""
        return LoadResult(self.latencies + other.latencies, self.completed + other.completed,
                          self.errors + other.errors, self.window_s + other.window_s,
                          self.error_sample or other.error_sample)


async def run_load(host: str, port: int, requests: Sequence[bytes], concurrency: int, duration_s: float,
                   warmup_s: float = 1.0, timeout_s: float = 10.0) -> LoadResult:
    """Closed loop: ``concurrency`` connections cycling through ``requests`` for warm-up + duration."""
    loop = asyncio.get_running_loop()
    result = LoadResult()
    start = time.perf_counter()
    record_from, stop_at = start + warmup_s, start + warmup_s + duration_s

    async def connect() -> _Connection:
        _transport, proto = await loop.create_connection(_Connection, host, port)
        return proto

    async def client(offset: int) -> None:
        conn: _Connection | None = None
        i = offset
        while time.perf_counter() < stop_at:
            try:
                if conn is None or conn.transport is None or conn.transport.is_closing():
                    conn = await connect()
                conn.waiter = loop.create_future()
                t0 = time.perf_counter()
                assert conn.transport is not None
                conn.transport.write(requests[i % len(requests)])
                i += 1
                status = await asyncio.wait_for(conn.waiter, timeout_s)
                t1 = time.perf_counter()
            except (TimeoutError, OSError, ConnectionError) as exc:
                result.errors += 1
                result.error_sample = result.error_sample or f"{type(exc).__name__}: {exc}"
                if conn is not None and conn.transport is not None:
                    conn.transport.close()
                conn = None
                await asyncio.sleep(0.01)
                continue
            if status != 200:
                result.errors += 1
                result.error_sample = result.error_sample or f"HTTP {status}"
            if t0 >= record_from:
                result.latencies.append(t1 - t0)
            if record_from <= t1 <= stop_at:
                result.completed += 1
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    await asyncio.gather(*(client(k * 7) for k in range(concurrency)))
    result.window_s = duration_s
    return result


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (cheaper per request), else the default loop."""
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()
