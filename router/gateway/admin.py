"""The admin API: the running config and the instances, read and changed live.

  GET    /admin/config                      running config, secrets masked
  PATCH  /admin/config                      JSON merge patch (RFC 7386) of the config
  GET    /admin/instances                   every known instance, its source and state
  POST   /admin/instances                   add a static instance (an ``instances`` entry)
  DELETE /admin/instances/{id}              remove a static instance
  POST   /admin/instances/{id}/drain        no new requests; those in flight finish
  POST   /admin/instances/{id}/resume       take requests again

Every route needs ``Authorization: Bearer <server.admin_token>``. A change is validated
before anything is touched: a bad one is refused with 422 and the reason, and the running
config stays. Changes apply to the process that answers: with ``serve --workers N`` the
writes are refused (409), since they would reach one worker only; edit the config file
(or ConfigMap), which every worker watches, or send SIGHUP.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from router.config import changes
from router.config.changes import Refused
from router.config.model import ConfigError, InstanceConfig
from router.core.errors import Conflict, InvalidConfig, NotFound, UnsupportedMediaType, bad_request
from router.core.instances import STATIC, Instance
from router.gateway.live import Live

_MERGE_PATCH = ("application/merge-patch+json", "application/json")


def _refused(exc: Exception) -> InvalidConfig:
    code = "config_refused" if isinstance(exc, Refused) else "invalid_config"
    return InvalidConfig(str(exc), code=code)


async def _json_object(request: Request, what: str) -> dict[str, Any]:
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media not in _MERGE_PATCH:
        raise UnsupportedMediaType(f"{what} must be JSON ({' or '.join(_MERGE_PATCH)})", code="unsupported_media_type")
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise bad_request(f"{what} is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"{what} must be a JSON object", code="invalid_json")
    return body


def _describe(inst: Instance, requests: int) -> dict[str, Any]:
    return {"id": inst.id, "url": inst.url, "role": inst.config.role, "flavor": inst.config.flavor,
            "model": inst.config.model, "source": inst.source, "healthy": inst.healthy, "draining": inst.draining,
            "routable": inst.routable, "inflight": requests}


def install_admin(app: FastAPI, require_admin: Callable[[Request], None]) -> None:
    """Add the /admin routes to ``app``; they find the ``Live`` at ``app.state.live``."""

    def live_for(request: Request, write: bool = False) -> Live:
        require_admin(request)
        live: Live = request.app.state.live
        if write and live.options.workers > 1:
            raise Conflict(f"this router runs {live.options.workers} worker processes and an admin change "
                                   "would reach only the one answering: change the config file (ConfigMap) instead, "
                                   "every worker reloads it", code="per_worker_admin")
        return live

    def config_doc(live: Live) -> dict[str, Any]:
        doc: dict[str, Any] = changes.redact(changes.dump(live.config))
        return doc

    async def instances_doc(live: Live) -> dict[str, Any]:
        members = list(live.pool)
        snap = await live.store.snapshot([], [i.id for i in members])
        return {"instances": [_describe(i, snap.loads[i.id].requests) for i in members]}

    @app.get("/admin/config")
    async def get_config(request: Request) -> Response:
        return JSONResponse(config_doc(live_for(request)))

    @app.patch("/admin/config")
    async def patch_config(request: Request) -> Response:
        live = live_for(request, write=True)
        patch = await _json_object(request, "the merge patch")
        try:
            changed = await live.patch(patch, "admin API")
        except (ConfigError, Refused) as exc:
            raise _refused(exc) from None
        return JSONResponse({"changed": changed, "config": config_doc(live)})

    @app.get("/admin/instances")
    async def list_instances(request: Request) -> Response:
        return JSONResponse(await instances_doc(live_for(request)))

    @app.post("/admin/instances")
    async def add_instance(request: Request) -> Response:
        live = live_for(request, write=True)
        body = await _json_object(request, "the instance")
        try:
            new = InstanceConfig.model_validate(body)
        except ValidationError as exc:
            where = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
            raise InvalidConfig(f"invalid instance: {where}", code="invalid_config") from None
        if new.id in live.pool:
            raise Conflict(f"instance {new.id!r} is already known", code="instance_exists")
        await _apply_instances(live, [*live.config.instances, new])
        return JSONResponse(_describe(live.pool.get(new.id), 0), status_code=201)

    def known(live: Live, instance_id: str) -> Instance:
        if instance_id not in live.pool:
            raise NotFound(f"no instance {instance_id!r}", code="unknown_instance")
        return live.pool.get(instance_id)

    @app.delete("/admin/instances/{instance_id:path}")
    async def remove_instance(request: Request, instance_id: str) -> Response:
        live = live_for(request, write=True)
        inst = known(live, instance_id)
        if inst.source != STATIC:
            raise InvalidConfig(f"instance {instance_id!r} was found by {inst.source} discovery and leaves when "
                                   "its pod or record does; drain it to stop sending it requests", code="config_refused")
        await _apply_instances(live, [ic for ic in live.config.instances if ic.id != instance_id])
        return JSONResponse({"removed": instance_id})

    async def set_draining(request: Request, instance_id: str, draining: bool) -> Response:
        live = live_for(request, write=True)
        inst = live.drain(known(live, instance_id).id, draining)
        snap = await live.store.snapshot([], [inst.id])
        return JSONResponse(_describe(inst, snap.loads[inst.id].requests))

    @app.post("/admin/instances/{instance_id:path}/drain")
    async def drain(request: Request, instance_id: str) -> Response:
        return await set_draining(request, instance_id, True)

    @app.post("/admin/instances/{instance_id:path}/resume")
    async def resume(request: Request, instance_id: str) -> Response:
        return await set_draining(request, instance_id, False)


async def _apply_instances(live: Live, instances: list[InstanceConfig]) -> None:
    try:
        new = changes.validate({**changes.dump(live.config), "instances": [ic.model_dump(mode="json") for ic in instances]})
        await live.apply(new, "admin API")
    except (ConfigError, Refused) as exc:
        raise _refused(exc) from None
