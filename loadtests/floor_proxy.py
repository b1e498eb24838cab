"""The floor of a Python HTTP proxy: what relaying a request costs before any routing.

Why: the hot-path target compares pd-router's CPU per request with Rust routers'. This is
the least a router written on Python's asyncio can spend per request on this machine, so
``cpu_per_request.py --floor`` measures it in the same run: the share of pd-router's cost
that is routing (parsing the body, hashing, deciding, booking, metrics) is its CPU minus
this, and a target below this is out of reach for any Python data path.

What it does, and nothing more: uvloop, httptools (the C parser uvicorn uses) on both
sides, one ``asyncio.Protocol`` per client connection, keep-alive upstream connections
reused from an idle list, backends taken round robin, the request's bytes sent as they
came (head and body), the answer relayed as it arrives (``content-length`` answers whole,
chunked ones chunk by chunk). No JSON, no header rewriting beyond the framing, no metrics,
no timeouts, no error handling beyond closing: not a product, a measuring stick.

    python loadtests/floor_proxy.py --port 0 --backend http://127.0.0.1:P1 --backend http://127.0.0.1:P2
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
from urllib.parse import urlsplit

import httptools


class Upstream(asyncio.Protocol):
    """One keep-alive connection to a backend; relays one answer at a time to ``client``."""

    def __init__(self, pool: list[Upstream]) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.client: Downstream | None = None
        self._chunked = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  (uvloop's TCPTransport is no asyncio.Transport)

    def relay(self, client: Downstream, request: bytes) -> None:
        self.client = client
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._head: list[bytes] = []
        self._chunked = False

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"transfer-encoding" and b"chunked" in value.lower():
            self._chunked = True
        if lower != b"connection":
            self._head.append(name + b": " + value + b"\r\n")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        assert self.client is not None
        self.client.write(b"HTTP/1.1 %d OK\r\n" % status + b"".join(self._head) + b"\r\n")

    def on_body(self, body: bytes) -> None:
        assert self.client is not None
        self.client.write(b"%x\r\n%b\r\n" % (len(body), body) if self._chunked else body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        assert client is not None
        if self._chunked:
            client.write(b"0\r\n\r\n")
        self._pool.append(self)
        client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self._pool:
            self._pool.remove(self)
        if self.client is not None:
            self.client.close()


class Downstream(asyncio.Protocol):
    """One client connection: parse a request, hand its bytes to an upstream, relay back."""

    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._parts: list[bytes] = []
        self._queue: list[bytes] = []
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  (uvloop's TCPTransport is no asyncio.Transport)

    def data_received(self, data: bytes) -> None:
        self._parts.append(data)
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        request, self._parts = b"".join(self._parts), []
        if self._busy:  # pipelined: after the answer in flight
            self._queue.append(request)
        else:
            self._send(request)

    def _send(self, request: bytes) -> None:
        self._busy = True
        pool = self._proxy.idle[next(self._proxy.turn)]
        if pool:
            pool.pop().relay(self, request)
        else:
            asyncio.get_running_loop().create_task(self._proxy.connect(pool, self, request))

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def answered(self) -> None:
        self._busy = False
        if self._queue:
            self._send(self._queue.pop(0))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


class Proxy:
    def __init__(self, backends: list[tuple[str, int]]) -> None:
        self.backends = backends
        self.idle: list[list[Upstream]] = [[] for _ in backends]
        self._where = {id(pool): addr for pool, addr in zip(self.idle, backends)}
        self.turn = itertools.cycle(range(len(backends)))

    async def connect(self, pool: list[Upstream], client: Downstream, request: bytes) -> None:
        host, port = self._where[id(pool)]
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(lambda: Upstream(pool), host, port)
        except OSError:
            client.close()
            return
        up.relay(client, request)


async def serve(port: int, backends: list[str]) -> None:
    addrs = [(u.hostname or "127.0.0.1", u.port or 80) for u in map(urlsplit, backends)]
    proxy = Proxy(addrs)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Downstream(proxy), "127.0.0.1", port)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set_result, None)
    await stop
    server.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--backend", action="append", required=True)
    args = p.parse_args()
    import uvloop

    uvloop.run(serve(args.port, args.backend))


if __name__ == "__main__":
    main()
