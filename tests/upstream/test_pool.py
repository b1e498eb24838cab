"""The upstream connection pool against raw loopback servers that misbehave on purpose."""

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from router.upstream.pool import UpstreamTransport
from servers import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A TCP server on 127.0.0.1 running ``handler`` per connection; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> str:
        async def on_connect(reader, writer):
            self.connections += 1
            try:
                await self.handler(reader, writer)
            finally:
                writer.close()

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return None
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


def answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def keep_alive(reader, writer):
    while True:
        try:
            if await read_request(reader) is None:
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        writer.write(answer(b'{"ok": true}'))
        await writer.drain()


def client(**limits) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=UpstreamTransport(httpx.Limits(**limits) if limits else None), timeout=2.0)


async def test_keep_alive_reuses_one_connection_and_passes_the_body():
    seen = []

    async def echo(reader, writer):
        while (req := await read_request(reader)) is not None:
            seen.append(req)
            writer.write(answer(b'{"n": %d}' % len(seen)))
            await writer.drain()

    srv = RawServer(echo)
    async with srv as url, client() as c:
        for i in range(3):
            r = await c.post(url + "/v1/completions", content=b'{"x": %d}' % i, headers={"x-request-id": "r"})
            assert r.status_code == 200 and r.json() == {"n": i + 1}
    assert srv.connections == 1
    assert seen[0].startswith(b"POST /v1/completions HTTP/1.1\r\n") and seen[0].endswith(b'{"x": 0}')
    assert b"x-request-id: r" in seen[0].lower()


async def test_connection_refused_is_connect_error():
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await c.post(f"http://127.0.0.1:{free_port()}/v1/completions", content=b"{}")


async def test_peer_closing_mid_body_raises_remote_protocol_error():
    async def truncated(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async with RawServer(truncated) as url, client() as c:
        async with c.stream("POST", url + "/x", content=b"{}") as r:
            assert r.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):
                await r.aread()


async def test_silent_peer_is_a_read_timeout():
    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(2)

    async with RawServer(silent) as url, client() as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(url + "/x", content=b"{}", timeout=httpx.Timeout(5, read=0.2))


async def test_chunked_stream_arrives_incrementally():
    async def chunked(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
        for i in range(3):
            data = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
            await asyncio.sleep(0.15)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with RawServer(chunked) as url, client() as c:
        loop = asyncio.get_running_loop()
        async with c.stream("POST", url + "/x", content=b"{}") as r:
            started, times, body = loop.time(), [], b""
            async for chunk in r.aiter_raw():
                times.append(loop.time() - started)
                body += chunk
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert times[0] < 0.1 and times[-1] > 0.25


async def test_connection_close_and_body_until_eof():
    async def close_delimited(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()

    srv = RawServer(close_delimited)
    async with srv as url, client() as c:
        for _ in range(2):
            r = await c.post(url + "/x", content=b"{}")
            assert r.text == "until the end"
    assert srv.connections == 2  # never reused


async def test_idle_connection_closed_by_peer_is_replaced_transparently():
    async def one_shot(reader, writer):
        await read_request(reader)
        writer.write(answer(b"{}"))
        await writer.drain()  # then the handler returns: the server closes the idle connection

    srv = RawServer(one_shot)
    async with srv as url, client() as c:
        assert (await c.post(url + "/x", content=b"{}")).status_code == 200
        await asyncio.sleep(0.05)
        assert (await c.post(url + "/x", content=b"{}")).status_code == 200
    assert srv.connections == 2


async def test_pool_limit_waits_then_times_out():
    async def slow(reader, writer):
        while await read_request(reader) is not None:
            await asyncio.sleep(0.3)
            writer.write(answer(b"{}"))
            await writer.drain()

    srv = RawServer(slow)
    async with srv as url, client(max_connections=1, max_keepalive_connections=1) as c:
        first, second = await asyncio.gather(c.post(url + "/x", content=b"{}"), c.post(url + "/x", content=b"{}"))
        assert first.status_code == second.status_code == 200 and srv.connections == 1
        with pytest.raises(httpx.PoolTimeout):
            await asyncio.gather(c.post(url + "/x", content=b"{}"),
                                 c.post(url + "/x", content=b"{}", timeout=httpx.Timeout(5, pool=0.05)))


async def test_response_closed_before_its_body_arrived_is_not_reused():
    async def slow_body(reader, writer):
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{\"ok\"")
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.write(b": true}")
            await writer.drain()

    srv = RawServer(slow_body)
    async with srv as url, client() as c:
        async with c.stream("POST", url + "/x", content=b"{}") as r:
            assert r.status_code == 200  # closed with the body still in flight
        assert (await c.post(url + "/x", content=b"{}")).json() == {"ok": True}  # not the old body's tail
    assert srv.connections == 2


async def test_response_closed_after_its_body_arrived_keeps_the_connection():
    srv = RawServer(keep_alive)
    async with srv as url, client() as c:
        async with c.stream("POST", url + "/x", content=b"{}") as r:
            assert r.status_code == 200
            await asyncio.sleep(0.05)  # the whole answer is in, unread
        assert (await c.post(url + "/x", content=b"{}")).json() == {"ok": True}
    assert srv.connections == 1
