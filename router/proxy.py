"""Relaying a request to an engine instance and its answer back to the client.

The response body is streamed chunk by chunk as it arrives (SSE or JSON alike), with
hooks on the first byte (prefill is over) and at the end, whatever the end: complete,
upstream failure, or client disconnect. The end hook runs shielded from cancellation so
booked load is always released.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)

# Request headers worth passing to an engine; everything else (Host, hop-by-hop,
# Content-Length, cookies) stays at the router.
_FORWARDED = ("authorization", "accept", "user-agent", "openai-organization", "openai-project", "traceparent")
# Response headers passed back to the client.
_RETURNED = ("content-type", "cache-control", "x-request-id", "openai-processing-ms")

Outcome = str  # "ok" | "upstream_error" | "client_disconnect"


def upstream_headers(incoming: Mapping[str, str], request_id: str) -> dict[str, str]:
    headers = {k: incoming[k] for k in _FORWARDED if k in incoming}
    headers["x-request-id"] = request_id
    headers["content-type"] = "application/json"
    return headers


def returned_headers(upstream: httpx.Response, request_id: str) -> list[tuple[bytes, bytes]]:
    out = [(k.encode(), upstream.headers[k].encode()) for k in _RETURNED if k in upstream.headers and k != "x-request-id"]
    out.append((b"x-request-id", request_id.encode()))
    return out


async def send_upstream(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], timeout: httpx.Timeout
) -> httpx.Response:
    """POST and return once the status line and headers arrived; the body stays unread."""
    request = client.build_request("POST", url, content=body, headers=headers, timeout=timeout)
    return await client.send(request, stream=True)


class RelayResponse(Response):
    """An ASGI response that streams an upstream httpx response to the client."""

    def __init__(
        self,
        upstream: httpx.Response,
        request_id: str,
        on_first_byte: Callable[[], Awaitable[None]],
        on_end: Callable[[Outcome], Awaitable[None]],
    ) -> None:
        self.status_code = upstream.status_code
        self.background = None
        self._upstream = upstream
        self._request_id = request_id
        self._on_first_byte = on_first_byte
        self._on_end = on_end
        self._is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome: Outcome = "client_disconnect"
        try:
            async with anyio.create_task_group() as tg:

                async def watch_disconnect() -> None:
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(watch_disconnect)
                outcome = await self._relay(send)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._upstream.aclose()
                await self._on_end(outcome)

    async def _relay(self, send: Send) -> Outcome:
        await send(
            {
                "type": "http.response.start",
                "status": self._upstream.status_code,
                "headers": returned_headers(self._upstream, self._request_id),
            }
        )
        first = True
        try:
            async for chunk in self._upstream.aiter_raw():
                if first:
                    first = False
                    await self._on_first_byte()
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
