"""The request path in one place: read -> parse/hash -> decide -> proxy -> release.

Failures before the first byte move the request elsewhere (bounded): an unreachable or
overloaded (502/503/504) instance is excluded and the decision is taken again; a failed
prefill leg is retried on another prefill instance, then, if configured, prefilled on the
decode instance. Everything after the first byte is relayed as it comes.

The service decides and emits; booking, residency, calibration, metrics and the access log
are hooks on the attempt's lifecycle (router/request/lifecycle.py, hooks.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Sequence
from typing import Any

import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from router.config.model import RouterConfig
from router.core.disconnect import on_disconnect
from router.core.errors import NoCapacity, NoRoute, RouterError, UpstreamFailure, UpstreamTimeout
from router.core.instances import Instance, InstancePool
from router.core.metrics import Metrics
from router.core.shielded import shielded
from router.engines.book import EngineBook
from router.engines.token_ratio import reported_prompt_tokens
from router.request.admission import Admission
from router.request.attempts import AttemptOutcome, Retry, Served, Tried, give_up_when_down, transport_failure
from router.request.continuation import Continuation, continuable
from router.request.hooks import CalibrationHook, TokenRatioHook, standard_hooks
from router.request.inputs import read_body, request_slo
from router.request.keys import route_request
from router.request.lifecycle import Abandon, Attempt, AttemptObserver, Hook, Lifecycle
from router.request.overload import HeldResponse, Overload
from router.request.prompt import Endpoint, ParsedRequest, parse_body
from router.request.request_id import assign_request_id, new_id
from router.request.standby import Standby
from router.request.tokenize import build_tokenizer
from router.scheduling.calibration import Calibrator
from router.scheduling.decide import Routed, decide
from router.scheduling.framework import Policy, RouteRequest
from router.scheduling.prune import Pruner
from router.state.base import StateStore
from router.state.store_tier import build_store_tier
from router.upstream.client import Upstream
from router.upstream.pd_legs import Legs, PrefillFailed, run_sglang, run_vllm
from router.upstream.relay import (RelayResponse, Resumed, WholeAnswer, is_event_stream, raw_chunks, read_raw, returned_headers,
                                   upstream_headers)

log = logging.getLogger(__name__)

PATHS: dict[Endpoint, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# An engine answering one of these before any byte is retried elsewhere when it can be; the
# class is what the client gets when it cannot.
RETRY_STATUSES: dict[int, type[RouterError]] = {502: UpstreamFailure, 503: NoCapacity, 504: UpstreamTimeout}


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
        admission: Admission | None = None,
        forward_authorization: bool = True,
    ) -> None:
        self.config = config
        # False when the router checks API keys itself: a client's key is the router's, never an engine's
        self.forward_authorization = forward_authorization
        self.pool = pool
        self.store = store
        self.policy = policy
        self.upstream = upstream
        self.metrics = metrics
        self.calibrator = calibrator or Calibrator(config.calibration)
        self.rng = rng or random.SystemRandom()
        self.admission = admission or Admission(pool, EngineBook(1.0), config.engines.text_bytes_per_token_max)
        # warms long streams' backup decode instances (kv_store.standby); its hook cancels them with their streams
        self.standby = Standby(config, pool, self.admission, store, upstream, metrics, new_id, self.rng)
        # the calibration hook is also fed by the engine poller (engine-measured prefill rates)
        self.calibration = CalibrationHook(self.calibrator, pool, metrics)
        # the engines' prompt token counts against the router's estimates: capacities in the router's tokens
        self.token_ratio = TokenRatioHook(config, pool, store, self.admission, metrics)
        self.lifecycle = Lifecycle([*standard_hooks(store, self.calibration, pool, metrics, self.token_ratio), self.standby,
                                    *hooks])
        self.pruner = Pruner(config.policy.candidates, random.Random(config.policy.seed))
        # what a KV store the engines share holds (kv_store), None without one
        self.store_tier = build_store_tier(config.kv_store, config.pd.kv_bytes_per_token, config.hashing.block_tokens)
        self.background: set[Any] = set()  # prefill legs still finishing after their decode answered
        self.tokenizer = build_tokenizer(config.hashing, pool, upstream.client)  # token mode only
        p = config.proxy
        self.timeout = httpx.Timeout(p.request_timeout_s, connect=p.connect_timeout_s)  # a JSON answer comes whole
        # A stream's reads are bounded here instead: its first chunk by first_byte_timeout_s (per
        # try, headers included), each later one by idle_timeout_s (router/upstream/relay.py).
        self.overload = Overload(p.max_concurrent, p.max_queued, p.queue_timeout_s, config.health.retry_after_s)
        self.stream_timeout = httpx.Timeout(connect=p.connect_timeout_s, read=None, write=p.request_timeout_s,
                                            pool=p.request_timeout_s)

    def _passive_failure(self, instance: str, *, fatal: bool = False) -> None:
        if self.pool.passive_failure(instance, fatal=fatal):
            self.metrics.ejections.labels(instance).inc()

    @property
    def client(self) -> httpx.AsyncClient:
        return self.upstream.client

    def candidates(self, model: str, tried: Tried | None = None) -> list[Instance]:
        """The healthy instances that may take a request for ``model``, less what ``tried`` ruled out."""
        tried = tried or Tried()
        roles = ("decode", "mixed") if tried.local_only else ("prefill", "decode", "mixed")
        return self.admission.usable(self.pool.healthy(roles, exclude=tried.exclude, model=model), model)

    async def proxy_inference(self, request: Request, endpoint: Endpoint) -> Response:
        try:
            await self.overload.acquire()
        except RouterError as error:
            self.metrics.rejected.labels(str(error.status)).inc()
            raise
        try:
            response = await self._serve(request, endpoint)
        except BaseException as error:
            self.overload.release()
            if isinstance(error, RouterError):
                self.metrics.rejected.labels(str(error.status)).inc()
                raise
            if isinstance(error, ClientDisconnect):  # gone while sending its body: nothing was booked, nobody to answer
                log.info("request %s: client_disconnect while sending its body", assign_request_id(request.scope))
                return Response(status_code=499)
            raise
        return response if self.overload.limit is None else HeldResponse(response, self.overload)

    async def _serve(self, request: Request, endpoint: Endpoint) -> Response:
        raw = await read_body(request, self.config.proxy.max_body_bytes)
        parsed = parse_body(raw, endpoint, self.config.hashing.chars_per_token)
        if parsed.stripped:  # the client's PD control fields never reach an engine
            raw = json.dumps(parsed.body).encode()
        slo = request_slo(request, self.config.pd.ttft_slo_s)
        self.admission.check(parsed)  # unknown model 404, over-long prompt 400: what the engine would answer
        if self.tokenizer is not None:
            parsed = await self.tokenizer.apply(parsed)
            self.admission.check(parsed)  # with the exact token count of the (first) prompt
        request_id = assign_request_id(request.scope)
        req = route_request(parsed, self.config.hashing, new_id(), self.config.policy.default_max_tokens)
        headers = upstream_headers(request.headers, request_id)
        if not self.forward_authorization:
            headers.pop("authorization", None)
        tried = Tried()
        task = asyncio.current_task()
        assert task is not None

        def gone() -> None:  # until the answer starts, a gone client cancels the attempt
            tried.disconnected = True
            task.cancel()

        stop = on_disconnect(request.scope, request.receive, gone)
        try:
            return await self._route(req, endpoint, parsed, raw, headers, request_id, tried, slo)
        except asyncio.CancelledError:
            if not tried.disconnected or task.uncancel() > 0:  # cancelled from outside, not by the watcher
                raise
            log.info("request %s: client_disconnect before the answer: upstream request cancelled", request_id)
            return Response(status_code=499)
        finally:
            stop()

    async def _route(self, req: RouteRequest, endpoint: Endpoint, parsed: ParsedRequest, raw: bytes,
                     headers: dict[str, str], request_id: str, tried: Tried, slo: float | None,
                     continuing: bool = False) -> Response:
        for _ in range(self.config.proxy.retries + self.config.pd.prefill_retries + 2):
            candidates = self.candidates(parsed.model, tried)
            tried.candidates = len(candidates) - sum([c.config.role == "prefill" for c in candidates])
            if not tried.candidates:
                break
            try:  # SLORejected (429) goes straight to the client
                routed = await decide(self.store, self.policy, req, [c.candidate for c in candidates], self.metrics, slo,
                                      self.pruner, self.store_tier)
            except NoRoute:
                break
            outcome = await self._attempt(routed, endpoint, parsed, raw, headers, request_id, tried)
            if isinstance(outcome, Served):
                response = outcome.response
                if (isinstance(response, RelayResponse) and self.config.proxy.continuation_attempts
                        and continuable(parsed.body, endpoint)):
                    if not continuing:
                        response.continue_with(self._continuation(response, endpoint, parsed, headers, request_id, slo))
                    # a continuation is re-armed: a new backup for the prompt plus the text so far
                    d = routed.decision
                    self.standby.start(request_id, self.pool.get(d.instance), parsed, req.keys, req.prompt_tokens,
                                       req.block_tokens, PATHS[endpoint], headers, failed=tried.exclude, rearm=continuing,
                                       prefill=None if d.prefill is None else self.pool.get(d.prefill))
                return response
            tried.record(outcome)
        raise tried.give_up(NoCapacity("no healthy instance can take this request"))

    def _continuation(self, relay: RelayResponse, endpoint: Endpoint, parsed: ParsedRequest, headers: dict[str, str],
                      request_id: str, slo: float | None) -> Continuation:
        """How ``relay``'s stream goes on if its engine breaks mid-way (router/request/continuation.py)."""
        current = relay.detach().observer
        failed: set[str] = set()

        async def send(body: dict[str, Any]) -> Resumed | None:
            nonlocal current
            if isinstance(current, AttemptObserver):
                failed.add(current.attempt.instance.id)
            raw = json.dumps(body).encode()
            again = parse_body(raw, endpoint, self.config.hashing.chars_per_token)
            req = route_request(again, self.config.hashing, new_id(), self.config.policy.default_max_tokens)
            if self.store_tier is not None:  # session migration: the prompt and the tokens so far were written
                self.store_tier.record(req.keys)  # to the store as they were computed, so the next instance loads them
            try:
                response = await self._route(req, endpoint, again, raw, headers, request_id, Tried(exclude=set(failed)),
                                             slo, continuing=True)
            except RouterError as exc:
                log.warning("request %s: no continuation after a mid-stream failure: %s", request_id, exc)
                return None
            if not isinstance(response, RelayResponse):  # an engine's error answer: nothing to go on with
                return None
            resumed = response.detach()
            current = resumed.observer
            log.info("request %s: stream continued on %s", request_id,
                     current.attempt.instance.id if isinstance(current, AttemptObserver) else "?")
            return resumed

        return Continuation(parsed.body, endpoint, self.config.proxy.continuation_attempts, send,
                            lambda result: self.metrics.continuations.labels(result).inc())

    async def _attempt(
        self, routed: Routed, endpoint: Endpoint, parsed: ParsedRequest, raw: bytes, headers: dict[str, str],
        request_id: str, tried: Tried,
    ) -> AttemptOutcome:
        """One attempt on the booked route, from before_send to its answer or abandon."""
        decision = routed.decision
        prefill = None if decision.prefill is None else self.pool.get(decision.prefill)
        attempt = Attempt(request_id, routed, self.pool.get(decision.instance), prefill, model=parsed.model)
        if parsed.tokens is None:  # counted from characters: the engine's count tells how many it really was
            attempt.estimated_prompt_tokens = parsed.prompt_tokens
        await self.lifecycle.before_send(attempt)
        try:
            if prefill is None:
                return await self._colocated(attempt, PATHS[endpoint], raw, headers, tried, parsed.stream)
            return await self._disaggregated(attempt, PATHS[endpoint], parsed, headers, tried)
        except BaseException as exc:  # a RouterError to answer, or the unforeseen: nothing stays booked
            if isinstance(exc, asyncio.CancelledError) and tried.disconnected:
                why = Abandon("client_disconnect", "client_disconnect", attempt.instance.id)
            else:
                code = exc.code if isinstance(exc, RouterError) else type(exc).__name__
                why = Abandon("failed", code, (prefill or attempt.instance).id)
            await self.lifecycle.abandon(attempt, why)
            raise

    async def _colocated(self, attempt: Attempt, path: str, raw: bytes, headers: dict[str, str], tried: Tried,
                         stream: bool) -> AttemptOutcome:
        inst = attempt.instance
        try:
            if stream:  # the first chunk within first_byte_timeout_s (a JSON answer's bound is the client's read timeout)
                async with asyncio.timeout(self.config.proxy.first_byte_timeout_s) as deadline:
                    with give_up_when_down(inst, deadline):
                        upstream = await self.upstream.send(inst.url + path, raw, headers, self.stream_timeout)
                    return await self._respond(upstream, attempt, tried)
            with give_up_when_down(inst):
                upstream = await self.upstream.send(inst.url + path, raw, headers, self.timeout)
            return await self._respond(upstream, attempt, tried)
        except httpx.TransportError as exc:
            return await self._unreachable(attempt, inst, exc)
        except TimeoutError:
            return await self._unreachable(attempt, inst, httpx.ReadTimeout("no first byte within first_byte_timeout_s"))

    async def _disaggregated(self, attempt: Attempt, path: str, parsed: ParsedRequest, headers: dict[str, str],
                             tried: Tried) -> AttemptOutcome:
        prefill, decode = attempt.prefill, attempt.instance
        assert prefill is not None
        booking = attempt.routed.booking
        legs = Legs(self.upstream, self.timeout, headers, path, prefill, decode, self.background,
                    on_prefilled=lambda: self.store.prefill_leg_done(booking))
        try:
            async with asyncio.timeout(self.config.proxy.first_byte_timeout_s if parsed.stream else None) as deadline:
                with give_up_when_down(decode, deadline):
                    if decode.config.flavor == "sglang":
                        result = await run_sglang(legs, parsed.body, self.rng)
                    else:
                        result = await run_vllm(legs, parsed.body, self.config.pd.vllm_min_tokens)
                if result.missing_kv_params:
                    self.metrics.pd_failures.labels(prefill.id, "no_kv_transfer_params").inc()
                attempt.prefill_s = result.prefill_s
                return await self._respond(result.decode, attempt, tried)
        except PrefillFailed as exc:
            return await self._prefill_failed(attempt, prefill, exc, tried)
        except httpx.TransportError as exc:
            return await self._unreachable(attempt, decode, exc)
        except TimeoutError:
            return await self._unreachable(attempt, decode, httpx.ReadTimeout("no first byte within first_byte_timeout_s"))

    async def _unreachable(self, attempt: Attempt, inst: Instance, exc: httpx.TransportError) -> Retry:
        refused = isinstance(exc, httpx.ConnectError)
        self._passive_failure(inst.id, fatal=refused)
        if refused:  # nothing listens there: as definite as a failed check, and only a passing check undoes it
            self.pool.record_failure(inst.id, fatal=True)
        reason = type(exc).__name__
        await self.lifecycle.abandon(attempt, Abandon("retry", reason, inst.id))
        return Retry(reason, exclude=inst.id, failure=transport_failure(inst.id, exc))

    async def _prefill_failed(self, attempt: Attempt, prefill: Instance, exc: PrefillFailed, tried: Tried) -> AttemptOutcome:
        if exc.response is not None:  # the engine refused the request itself (4xx): the client's problem
            self.metrics.pd_failures.labels(prefill.id, "passed_to_client").inc()
            await self.lifecycle.abandon(attempt, Abandon("passed", f"http_{exc.response.status_code}", prefill.id))
            return Served(exc.response)
        self._passive_failure(prefill.id, fatal=exc.fatal)
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
        if 300 <= status < 400:  # an engine never redirects: a misconfigured URL, or not an engine at all
            await upstream.aclose()
            return await self._failed_early(attempt, str(status), UpstreamFailure(f"instance {inst.id} answered a redirect ({status})"))
        if status in RETRY_STATUSES and tried.candidates > 1 and len(tried.exclude) < self.config.proxy.retries:
            await upstream.aclose()
            if status != 503:  # 503 is an engine saying it is busy: no fault of its own
                self._passive_failure(inst.id)
            await self.lifecycle.abandon(attempt, Abandon("retry", str(status), inst.id))
            return Retry(str(status), exclude=inst.id, failure=RETRY_STATUSES[status](f"instance {inst.id} answered {status}"))
        if status >= 400:
            return Served(await self._pass_error(upstream, attempt))
        attempt.streaming = is_event_stream(upstream)
        try:  # until the first chunk (a stream) or the whole body (JSON) is here, another instance can still answer
            if attempt.streaming:
                chunks = raw_chunks(upstream)
                first = await anext(chunks, b"")
            else:
                body = await read_raw(upstream)
        except httpx.HTTPError as exc:
            await upstream.aclose()
            reason = type(exc).__name__
            return await self._failed_early(attempt, reason, UpstreamFailure(
                f"instance {inst.id} failed before its answer was complete ({reason})"))
        except BaseException:
            await upstream.aclose()
            raise
        await self.lifecycle.first_byte(attempt)
        if attempt.streaming:
            return Served(RelayResponse(upstream, attempt.request_id, self.lifecycle.observer(attempt), first, chunks,
                                        self.config.proxy.idle_timeout_s))
        if attempt.estimated_prompt_tokens is not None:
            attempt.reported_prompt_tokens = reported_prompt_tokens(body)
        await shielded(self.lifecycle.end(attempt, "ok"))
        return Served(WholeAnswer(body, status, returned_headers(upstream)))

    async def _failed_early(self, attempt: Attempt, reason: str, failure: RouterError) -> Retry:
        """The instance failed before anything reached the client: it counts against it, the next attempt goes elsewhere."""
        self._passive_failure(attempt.instance.id)
        await self.lifecycle.abandon(attempt, Abandon("retry", reason, attempt.instance.id))
        return Retry(reason, exclude=attempt.instance.id, failure=failure)

    async def _pass_error(self, upstream: httpx.Response, attempt: Attempt) -> Response:
        """Upstream status and error body go back unchanged; nothing stays booked."""
        inst, status = attempt.instance, upstream.status_code
        try:
            body = await upstream.aread()
        except httpx.HTTPError:
            raise UpstreamFailure(f"instance {inst.id} answered {status}, then failed sending the body") from None
        finally:
            await upstream.aclose()
            if status >= 500 and status != 503:
                self._passive_failure(inst.id)
        await self.lifecycle.abandon(attempt, Abandon("passed", f"http_{status}", inst.id))
        return Response(body, status_code=status, media_type=upstream.headers.get("content-type", "application/json"))
