"""One request/response cycle of the router's server protocol, with fewer writes than uvicorn's.

Why: uvicorn's cycle writes a response's head and its body with two ``transport.write``
calls — two loopback ``send`` syscalls, the most expensive frames of a small answer (the
"socket writes" share of the profile in docs/benchmarks.md). This cycle holds the head
until the first body message and writes both at once (a streamed answer's first chunk goes
with its headers; the head is still flushed by itself on the next loop pass if an app
suspends between the two). And a response whose whole body is known can be written with
one call, :meth:`FastCycle.write_whole`, that the router's fast path
(router/gateway/fastpath.py) finds in the scope under :data:`WHOLE_KEY`: no ASGI message
dicts, no ``send`` wrappers. Header validation, keep-alive, ``connection: close``,
Content-Length accounting and flow control are uvicorn's rules, kept as they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

WHOLE_KEY = "pd_router.write_whole"  # an ASGI scope extension key: await scope[WHOLE_KEY](status, headers, body)


class FastCycle(RequestResponseCycle):
    """uvicorn's cycle with the head written together with the body."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head: bytes | None = None  # encoded, not yet written
        self.scope[WHOLE_KEY] = self.write_whole  # type: ignore[literal-required]

    def _encode_head(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        self.response_started = True
        self.waiting_for_100_continue = False
        if self.access_log:
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(self.scope), self.scope["method"],
                                    get_path_with_query_string(self.scope), self.scope["http_version"], status)
        content = [STATUS_LINE[status]]
        closing = False
        pairs = (*self.default_headers, *headers)
        # uvicorn's two checks per header, each over all names and all values at once: a
        # character the patterns refuse is in the joined bytes exactly when it is in one of them
        if HEADER_RE.search(b"".join([name for name, _ in pairs])):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"".join([value for _, value in pairs])):
            raise RuntimeError("Invalid HTTP header value.")
        for name, value in pairs:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                self.keep_alive = False
                closing = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not closing:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _flush_head(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self.disconnected:
            self.transport.write(head)

    def _write_body(self, body: bytes, more_body: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            data = b""
        elif self.chunked_encoding:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more_body:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            data = body
        head, self._head = self._head, None
        if head is not None:
            data = head + data
        if data:
            self.transport.write(data)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            # scope -> bound method -> cycle -> scope is a reference cycle: left to the GC otherwise
            self.scope.pop(WHOLE_KEY, None)  # type: ignore[misc]
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self._head = self._encode_head(message["status"], message.get("headers", ()))
            asyncio.get_running_loop().call_soon(self._flush_head)  # if the body does not follow at once
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            self._write_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")

    async def write_whole(self, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole answer — status, headers (with its content-length), body — in one write."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if self.response_started:
            raise RuntimeError("write_whole after the response started")
        self._head = self._encode_head(status, headers)
        self._write_body(body, False)
