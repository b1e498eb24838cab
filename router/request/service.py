"""The request path in one place: read -> parse/hash -> decide -> proxy -> release.

Failures before the first byte move the request elsewhere (bounded): an unreachable or
overloaded (502/503/504) instance is excluded and the decision is taken again; a failed
prefill leg is retried on another prefill instance, then, if configured, prefilled on the
decode instance. Everything after the first byte is relayed as it comes.

The service decides and emits; booking, residency, calibration, metrics and the access log
are hooks on the attempt's lifecycle (router/request/lifecycle.py, hooks.py).
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from router.config.model import RouterConfig
from router.core.errors import (
    InvalidRequest,
    NoCapacity,
    NoRoute,
    PayloadTooLarge,
    RouterError,
    UpstreamFailure,
    UpstreamTimeout,
)
from router.core.instances import Instance, InstancePool
from router.core.metrics import Metrics
from router.request.attempts import AttemptOutcome, Retry, Served, Tried
from router.request.hooks import standard_hooks
from router.request.keys import route_request
from router.request.lifecycle import Abandon, Attempt, Hook, Lifecycle
from router.request.prompt import Endpoint, ParsedRequest, parse_body
from router.request.request_id import assign_request_id
from router.scheduling.calibration import Calibrator
from router.scheduling.prune import Pruner
from router.scheduling.decide import Routed, decide
from router.scheduling.framework import Policy
from router.state.base import StateStore
from router.upstream.client import Upstream
from router.upstream.pd_legs import Legs, PrefillFailed, run_sglang, run_vllm
from router.upstream.relay import RelayResponse, upstream_headers

log = logging.getLogger(__name__)

PATHS: dict[Endpoint, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# An engine answering one of these before any byte is retried elsewhere when it can be; the
# class is what the client gets when it cannot.
RETRY_STATUSES: dict[int, type[RouterError]] = {502: UpstreamFailure, 503: NoCapacity, 504: UpstreamTimeout}


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def request_slo(request: Request, default: float | None) -> float | None:
    raw = request.headers.get("x-ttft-slo-ms")
    if raw is None:
        return default
    try:
        value = float(raw) / 1000
    except ValueError:
        raise InvalidRequest("header x-ttft-slo-ms must be a number of milliseconds", code="invalid_header") from None
    if value <= 0:
        raise InvalidRequest("header x-ttft-slo-ms must be positive", code="invalid_header")
    return value


def transport_failure(instance: str, exc: httpx.TransportError) -> RouterError | None:
    """What the client gets for ``exc`` if no other instance can take over (None: no capacity)."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return None  # never reached the instance: nothing healthy left, not an engine failure
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"instance {instance} did not answer in time")
    return UpstreamFailure(f"instance {instance} failed before answering ({type(exc).__name__})")


