"""Upstream: the short cut to the lean transport, and when it must not be taken."""

import asyncio

import httpx

from router.upstream.client import Upstream
from router.upstream.pool import UpstreamBody

TIMEOUT = httpx.Timeout(2.0)


class Recorder:
    """A loopback HTTP/1.1 server: records each request head, answers ``chunks`` (chunked),
    ``gap_s`` apart."""

    def __init__(self, chunks=(b'{"ok": true}',), gap_s: float = 0.0) -> None:
        self.chunks, self.gap_s, self.heads = chunks, gap_s, []
        self.server = None

    async def __aenter__(self) -> str:
        async def on_connect(reader, writer):
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    self.heads.append(head)
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), 0)
                    await reader.readexactly(length)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for i, chunk in enumerate(self.chunks):
                        if i:
                            await asyncio.sleep(self.gap_s)
                        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()


async def test_send_takes_the_lean_transport_and_its_body_says_when_it_is_complete():
    upstream = Upstream.open(max_connections=4, timeout_s=2.0)
    assert upstream.lean is not None
    try:
        async with Recorder(chunks=(b"a", b"b"), gap_s=0.2) as url:
            response = await upstream.send(url + "/v1/completions", b"{}", {"x-request-id": "r1"}, TIMEOUT)
            body = response.stream
            assert isinstance(body, UpstreamBody) and not body.complete
            seen = []
            async for chunk in response.aiter_raw():
                seen.append((chunk, body.complete))
            await response.aclose()
    finally:
        await upstream.aclose()
    assert seen == [(b"a", False), (b"b", True)]  # complete exactly once the last chunk is handed out


async def test_a_client_with_event_hooks_keeps_httpxs_path():
    upstream = Upstream.open(max_connections=4, timeout_s=2.0)
    seen = []

    async def hook(request: httpx.Request) -> None:
        seen.append(str(request.url))

    upstream.client.event_hooks["request"] = [hook]
    try:
        async with Recorder() as url:
            response = await upstream.send(url + "/x", b"{}", {}, TIMEOUT)
            await response.aread()
            await response.aclose()
    finally:
        await upstream.aclose()
    assert seen == [url + "/x"]


async def test_without_a_lean_transport_requests_go_through_the_client():
    async with httpx.AsyncClient(timeout=2.0) as client, Recorder() as url:
        response = await Upstream(client).send(url + "/x", b"{}", {"x-request-id": "r2"}, TIMEOUT)
        assert not isinstance(response.stream, UpstreamBody)
        assert await response.aread() == b'{"ok": true}'
        await response.aclose()


async def test_the_short_cut_writes_the_request_httpxs_client_layer_would():
    headers = {"x-request-id": "r3", "content-type": "application/json", "accept-encoding": "identity",
               "user-agent": "client/1.0", "traceparent": "00-ab-cd-01"}
    upstream = Upstream.open(max_connections=4, timeout_s=2.0)
    recorder = Recorder()
    try:
        async with recorder as url:
            target = url + "/v1/completions?a=1"
            for response in (await upstream.send(target, b'{"p": 1}', headers, TIMEOUT),
                             await upstream.client.send(upstream.client.build_request(
                                 "POST", target, content=b'{"p": 1}', headers=headers), stream=True)):
                await response.aread()
                await response.aclose()
    finally:
        await upstream.aclose()
    lean, reference = (head.rstrip(b"\r\n").split(b"\r\n") for head in recorder.heads)
    assert lean[0] == reference[0] == b"POST /v1/completions?a=1 HTTP/1.1"
    assert sorted(h.lower() for h in lean[1:]) == sorted(h.lower() for h in reference[1:])
    assert {b"content-length: 8", b"user-agent: client/1.0"} <= {h.lower() for h in lean}


async def test_a_header_value_that_would_split_the_head_is_refused_before_sending():
    upstream = Upstream.open(max_connections=4, timeout_s=2.0)
    try:
        async with Recorder() as url:
            for bad in ("a\r\nx-evil: 1", "a\nb", "caf\u20ac"):
                try:
                    await upstream.send(url + "/x", b"{}", {"x-request-id": bad}, TIMEOUT)
                except httpx.LocalProtocolError:
                    continue
                raise AssertionError(f"sent {bad!r}")
    finally:
        await upstream.aclose()


async def test_the_cached_head_follows_the_clients_default_headers_and_the_requests_own():
    upstream = Upstream.open(max_connections=4, timeout_s=2.0)
    recorder = Recorder()
    try:
        async with recorder as url:
            for headers in ({"x-request-id": "a"}, {"x-request-id": "b", "user-agent": "mine/1"}):
                for _ in range(2):  # the second of each is built from the cached prefix
                    response = await upstream.send(url + "/v1/completions", b"{}", headers, TIMEOUT)
                    await response.aread()
                    await response.aclose()
            upstream.client.headers["x-tenant"] = "t1"  # a default changed after the cache was filled
            response = await upstream.send(url + "/v1/completions", b"{}", {"x-request-id": "c"}, TIMEOUT)
            await response.aread()
            await response.aclose()
    finally:
        await upstream.aclose()
    heads = [{line.lower() for line in head.split(b"\r\n")} for head in recorder.heads]
    assert all(b"x-tenant: t1" not in h for h in heads[:4]) and b"x-tenant: t1" in heads[4]
    assert [sum(line.startswith(b"user-agent:") for line in h) for h in heads] == [1, 1, 1, 1, 1]  # overridden, not doubled
    assert b"user-agent: mine/1" in heads[2] and b"user-agent: mine/1" in heads[3]
    assert b"user-agent: mine/1" not in heads[4] and b"x-request-id: c" in heads[4]


async def test_the_lean_response_has_httpxs_headers_once_asked_for():
    upstream = Upstream.open(max_connections=4, timeout_s=2.0)
    try:
        async with Recorder() as url:
            response = await upstream.send(url + "/x", b"{}", {}, TIMEOUT)
            assert isinstance(response, httpx.Response)
            assert response.headers["content-type"] == "application/json"  # built on first look, case-insensitive
            assert response.headers is response.headers
            assert response.reason_phrase == "OK" and response.http_version == "HTTP/1.1"
            assert response.json() if await response.aread() else False
            response.headers = {"x-new": "1"}
            assert dict(response.headers) == {"x-new": "1"}
            await response.aclose()
            assert response.is_closed
    finally:
        await upstream.aclose()
