"""The request path in one place: read -> parse/hash -> decide -> proxy -> release."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from router.config import RouterConfig
from router.errors import RouterError, no_capacity
from router.instances import Instance, InstancePool
from router.metrics import Metrics
from router.policy.base import Policy
from router.prompt import Endpoint, parse_body
from router.proxy import Outcome, RelayResponse, send_upstream, upstream_headers
from router.routing import Routed, decide, route_request
from router.state.base import StateStore

log = logging.getLogger(__name__)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_RETRY_STATUSES = frozenset({502, 503, 504})
_PATHS: dict[Endpoint, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


async def read_body(request: Request, limit: int) -> bytes:
    too_large = RouterError(413, f"request body exceeds {limit} bytes", code="body_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


class RouterService:
    """Holds the router's collaborators; one per app, passed in rather than global."""

    def __init__(
        self,
        config: RouterConfig,
        pool: InstancePool,
        store: StateStore,
        policy: Policy,
        client: httpx.AsyncClient,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.pool = pool
        self.store = store
        self.policy = policy
        self.client = client
        self.metrics = metrics
        p = config.proxy
        self._timeout = httpx.Timeout(p.request_timeout_s, connect=p.connect_timeout_s)

    def _reject(self, error: RouterError) -> RouterError:
        self.metrics.rejected.labels(str(error.status)).inc()
        return error

    async def proxy_inference(self, request: Request, endpoint: Endpoint) -> Any:
        try:
            raw = await read_body(request, self.config.proxy.max_body_bytes)
            parsed = parse_body(raw, endpoint, self.config.hashing.chars_per_token)
        except RouterError as error:
            raise self._reject(error) from None
        incoming = request.headers.get("x-request-id", "")
        request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        req = route_request(parsed, self.config.hashing, uuid.uuid4().hex, self.config.policy.default_max_tokens)
        headers = upstream_headers(request.headers, request_id)
        tried: set[str] = set()
        attempts = self.config.proxy.retries + 1
        for attempt in range(attempts):
            candidates = self.pool.healthy(("mixed",), exclude=tried)
            if not candidates:
                break
            routed = await decide(self.store, self.policy, req, [c.candidate for c in candidates], self.metrics)
            inst = self.pool.get(routed.booking.instance)
            started = time.perf_counter()
            try:
                upstream = await send_upstream(self.client, inst.url + _PATHS[endpoint], raw, headers, self._timeout)
            except httpx.TransportError as exc:
                await self.store.release(routed.booking)
                self.pool.record_failure(inst.id, fatal=isinstance(exc, httpx.ConnectError))
                self.metrics.retries.labels(inst.id, type(exc).__name__).inc()
                log.warning("request %s: %s unreachable (%s), trying another", request_id, inst.id, type(exc).__name__)
                tried.add(inst.id)
                continue
            status = upstream.status_code
            if status in _RETRY_STATUSES and attempt + 1 < attempts and len(candidates) > 1:
                await upstream.aclose()
                await self.store.release(routed.booking)
                self.pool.record_failure(inst.id)
                self.metrics.retries.labels(inst.id, str(status)).inc()
                tried.add(inst.id)
                continue
            if status >= 400:
                return await self._pass_error(upstream, inst, routed, request_id, started)
            self.pool.record_success(inst.id)
            return self._relay(upstream, inst, routed, request_id, started)
        raise self._reject(no_capacity("no healthy instance can take this request", self.config.health.retry_after_s))

    async def _pass_error(
        self, upstream: httpx.Response, inst: Instance, routed: Routed, request_id: str, started: float
    ) -> Response:
        """Upstream status and error body go back unchanged; nothing stays booked."""
        try:
            body = await upstream.aread()
        except httpx.HTTPError:
            body = b""
        finally:
            await upstream.aclose()
            await self.store.release(routed.booking)
        if upstream.status_code >= 500:
            self.pool.record_failure(inst.id)
        outcome = f"http_{upstream.status_code}"
        self.metrics.requests.labels(inst.id, outcome).inc()
        self.metrics.latency.labels(inst.id, outcome).observe(time.perf_counter() - started)
        media = upstream.headers.get("content-type", "application/json")
        return Response(body, status_code=upstream.status_code, media_type=media, headers={"x-request-id": request_id})

    def _relay(self, upstream: httpx.Response, inst: Instance, routed: Routed, request_id: str, started: float) -> RelayResponse:
        inflight = self.metrics.inflight.labels(inst.id)
        inflight.inc()

        async def on_first_byte() -> None:
            self.metrics.ttfb.labels(inst.id).observe(time.perf_counter() - started)
            await self.store.prefill_done(routed.booking)

        async def on_end(outcome: Outcome) -> None:
            inflight.dec()
            self.metrics.requests.labels(inst.id, outcome).inc()
            self.metrics.latency.labels(inst.id, outcome).observe(time.perf_counter() - started)
            await self.store.release(routed.booking)
            log.info("request %s -> %s %s %.3fs", request_id, inst.id, outcome, time.perf_counter() - started)

        return RelayResponse(upstream, request_id, on_first_byte, on_end)
