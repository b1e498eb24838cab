"""Relaying a request to an engine instance and its answer back to the client.

The response body is streamed chunk by chunk as it arrives (SSE or JSON alike), with
hooks on the first byte (prefill is over) and at the end, whatever the end: complete,
upstream failure, or client disconnect. The end hook runs shielded from cancellation so
booked load is always released.

Why the short cut in :func:`send_upstream` (and router/upstream.py): profiling the router under
load (docs/benchmarks.md, "Router overhead") found httpx's connection pool and client layer, not
routing, holding most of the CPU. Both keep httpx's API, so callers are unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.upstream.pool import UpstreamTransport

log = logging.getLogger(__name__)
_HTTPX_LOG = logging.getLogger("httpx")  # client.send logs each request there; the short cut does too

# Request headers worth passing to an engine; everything else (Host, hop-by-hop,
# Content-Length, cookies) stays at the router.
_FORWARDED = ("authorization", "accept", "user-agent", "openai-organization", "openai-project", "traceparent")
# Response headers passed back to the client (bytes are relayed as they come, so an encoding
# the engine applied anyway must travel with them).
_RETURNED = ("content-type", "content-encoding", "cache-control", "x-request-id", "openai-processing-ms")

Outcome = str  # "ok" | "upstream_error" | "client_disconnect"


def upstream_headers(incoming: Mapping[str, str], request_id: str) -> dict[str, str]:
    headers = {k: incoming[k] for k in _FORWARDED if k in incoming}
    headers["x-request-id"] = request_id
    headers["content-type"] = "application/json"
    # The router relays raw bytes chunk by chunk and reads JSON answers itself (the vLLM
    # prefill leg): ask engines not to compress rather than httpx's default gzip/br offer.
    headers["accept-encoding"] = "identity"
    return headers


def returned_headers(upstream: httpx.Response, request_id: str) -> list[tuple[bytes, bytes]]:
    out = [(k.encode(), upstream.headers[k].encode()) for k in _RETURNED if k in upstream.headers and k != "x-request-id"]
    out.append((b"x-request-id", request_id.encode()))
    return out


async def send_upstream(client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str],
                        timeout: httpx.Timeout) -> httpx.Response:
    """POST and return once the status line and headers arrived; the body stays unread.

    As ``client.send(client.build_request(...), stream=True)``, minus httpx's client layer when it
    has nothing to do (no auth, hooks or cookies) for an instance on UpstreamTransport: re-parsing
    the URL, copying the cookie jar and extracting cookies per response were ~15% of the CPU."""
    target = _url(url)
    route = getattr(client, "_transport_for_url", None)  # honours proxy mounts; absent -> the usual path
    transport = route(target) if route is not None else None
    if (not isinstance(transport, UpstreamTransport) or client.is_closed or client.auth is not None
            or client.cookies or any(client.event_hooks.values())):
        return await client.send(client.build_request("POST", url, content=body, headers=headers, timeout=timeout),
                                 stream=True)
    merged = client.headers.copy()
    merged.update(headers)
    request = httpx.Request("POST", target, headers=merged, content=body, extensions={"timeout": timeout.as_dict()})
    response = await transport.handle_async_request(request)
    response.request = request
    if "set-cookie" in response.headers:
        client.cookies.extract_cookies(response)
    _HTTPX_LOG.info('HTTP Request: %s %s "%s %d %s"', request.method, request.url, response.http_version,
                    response.status_code, response.reason_phrase)
    return response


@functools.lru_cache(maxsize=4096)
def _url(url: str) -> httpx.URL:
    """Parsed once per instance and path (httpx URLs are immutable)."""
    return httpx.URL(url)


class RelayResponse(Response):
    """An ASGI response that streams an upstream httpx response to the client."""

    def __init__(self, upstream: httpx.Response, request_id: str, on_first_byte: Callable[[], Awaitable[None]],
                 on_end: Callable[[Outcome], Awaitable[None]]) -> None:
        self.status_code, self.background = upstream.status_code, None
        self._upstream, self._request_id = upstream, request_id
        self._on_first_byte, self._on_end = on_first_byte, on_end
        self._is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome: Outcome = "client_disconnect"
        task = asyncio.current_task()
        assert task is not None
        disconnected = False

        async def watch_disconnect() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            task.cancel()

        # A bare task + Task.uncancel(): what an anyio task group did here, for less (it was ~8% of the CPU).
        watcher = asyncio.get_running_loop().create_task(watch_disconnect())
        try:
            outcome = await self._relay(send)
        except asyncio.CancelledError:
            if not disconnected or task.uncancel() > 0:  # cancelled from outside, not by the watcher
                raise
        finally:
            watcher.cancel()
            with anyio.CancelScope(shield=True):
                await self._upstream.aclose()
                await self._on_end(outcome)

    async def _relay(self, send: Send) -> Outcome:
        await send({"type": "http.response.start", "status": self._upstream.status_code,
                    "headers": returned_headers(self._upstream, self._request_id)})
        first = True
        # Set by UpstreamTransport: true once the whole body arrived. The last chunk then goes
        # out with the end of the body in one write instead of two (same bytes, one syscall less).
        complete: Callable[[], bool] = self._upstream.extensions.get("pd_router_body_complete", bool)
        chunks: AsyncGenerator[bytes, None] = self._upstream.aiter_raw()  # type: ignore[assignment]
        try:
            async for chunk in chunks:
                if first:
                    first = False
                    await self._on_first_byte()
                if complete():
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    await chunks.aclose()
                    return "ok"
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            log.warning("request %s: upstream failed mid-response: %s", self._request_id, type(exc).__name__)
            if self._is_sse:
                error = {"error": {"message": "upstream instance failed mid-stream", "type": "upstream_error", "code": "upstream_disconnected"}}
                await send({"type": "http.response.body", "body": f"data: {json.dumps(error)}\n\n".encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return "upstream_error"
        if first:
            await self._on_first_byte()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "ok"
