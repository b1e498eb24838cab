"""The request path in one place: read -> parse/hash -> decide -> proxy -> release.

Failures before the first byte move the request elsewhere (bounded): an unreachable or
overloaded (502/503/504) instance is excluded and the decision is taken again; a failed
prefill leg is retried on another prefill instance, then, if configured, prefilled on the
decode instance. Everything after the first byte is relayed as it comes.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from router.scheduling.calibration import Calibrator
from router.config.model import RouterConfig
from router.core.errors import RouterError, no_capacity
from router.core.instances import Instance, InstancePool
from router.core.metrics import Metrics
from router.upstream.pd_legs import Legs, PrefillFailed, run_sglang, run_vllm
from router.scheduling.framework import Policy
from router.scheduling.pd import NoRoute
from router.request.prompt import Endpoint, ParsedRequest, parse_body
from router.upstream.relay import Outcome, RelayResponse, send_upstream, upstream_headers
from router.request.keys import route_request
from router.request.tokenize import build_tokenizer
from router.scheduling.decide import Routed, SLORejected, decide
from router.state.base import StateStore

log = logging.getLogger(__name__)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
RETRY_STATUSES = frozenset({502, 503, 504})
PATHS: dict[Endpoint, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


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


def request_slo(request: Request, default: float | None) -> float | None:
    raw = request.headers.get("x-ttft-slo-ms")
    if raw is None:
        return default
    try:
        value = float(raw) / 1000
    except ValueError:
        raise RouterError(400, "header x-ttft-slo-ms must be a number of milliseconds", code="invalid_header") from None
    if value <= 0:
        raise RouterError(400, "header x-ttft-slo-ms must be positive", code="invalid_header")
    return value


@dataclass
class _Attempts:
    """What earlier attempts of one request ruled out."""

    exclude: set[str] = field(default_factory=set)
    candidates: int = 0
    prefill_failures: int = 0
    local_only: bool = False


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
        calibrator: Calibrator | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.store = store
        self.policy = policy
        self.client = client
        self.metrics = metrics
        self.calibrator = calibrator or Calibrator(config.calibration)
        self.rng = rng or random.SystemRandom()
        self.background: set[Any] = set()  # prefill legs still finishing after their decode answered
        self.tokenizer = build_tokenizer(config.hashing, pool, client)  # token mode only
        p = config.proxy
        self.timeout = httpx.Timeout(p.request_timeout_s, connect=p.connect_timeout_s)

    def _reject(self, error: RouterError) -> RouterError:
        self.metrics.rejected.labels(str(error.status)).inc()
        return error

    def candidates(self, model: str, tried: _Attempts) -> list[Instance]:
        roles = ("decode", "mixed") if tried.local_only else ("prefill", "decode", "mixed")
        return self.pool.healthy(roles, exclude=tried.exclude, model=model)

    async def proxy_inference(self, request: Request, endpoint: Endpoint) -> Any:
        try:
            raw = await read_body(request, self.config.proxy.max_body_bytes)
            parsed = parse_body(raw, endpoint, self.config.hashing.chars_per_token)
            slo = request_slo(request, self.config.pd.ttft_slo_s)
        except RouterError as error:
            raise self._reject(error) from None
        incoming = request.headers.get("x-request-id", "")
        request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        if self.tokenizer is not None:
            parsed = await self.tokenizer.apply(parsed)
        req = route_request(parsed, self.config.hashing, uuid.uuid4().hex, self.config.policy.default_max_tokens)
        headers = upstream_headers(request.headers, request_id)
        tried = _Attempts()
        for _ in range(self.config.proxy.retries + self.config.pd.prefill_retries + 2):
            candidates = self.candidates(parsed.model, tried)
            tried.candidates = sum(1 for c in candidates if c.config.role != "prefill")
            if not tried.candidates:
                break
            try:
                routed = await decide(self.store, self.policy, req, [c.candidate for c in candidates], self.metrics, slo)
            except SLORejected as exc:
                retry_after = max(1, round(exc.decision.estimate_s or 1))
                raise self._reject(RouterError(429, str(exc), type="rate_limit_error", code="ttft_slo",
                                               headers={"Retry-After": str(retry_after)})) from None
            except NoRoute as exc:
                if tried.prefill_failures:
                    raise self._reject(RouterError(502, f"prefill failed and {exc}", type="upstream_error",
                                                   code="prefill_failed")) from None
                break
            result = await self._dispatch(routed, endpoint, parsed, raw, headers, request_id, tried)
            if result is not None:
                return result
        raise self._reject(no_capacity("no healthy instance can take this request", self.config.health.retry_after_s))

    async def _dispatch(
        self, routed: Routed, endpoint: Endpoint, parsed: ParsedRequest, raw: bytes, headers: dict[str, str],
        request_id: str, tried: _Attempts,
    ) -> Any | None:
        """One attempt. Returns the response, or None after recording what to avoid next."""
        decode = self.pool.get(routed.decision.instance)
        path = PATHS[endpoint]
        if routed.decision.prefill is None:
            try:
                upstream = await send_upstream(self.client, decode.url + path, raw, headers, self.timeout)
            except httpx.TransportError as exc:
                return await self._unreachable(routed, decode, exc, tried)
            return await self._respond(upstream, routed, decode, request_id, tried)
        prefill = self.pool.get(routed.decision.prefill)
        legs = Legs(self.client, self.timeout, headers, path, prefill, decode, self.background)
        try:
            if decode.config.flavor == "sglang":
                result = await run_sglang(legs, parsed.body, self.rng)
            else:
                result = await run_vllm(legs, parsed.body, self.config.pd.vllm_min_tokens)
        except PrefillFailed as exc:
            return await self._prefill_failed(routed, prefill, exc, tried)
        except httpx.TransportError as exc:
            return await self._unreachable(routed, decode, exc, tried)
        if result.missing_kv_params:
            self.metrics.pd_failures.labels(prefill.id, "no_kv_transfer_params").inc()
        if result.prefill_s is not None:
            self._calibrate(prefill.id, routed, "prefill_leg", result.prefill_s)
        return await self._respond(result.decode, routed, decode, request_id, tried)

    async def _abandon(self, routed: Routed) -> None:
        await self.store.abandon(routed.booking, routed.snapshot.matched)

    async def _unreachable(self, routed: Routed, inst: Instance, exc: Exception, tried: _Attempts) -> None:
        await self._abandon(routed)
        self.pool.record_failure(inst.id, fatal=isinstance(exc, httpx.ConnectError))
        self.metrics.retries.labels(inst.id, type(exc).__name__).inc()
        log.warning("%s unreachable (%s), trying another instance", inst.id, type(exc).__name__)
        tried.exclude.add(inst.id)
        return None

    async def _prefill_failed(self, routed: Routed, prefill: Instance, exc: PrefillFailed, tried: _Attempts) -> Any | None:
        await self._abandon(routed)
        if exc.response is not None:  # the engine refused the request itself (4xx): the client's problem
            self.metrics.pd_failures.labels(prefill.id, "passed_to_client").inc()
            return exc.response
        self.pool.record_failure(prefill.id, fatal=exc.fatal)
        tried.exclude.add(prefill.id)
        tried.prefill_failures += 1
        if tried.prefill_failures <= self.config.pd.prefill_retries:
            action = "retry_other_prefill"
        elif self.config.pd.fallback_local_prefill:
            action, tried.local_only = "prefill_on_decode", True
        else:
            self.metrics.pd_failures.labels(prefill.id, "failed").inc()
            raise RouterError(502, f"prefill failed: {exc}", type="upstream_error", code="prefill_failed")
        self.metrics.pd_failures.labels(prefill.id, action).inc()
        log.warning("prefill on %s failed (%s): %s", prefill.id, exc, action)
        return None

    def _calibrate(self, instance: str, routed: Routed, mode: str, actual_s: float) -> None:
        d = routed.decision
        if mode == "prefill_leg":  # only this reads the cost terms, which are built on first read
            terms = d.terms.get(d.key, {})
            estimate = terms.get("queue_s", 0.0) + terms.get("prefill_s", 0.0)
        else:
            estimate = d.estimate_s or 0.0
        if estimate <= 0:
            return
        self.metrics.estimate_ratio.labels(mode).observe(actual_s / estimate)
        factor = self.calibrator.observe(instance, estimate, actual_s)
        if factor is not None:
            self.pool.calibrate(instance, factor)
            self.metrics.calibration.labels(instance).set(factor)

    async def _respond(self, upstream: httpx.Response, routed: Routed, inst: Instance, request_id: str, tried: _Attempts) -> Any | None:
        status = upstream.status_code
        if status in RETRY_STATUSES and tried.candidates > 1 and len(tried.exclude) < self.config.proxy.retries:
            await upstream.aclose()
            await self._abandon(routed)
            self.pool.record_failure(inst.id)
            self.metrics.retries.labels(inst.id, str(status)).inc()
            tried.exclude.add(inst.id)
            return None
        if status >= 400:
            return await self._pass_error(upstream, inst, routed, request_id)
        self.pool.record_success(inst.id)
        return self._relay(upstream, inst, routed, request_id)

    async def _pass_error(self, upstream: httpx.Response, inst: Instance, routed: Routed, request_id: str) -> Response:
        """Upstream status and error body go back unchanged; nothing stays booked."""
        try:
            body = await upstream.aread()
        except httpx.HTTPError:
            body = json.dumps({"error": {"message": "upstream error", "type": "upstream_error", "code": str(upstream.status_code)}}).encode()
        finally:
            await upstream.aclose()
            await self._abandon(routed)
        if upstream.status_code >= 500:
            self.pool.record_failure(inst.id)
        outcome = f"http_{upstream.status_code}"
        self.metrics.requests.labels(inst.id, outcome).inc()
        self.metrics.latency.labels(inst.id, outcome).observe(time.perf_counter() - routed.started)
        media = upstream.headers.get("content-type", "application/json")
        return Response(body, status_code=upstream.status_code, media_type=media, headers={"x-request-id": request_id})

    def _relay(self, upstream: httpx.Response, inst: Instance, routed: Routed, request_id: str) -> RelayResponse:
        inflight = self.metrics.inflight.labels(inst.id)
        inflight.inc()
        streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")

        async def on_first_byte() -> None:
            elapsed = time.perf_counter() - routed.started
            self.metrics.ttfb.labels(inst.id).observe(elapsed)
            if not streaming:
                return  # a JSON answer's first byte comes with its last: release does it all, one call fewer
            await self.store.prefill_done(routed.booking)
            if routed.decision.mode == "disaggregated":
                if routed.decision.estimate_s:
                    self.metrics.estimate_ratio.labels("disaggregated").observe(elapsed / routed.decision.estimate_s)
            else:
                self._calibrate(inst.id, routed, routed.decision.mode, elapsed)

        async def on_end(outcome: Outcome) -> None:
            inflight.dec()
            self.metrics.requests.labels(inst.id, outcome).inc()
            self.metrics.latency.labels(inst.id, outcome).observe(time.perf_counter() - routed.started)
            await self.store.release(routed.booking)
            log.info("request %s -> %s %s %.3fs", request_id, routed.decision.key, outcome, time.perf_counter() - routed.started)

        return RelayResponse(upstream, request_id, on_first_byte, on_end)
