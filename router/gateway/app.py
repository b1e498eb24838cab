"""The FastAPI application: routes and lifespan (error answers: errors.py). No module-level
state: everything hangs off the app built by ``create_app``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from router.config.model import RouterConfig
from router.core.errors import Forbidden, NoCapacity, Unauthorized
from router.gateway.admin import install_admin
from router.gateway.auth import ApiKeys, load_keys
from router.gateway.openapi import install_openapi
from router.gateway.live import Live, LiveOptions
from router.core.health import HealthChecker
from router.core.instances import InstancePool
from router.core.metrics import Metrics
from router.engines.book import EngineBook
from router.engines.exported import EngineCollector
from router.engines.external import ExternalLoadPolicy
from router.engines.poller import EnginePoller
from router.engines.prefill_rate import PrefillSample
from router.gateway.errors import install_error_handlers
from router.gateway.fastpath import RouterApp
from router.gateway.explain import explain
from router.request.admission import Admission
from router.request.lifecycle import Hook
from router.kvevents import precise_store
from router.kvevents.describe import describe as describe_kv_events
from router.request.service import RouterService
from router.scheduling import Policy, build_policy
from router.state.base import StateStore
from router.state.memory import MemoryStore
from router.upstream.client import Upstream

log = logging.getLogger(__name__)


def build_store(config: RouterConfig, caps: dict[str, int]) -> StateStore:
    s = config.state
    default_cap = max(caps.values(), default=8192)
    w = config.policy.ttft  # a request in flight weighs its decode interference, in prefill tokens (load_index.py)
    request_tokens = w.decode_interference_s * w.prefill_tokens_per_s
    if s.backend == "redis":
        from router.state.redis_store import RedisStore

        return RedisStore(
            s.redis_url,
            caps,
            key_prefix=s.key_prefix,
            lease_s=s.lease_s,
            residency_ttl_s=s.residency_ttl_s,
            default_cap=default_cap,
            timeout_s=s.redis_timeout_s,
            breaker_failures=s.breaker_failures,
            breaker_probe_s=s.breaker_probe_s,
            cluster=s.sharding.cluster,
            residency_shards=s.sharding.residency_shards,
            instance_shards=s.sharding.instance_shards,
            request_tokens=request_tokens,
        )
    return MemoryStore(caps, s.residency_ttl_s, default_cap, request_tokens=request_tokens)


def _store_counters(store: StateStore) -> dict[str, int]:
    return {
        "round_trips": store.round_trips,
        "corrections": getattr(store, "corrections", 0),
        "revisions": getattr(store, "revisions", 0),
        "errors": getattr(store, "errors", 0),
        "degraded": int(getattr(store, "degraded", False)),
    }


def create_app(config: RouterConfig, store: StateStore | None = None, hooks: Sequence[Hook] = (),
               live: LiveOptions | None = None) -> RouterApp:
    """The router app. ``hooks`` subscribe to every attempt's lifecycle (router/request/lifecycle.py)
    after the standard ones: booking, calibration, metrics, access log. ``live`` says where the
    config comes from, for reloads (router/gateway/live.py)."""
    pool = InstancePool(config)
    caps = {i.id: config.residency_cap(i.config) for i in pool}
    base_store = store or build_store(config, caps)
    metrics = Metrics(lambda: _store_counters(base_store))
    store, kv_ingest = precise_store(config, pool, base_store, metrics.registry,
                                     may_bind=(live or LiveOptions()).workers <= 1)
    book = EngineBook(config.engines.stale_after_s or 0.0)  # what the engines report, read by the request path

    def make_policy(cfg: RouterConfig, disaggregated: bool) -> Policy:
        """The policy for ``cfg``, seeing booked plus engine-reported load (rebuilt live on changes)."""
        return ExternalLoadPolicy(build_policy(cfg.policy, cfg.pd if disaggregated else None), book.external_loads)

    policy = make_policy(config, pool.disaggregated)
    metrics.registry.register(EngineCollector(book))
    api_keys = ApiKeys(load_keys(config))  # ConfigError for a bad key file (serve checks it first: exit 2)
    for instance_id, problem in pool.compat_report().items():
        log.warning("instance %s can never be paired: %s", instance_id, problem)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # httpx's API on a leaner pool (router/upstream/pool.py), held with its client
        upstream = Upstream.open(config.proxy.max_connections, config.proxy.request_timeout_s)
        try:
            await store.start()
            if kv_ingest is not None:
                await kv_ingest.start(upstream.client)
            poller = EnginePoller(config, pool, store, upstream.client, book)

            async def recovered(instance_id: str) -> None:
                await store.forget_instance(instance_id)
                if config.engines.poll:
                    await poller.on_recovered(instance_id)

            checker = HealthChecker(pool, upstream.client, config.health, recovered)
            await checker.check_all()
            tasks = [asyncio.create_task(checker.run(), name="pd-router-health")]
            if config.engines.poll:
                await poller.start()
                tasks.append(asyncio.create_task(poller.run(), name="pd-router-engines"))
            admission = Admission(pool, book, config.engines.text_bytes_per_token_max)
            app.state.service = RouterService(config, pool, store, policy, upstream, metrics, hooks=hooks,
                                              admission=admission, forward_authorization=not api_keys.enabled)
            service = app.state.service

            def engine_prefill(instance_id: str, sample: PrefillSample) -> None:  # engine-measured rates -> calibration
                current = service.config
                service.calibration.observe_engine(instance_id, sample, current.policy.ttft, current.engines.calibration)
            poller.on_prefill = engine_prefill
            poller.on_reading = service.token_ratio.scraped  # streams without usage teach the token ratio
            app.state.live = Live(config, pool, store, checker, app.state.service, metrics, live or LiveOptions(),
                                  make_policy=make_policy)
            await app.state.live.start()
            try:
                yield
            finally:
                await app.state.live.stop()
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                if kv_ingest is not None:
                    await kv_ingest.close()
                await store.close()
        finally:
            await upstream.aclose()

    app = RouterApp(title="pd-router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = config
    app.state.pool = pool
    app.state.store = store
    app.state.kv_events = kv_ingest
    app.state.metrics = metrics
    app.state.engines = book

    install_error_handlers(app, config.health.retry_after_s)

    def service(request: Request) -> RouterService:
        svc: RouterService = request.app.state.service
        return svc

    # The inference routes are plain Starlette routes: they take the raw Request and always
    # return a Response, so FastAPI's per-request dependency solving bought nothing (~4% CPU).
    def authorize(request: Request) -> None:
        name = api_keys.check(request)
        if name is not None:
            metrics.api_key_requests.labels(name).inc()

    async def completions(request: Request) -> Response:
        authorize(request)
        return await service(request).proxy_inference(request, "completions")

    async def chat_completions(request: Request) -> Response:
        authorize(request)
        return await service(request).proxy_inference(request, "chat")

    app.add_route("/v1/completions", completions, methods=["POST"], include_in_schema=False)
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"], include_in_schema=False)
    # ... and served by a bare ASGI front (fastpath.py) while no other middleware is installed
    app.fast_routes = {"/v1/completions": completions, "/v1/chat/completions": chat_completions}
    app.retry_after_s = config.health.retry_after_s

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        authorize(request)
        svc = service(request)
        healthy = [i for i in pool if i.healthy]
        if not healthy:
            raise NoCapacity("no healthy instance")

        async def fetch(url: str) -> list[dict[str, Any]]:
            try:
                resp = await svc.client.get(f"{url}/v1/models", timeout=config.health.timeout_s)
                data = resp.json().get("data", []) if resp.status_code == 200 else []
                return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
            except (httpx.HTTPError, ValueError, AttributeError):
                return []

        merged: dict[str, dict[str, Any]] = {}
        for listing in await asyncio.gather(*(fetch(i.url) for i in healthy)):
            for model in listing:
                merged.setdefault(model["id"], model)
        return JSONResponse({"object": "list", "data": list(merged.values())})

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        if pool.any_healthy():
            if getattr(store, "degraded", False):  # still serving: routing on this replica's view alone
                return JSONResponse({"status": "ready", "details": {"state_store": "degraded"}})
            return JSONResponse({"status": "ready"})
        raise NoCapacity("no instance can take requests yet" if len(pool) == 0 else "no healthy instance")

    @app.get("/metrics")
    async def prometheus() -> Response:
        for inst in pool:
            metrics.healthy.labels(inst.id).set(1 if inst.healthy else 0)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def require_admin(request: Request) -> None:
        token = config.server.admin_token
        if not token:
            raise Forbidden("admin routes are disabled: set server.admin_token", code="admin_disabled")
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise Unauthorized("missing or wrong admin bearer token")

    @app.get("/debug/instances")
    async def debug_instances(request: Request) -> dict[str, Any]:
        require_admin(request)
        ids = [i.id for i in pool]
        snap = await store.snapshot([], ids)
        unpairable = pool.compat_report()
        return {
            "policy": service(request).policy.name,
            "disaggregated": pool.disaggregated,
            "state_backend": config.state.backend,
            "instances": [
                {"id": i.id, "url": i.url, "role": i.config.role, "flavor": i.config.flavor, "healthy": i.healthy,
                 "compat": dict(zip(("model", "kv_dtype", "block_size", "flavor"), i.config.compat)),
                 "unpairable": unpairable.get(i.id), "calibration_factor": i.factor,
                 "prefill_tokens_per_s": i.candidate.prefill_tokens_per_s,
                 # the cache in the router's estimated tokens, with the engine's tokens per estimated token
                 "cache_tokens": i.candidate.cache_tokens, "token_ratio": i.token_ratio,
                 "decode_step_s": i.candidate.decode_step_s,  # None: the policy's configured step
                 "decode_step_batch": i.candidate.decode_step_batch,  # ... and the batch it was measured at
                 "load": dataclasses.asdict(snap.loads[i.id]), "engine": book.describe(i.id)}
                for i in pool
            ],
        }

    @app.get("/debug/kv_events")
    async def debug_kv_events(request: Request) -> dict[str, Any]:
        """Each KV-event source: in sync or not, the last sequence applied, what its events did."""
        require_admin(request)
        if kv_ingest is None:
            return {"enabled": False, "sources": [], "instances": {}}
        return {"enabled": True, **describe_kv_events(kv_ingest)}

    install_admin(app, require_admin)
    install_openapi(app)

    @app.post("/debug/route")
    async def debug_route(request: Request) -> dict[str, Any]:
        """The decision this request would get now, with every cost term; nothing is sent or booked."""
        require_admin(request)
        return await explain(service(request), request)

    return app