class RouterService:
    """Holds the router's collaborators; one per app, passed in rather than global.

    ``hooks`` subscribe to every attempt's lifecycle after the standard ones."""

    def __init__(
        self,
        config: RouterConfig,
        pool: InstancePool,
        store: StateStore,
        policy: Policy,
        upstream: Upstream,
        metrics: Metrics,
        calibrator: Calibrator | None = None,
        rng: random.Random | None = None,
        hooks: Sequence[Hook] = (),
    ) -> None:
        self.config = config
        self.pool = pool
        self.store = store
        self.policy = policy
        self.upstream = upstream
        self.metrics = metrics
        self.calibrator = calibrator or Calibrator(config.calibration)
        self.lifecycle = Lifecycle([*standard_hooks(store, self.calibrator, pool, metrics), *hooks])
        self.rng = rng or random.SystemRandom()
        self.pruner = Pruner(config.policy.candidates, random.Random(config.policy.seed))
        self.background: set[Any] = set()  # prefill legs still finishing after their decode answered
        p = config.proxy
        self.timeout = httpx.Timeout(p.request_timeout_s, connect=p.connect_timeout_s)

    @property
    def client(self) -> httpx.AsyncClient:
        return self.upstream.client

    def candidates(self, model: str, tried: Tried | None = None) -> list[Instance]:
        """The healthy instances that may take a request for ``model``, less what ``tried`` ruled out."""
        tried = tried or Tried()
        roles = ("decode", "mixed") if tried.local_only else ("prefill", "decode", "mixed")
        return self.pool.healthy(roles, exclude=tried.exclude, model=model)

    async def proxy_inference(self, request: Request, endpoint: Endpoint) -> Response:
        try:
            return await self._serve(request, endpoint)
        except RouterError as error:
            self.metrics.rejected.labels(str(error.status)).inc()
            raise

    async def _serve(self, request: Request, endpoint: Endpoint) -> Response:
        raw = await read_body(request, self.config.proxy.max_body_bytes)
        parsed = parse_body(raw, endpoint, self.config.hashing.chars_per_token)
        slo = request_slo(request, self.config.pd.ttft_slo_s)
        request_id = assign_request_id(request.scope)
        req = route_request(parsed, self.config.hashing, uuid.uuid4().hex, self.config.policy.default_max_tokens)
        headers = upstream_headers(request.headers, request_id)
        tried = Tried()
        for _ in range(self.config.proxy.retries + self.config.pd.prefill_retries + 2):
            candidates = self.candidates(parsed.model, tried)
            tried.candidates = sum(1 for c in candidates if c.config.role != "prefill")
            if not tried.candidates:
                break
            try:  # SLORejected (429) goes straight to the client
                routed = await decide(self.store, self.policy, req, [c.candidate for c in candidates], self.metrics, slo,
                                      self.pruner)
            except NoRoute:
                break
            outcome = await self._attempt(routed, endpoint, parsed, raw, headers, request_id, tried)
            if isinstance(outcome, Served):
                return outcome.response
            tried.record(outcome)
        raise tried.give_up(NoCapacity("no healthy instance can take this request"))

    async def _attempt(
        self, routed: Routed, endpoint: Endpoint, parsed: ParsedRequest, raw: bytes, headers: dict[str, str],
        request_id: str, tried: Tried,
    ) -> AttemptOutcome:
        """One attempt on the booked route, from before_send to its answer or abandon."""
        decision = routed.decision
        prefill = None if decision.prefill is None else self.pool.get(decision.prefill)
        attempt = Attempt(request_id, routed, self.pool.get(decision.instance), prefill)
        await self.lifecycle.before_send(attempt)
        try:
            if prefill is None:
                return await self._colocated(attempt, PATHS[endpoint], raw, headers, tried)
            return await self._disaggregated(attempt, PATHS[endpoint], parsed, headers, tried)
        except BaseException as exc:  # a RouterError to answer, or the unforeseen: nothing stays booked
            code = exc.code if isinstance(exc, RouterError) else type(exc).__name__
            await self.lifecycle.abandon(attempt, Abandon("failed", code, (prefill or attempt.instance).id))
            raise

    async def _colocated(self, attempt: Attempt, path: str, raw: bytes, headers: dict[str, str], tried: Tried) -> AttemptOutcome:
        inst = attempt.instance
        try:
            upstream = await self.upstream.send(inst.url + path, raw, headers, self.timeout)
        except httpx.TransportError as exc:
            return await self._unreachable(attempt, inst, exc)
        return await self._respond(upstream, attempt, tried)

    async def _disaggregated(self, attempt: Attempt, path: str, parsed: ParsedRequest, headers: dict[str, str],
                             tried: Tried) -> AttemptOutcome:
        prefill, decode = attempt.prefill, attempt.instance
        assert prefill is not None
        legs = Legs(self.upstream, self.timeout, headers, path, prefill, decode, self.background)
        try:
            if decode.config.flavor == "sglang":
                result = await run_sglang(legs, parsed.body, self.rng)
            else:
                result = await run_vllm(legs, parsed.body, self.config.pd.vllm_min_tokens)
        except PrefillFailed as exc:
            return await self._prefill_failed(attempt, prefill, exc, tried)
        except httpx.TransportError as exc:
            return await self._unreachable(attempt, decode, exc)
        if result.missing_kv_params:
            self.metrics.pd_failures.labels(prefill.id, "no_kv_transfer_params").inc()
        attempt.prefill_s = result.prefill_s
        return await self._respond(result.decode, attempt, tried)

    async def _unreachable(self, attempt: Attempt, inst: Instance, exc: httpx.TransportError) -> Retry:
        self.pool.record_failure(inst.id, fatal=isinstance(exc, httpx.ConnectError))
        reason = type(exc).__name__
        await self.lifecycle.abandon(attempt, Abandon("retry", reason, inst.id))
        return Retry(reason, exclude=inst.id, failure=transport_failure(inst.id, exc))

    async def _prefill_failed(self, attempt: Attempt, prefill: Instance, exc: PrefillFailed, tried: Tried) -> AttemptOutcome:
        if exc.response is not None:  # the engine refused the request itself (4xx): the client's problem
            self.metrics.pd_failures.labels(prefill.id, "passed_to_client").inc()
            await self.lifecycle.abandon(attempt, Abandon("passed", f"http_{exc.response.status_code}", prefill.id))
            return Served(exc.response)
        self.pool.record_failure(prefill.id, fatal=exc.fatal)
        failure = UpstreamFailure(f"prefill failed on {prefill.id}: {exc}", code="prefill_failed")
        local_only = False
        if tried.prefill_failures + 1 <= self.config.pd.prefill_retries:
            action = "retry_other_prefill"
        elif self.config.pd.fallback_local_prefill:
            action, local_only = "prefill_on_decode", True
        else:
            self.metrics.pd_failures.labels(prefill.id, "failed").inc()
            raise failure
        self.metrics.pd_failures.labels(prefill.id, action).inc()
        log.warning("prefill on %s failed (%s): %s", prefill.id, exc, action)
        await self.lifecycle.abandon(attempt, Abandon("retry", "prefill_failed", prefill.id))
        return Retry("prefill_failed", exclude=prefill.id, failure=failure, prefill=True, local_only=local_only)

    async def _respond(self, upstream: httpx.Response, attempt: Attempt, tried: Tried) -> AttemptOutcome:
        inst, status = attempt.instance, upstream.status_code
        if status in RETRY_STATUSES and tried.candidates > 1 and len(tried.exclude) < self.config.proxy.retries:
            await upstream.aclose()
            self.pool.record_failure(inst.id)
            await self.lifecycle.abandon(attempt, Abandon("retry", str(status), inst.id))
            return Retry(str(status), exclude=inst.id, failure=RETRY_STATUSES[status](f"instance {inst.id} answered {status}"))
        if status >= 400:
            return Served(await self._pass_error(upstream, attempt))
        self.pool.record_success(inst.id)
        attempt.streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")
        return Served(RelayResponse(upstream, attempt.request_id, self.lifecycle.observer(attempt)))

    async def _pass_error(self, upstream: httpx.Response, attempt: Attempt) -> Response:
        """Upstream status and error body go back unchanged; nothing stays booked."""
        inst, status = attempt.instance, upstream.status_code
        try:
            body = await upstream.aread()
        except httpx.HTTPError:
            raise UpstreamFailure(f"instance {inst.id} answered {status}, then failed sending the body") from None
        finally:
            await upstream.aclose()
            if status >= 500:
                self.pool.record_failure(inst.id)
        await self.lifecycle.abandon(attempt, Abandon("passed", f"http_{status}", inst.id))
        return Response(body, status_code=status, media_type=upstream.headers.get("content-type", "application/json"))
