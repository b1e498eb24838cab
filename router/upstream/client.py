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
from dataclasses import dataclass, field

import httpx

from router.upstream.pool import UpstreamBody, UpstreamTransport

_HTTPX_LOG = logging.getLogger("httpx")  # client.send logs each request there; the short cut does too


@dataclass(frozen=True)
class Upstream:
    """``client`` for everything; ``lean`` is the transport ``client`` sends engine traffic through,
    or None to always go through httpx's client layer (a client built some other way)."""

    client: httpx.AsyncClient
    lean: UpstreamTransport | None = None
    heads: _Heads = field(default_factory=lambda: _Heads(), compare=False, repr=False)

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

        As ``client.send(client.build_request(...), stream=True)`` (the client's default headers,
        then ``headers``, Host and Content-Length: the same bytes on the wire), minus httpx's
        client layer and request model when they have nothing to do (no auth, event hooks or
        cookies; a plain ``http://`` URL): the request head is written here from a per-URL
        prefix, which was ~7% of the CPU of a request as httpx objects."""
        client, transport = self.client, self.lean
        target = None if transport is None else _target(url)
        if (target is None or client.is_closed or client.auth is not None or client.cookies
                or any(client.event_hooks.values())):
            return await client.send(client.build_request("POST", url, content=body, headers=headers, timeout=timeout),
                                     stream=True)
        assert transport is not None
        key, line = target
        response = await transport.exchange(key, _head(line, client.headers, headers, len(body), self.heads) + body, timeout.as_dict())
        stream = response.stream
        if stream.set_cookie if isinstance(stream, UpstreamBody) else "set-cookie" in response.headers:
            # as httpx would (the jar of Upstream.open takes none)
            response.request = client.build_request("POST", url, content=body, headers=headers, timeout=timeout)
            client.cookies.extract_cookies(response)
        if _HTTPX_LOG.isEnabledFor(logging.INFO):
            _HTTPX_LOG.info('HTTP Request: POST %s "%s %d %s"', url, response.http_version, response.status_code,
                            response.reason_phrase)
        return response


@functools.lru_cache(maxsize=4096)
def _target(url: str) -> tuple[tuple[str, int], bytes] | None:
    """``(host, port)`` and the request line plus Host header of a plain ``http://`` URL, parsed
    once per instance and path; None for anything else (TLS goes through httpx)."""
    parsed = httpx.URL(url)
    if parsed.scheme != "http" or not parsed.host:
        return None
    return (parsed.host, parsed.port or 80), b"POST " + parsed.raw_path + b" HTTP/1.1\r\nHost: " + parsed.netloc + b"\r\n"


@functools.lru_cache(maxsize=16)
def _defaults(raw: tuple[tuple[bytes, bytes], ...]) -> tuple[tuple[str, bytes], ...]:
    """The client's default header lines, each with its lower-case name (overridden by a request's own)."""
    return tuple((name.decode("latin-1").lower(), name + b": " + value + b"\r\n") for name, value in raw)


class _Heads:
    """The request line, Host and the client's default headers not overridden, per (URL,
    the request's header names): what is the same for every request to one engine path.

    Why: rebuilding it per request (the defaults as a tuple to look up, the overridden
    names as a set, the lines filtered) was ~4 µs of a request's CPU for bytes that only
    change when the client's defaults do; the defaults are compared on each use (a list of
    a few pairs), so a changed default is never sent stale."""

    __slots__ = ("_raw", "_prefixes")
    _CAP = 1024  # (URL, header names) pairs: engines x paths x the few header sets callers send

    def __init__(self) -> None:
        self._raw: list[tuple[bytes, bytes]] = []
        self._prefixes: dict[tuple[bytes, tuple[str, ...]], bytes] = {}

    def prefix(self, line: bytes, defaults: httpx.Headers, names: tuple[str, ...]) -> bytes:
        raw = defaults.raw
        if raw != self._raw:
            self._raw, self._prefixes = raw, {}
        key = (line, names)
        prefix = self._prefixes.get(key)
        if prefix is None:
            if len(self._prefixes) >= self._CAP:
                self._prefixes.clear()
            overridden = {name.lower() for name in names}
            prefix = self._prefixes[key] = line + b"".join(
                [text for lower, text in _defaults(tuple(raw)) if lower not in overridden])
        return prefix


def _head(line: bytes, defaults: httpx.Headers, headers: dict[str, str], length: int, heads: _Heads | None = None) -> bytes:
    own = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if own.count("\n") != len(headers) or own.count("\r") != len(headers):  # a value that would split the head
        raise httpx.LocalProtocolError("illegal header value (CR or LF)")
    try:
        encoded = own.encode("latin-1")
    except UnicodeEncodeError:
        raise httpx.LocalProtocolError("header value outside latin-1") from None
    prefix = (heads or _Heads()).prefix(line, defaults, tuple(headers))
    return b"%b%bContent-Length: %d\r\n\r\n" % (prefix, encoded, length)
