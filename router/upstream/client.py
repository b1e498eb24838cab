"""The router's HTTP client to engines, held together with the lean transport it runs on.

Why hold the transport explicitly: :meth:`Upstream.send` skips httpx's client layer on the hot
path and talks to the transport directly (profiling, docs/benchmarks.md "Router overhead":
re-parsing the URL, copying the cookie jar and extracting cookies per response were ~15% of
the CPU). Knowing which transport serves the engines must not mean asking httpx's private
URL-to-transport routing, so whoever builds the client says so here, once.
"""

from __future__ import annotations

import functools
import http.cookiejar
import logging
from dataclasses import dataclass

import httpx

from router.upstream.pool import UpstreamTransport

_HTTPX_LOG = logging.getLogger("httpx")  # client.send logs each request there; the short cut does too


@dataclass(frozen=True)
class Upstream:
    """``client`` for everything; ``lean`` is the transport ``client`` sends engine traffic through,
    or None to always go through httpx's client layer (a client built some other way)."""

    client: httpx.AsyncClient
    lean: UpstreamTransport | None = None

    @classmethod
    def open(cls, max_connections: int, timeout_s: float) -> Upstream:
        """A client on a fresh UpstreamTransport; close it with :meth:`aclose`."""
        transport = UpstreamTransport(httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))
        client = httpx.AsyncClient(transport=transport, timeout=timeout_s)
        # One client serves every user: a cookie one engine sets must never ride along
        # with someone else's request, so the jar accepts none.
        client.cookies.jar.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        # (httpx ignores proxies from the environment for a client given its transport, so
        # the short cut bypasses nothing the client would do.)
        return cls(client, transport)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(self, url: str, body: bytes, headers: dict[str, str], timeout: httpx.Timeout) -> httpx.Response:
        """POST and return once the status line and headers arrived; the body stays unread.

        As ``client.send(client.build_request(...), stream=True)``, minus httpx's client layer
        when it has nothing to do (no auth, event hooks or cookies)."""
        client, transport = self.client, self.lean
        if (transport is None or client.is_closed or client.auth is not None or client.cookies
                or any(client.event_hooks.values())):
            return await client.send(client.build_request("POST", url, content=body, headers=headers, timeout=timeout),
                                     stream=True)
        merged = client.headers.copy()
        merged.update(headers)
        request = httpx.Request("POST", _url(url), headers=merged, content=body, extensions={"timeout": timeout.as_dict()})
        response = await transport.handle_async_request(request)
        response.request = request
        if "set-cookie" in response.headers:  # as httpx would (the jar of Upstream.open takes none)
            client.cookies.extract_cookies(response)
        _HTTPX_LOG.info('HTTP Request: %s %s "%s %d %s"', request.method, request.url, response.http_version,
                        response.status_code, response.reason_phrase)
        return response


@functools.lru_cache(maxsize=4096)
def _url(url: str) -> httpx.URL:
    """Parsed once per instance and path (httpx URLs are immutable)."""
    return httpx.URL(url)
