"""The FastAPI application: routes, lifecycle, error bodies. No module-level state:
everything hangs off the app built by ``create_app``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import http.cookiejar
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.config.model import RouterConfig
from router.core.errors import RouterError, error_body
from router.gateway.explain import explain
from router.core.health import HealthChecker
from router.core.instances import InstancePool
from router.core.metrics import Metrics
from router.kvevents import precise_store
from router.scheduling import build_policy
from router.upstream.pool import UpstreamTransport
from router.request.service import RouterService
from router.state.base import StateStore
from router.state.memory import MemoryStore

log = logging.getLogger(__name__)


def build_store(config: RouterConfig, caps: dict[str, int]) -> StateStore:
    s = config.state
    default_cap = max(caps.values(), default=8192)
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
        )
    return MemoryStore(caps, s.residency_ttl_s, default_cap)


def _store_counters(store: StateStore) -> dict[str, int]:
    return {
        "round_trips": store.round_trips,
        "corrections": getattr(store, "corrections", 0),
        "errors": getattr(store, "errors", 0),
    }


def create_app(config: RouterConfig, store: StateStore | None = None) -> FastAPI:
    pool = InstancePool(config)
    caps = {i.id: config.residency_cap(i.config) for i in pool}
    metrics = Metrics(lambda: _store_counters(store))
    store, kv_ingest = precise_store(config, pool, store or build_store(config, caps), metrics.registry)
    policy = build_policy(config.policy, config.pd if pool.disaggregated else None)
    for instance_id, problem in pool.compat_report().items():
        log.warning("instance %s can never be paired: %s", instance_id, problem)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=config.proxy.max_connections, max_keepalive_connections=config.proxy.max_connections)
        transport = UpstreamTransport(limits)  # httpx's API on a leaner pool: see router/upstream.py
        async with httpx.AsyncClient(transport=transport, timeout=config.proxy.request_timeout_s) as client:
            # One client serves every user: a cookie one engine sets must never ride along
            # with someone else's request, so the jar accepts none.
            client.cookies.jar.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
            await store.start()
            if kv_ingest is not None:
                await kv_ingest.start(client)
            checker = HealthChecker(pool, client, config.health, store.forget_instance)
            await checker.check_all()
            task = asyncio.create_task(checker.run(), name="pd-router-health")
            app.state.service = RouterService(config, pool, store, policy, client, metrics)
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                if kv_ingest is not None:
                    await kv_ingest.close()
                await store.close()

    app = FastAPI(title="pd-router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = config
    app.state.pool = pool
    app.state.store = store
    app.state.kv_events = kv_ingest
    app.state.metrics = metrics

    @app.exception_handler(RouterError)
    async def _router_error(request: Request, exc: RouterError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(message, type=kind, code=str(exc.status_code)), status_code=exc.status_code)

    def service(request: Request) -> RouterService:
        return request.app.state.service

    # The inference routes are plain Starlette routes: they take the raw Request and always
    # return a Response, so FastAPI's per-request dependency solving bought nothing (~4% CPU).
    async def completions(request: Request) -> Response:
        return await service(request).proxy_inference(request, "completions")  # type: ignore[no-any-return]

    async def chat_completions(request: Request) -> Response:
        return await service(request).proxy_inference(request, "chat")  # type: ignore[no-any-return]

    app.add_route("/v1/completions", completions, methods=["POST"], include_in_schema=False)
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"], include_in_schema=False)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        svc = service(request)
        healthy = [i for i in pool if i.healthy]
        if not healthy:
            raise RouterError(503, "no healthy instance", type="service_unavailable", code="no_healthy_instance",
                              headers={"Retry-After": str(config.health.retry_after_s)})

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
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "no healthy instance"}, status_code=503,
                            headers={"Retry-After": str(config.health.retry_after_s)})

    @app.get("/metrics")
    async def prometheus() -> Response:
        for inst in pool:
            metrics.healthy.labels(inst.id).set(1 if inst.healthy else 0)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def require_admin(request: Request) -> None:
        token = config.server.admin_token
        if not token:
            raise RouterError(403, "admin routes are disabled: set server.admin_token", type="permission_error", code="admin_disabled")
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise RouterError(401, "missing or wrong admin bearer token", type="authentication_error", code="unauthorized",
                              headers={"WWW-Authenticate": "Bearer"})

    @app.get("/debug/instances")
    async def debug_instances(request: Request) -> dict[str, Any]:
        require_admin(request)
        ids = [i.id for i in pool]
        snap = await store.snapshot([], ids)
        unpairable = pool.compat_report()
        calibrator = service(request).calibrator
        return {
            "policy": policy.name,
            "disaggregated": pool.disaggregated,
            "state_backend": config.state.backend,
            "instances": [
                {"id": i.id, "url": i.url, "role": i.config.role, "flavor": i.config.flavor, "healthy": i.healthy,
                 "compat": dict(zip(("model", "kv_dtype", "block_size", "flavor"), i.config.compat)),
                 "unpairable": unpairable.get(i.id), "calibration_factor": calibrator.factor(i.id),
                 "prefill_tokens_per_s": i.candidate.prefill_tokens_per_s,
                 "load": dataclasses.asdict(snap.loads[i.id])}
                for i in pool
            ],
        }

    @app.post("/debug/route")
    async def debug_route(request: Request) -> dict[str, Any]:
        """The decision this request would get now, with every cost term; nothing is sent or booked."""
        require_admin(request)
        return await explain(service(request), request)

    return app
