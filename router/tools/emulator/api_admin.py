"""Emulator-only endpoints: exact stats, fault control, KV pull, cache reset.

Why separate from the engine APIs: these are the emulator's own contract
with tests, the demo and PD peers, and must not be mistaken for (or shadow)
real vLLM/SGLang routes, hence the ``/emulator`` prefix. The cache-reset
aliases match the real engines' admin routes.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.tools.emulator.openai_schema import ApiError, bad_request
from router.tools.emulator.pd_vllm import PULL_PATH, pull_response
from router.tools.emulator.runtime import EmulatorRuntime


def _runtime(request: Request) -> EmulatorRuntime:
    runtime: EmulatorRuntime = request.app.state.runtime
    return runtime


async def _json_object(request: Request) -> dict[str, object]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise bad_request("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


async def stats(request: Request) -> Response:
    """Exact counters; ``?recent=N`` sets how many finished requests to list."""
    try:
        recent = int(request.query_params.get("recent", "100"))
    except ValueError:
        return bad_request("recent must be an integer", "recent").response()
    return JSONResponse(_runtime(request).snapshot(recent))


async def faults(request: Request) -> Response:
    """GET: current faults. POST: partial update (``{"reset": true}`` clears)."""
    rt = _runtime(request)
    if request.method == "POST":
        try:
            body = await _json_object(request)
            if body.pop("reset", False):
                rt.faults.reset()
            if body:
                rt.faults.update(body)
        except ApiError as exc:
            return exc.response()
        except ValueError as exc:
            return bad_request(str(exc)).response()
    return JSONResponse(rt.faults.config.to_dict())


async def kv_pull(request: Request) -> Response:
    """A decode peer takes the KV of a held PD-prefill request (vLLM leg)."""
    rt = _runtime(request)
    try:
        body = await _json_object(request)
    except ApiError as exc:
        return exc.response()
    wanted = body.get("remote_engine_id")
    if wanted is not None and wanted != rt.engine_id:
        return ApiError(409, f"this is engine {rt.engine_id!r}, not {wanted!r}",
                        "KVTransferError").response()
    request_id = body.get("remote_request_id")
    block_ids = body.get("remote_block_ids") or []
    if (request_id is not None and not isinstance(request_id, str)) \
            or not isinstance(block_ids, list):
        return bad_request("remote_request_id must be a string and remote_block_ids "
                           "a list").response()
    held = rt.kv_holds.pull(request_id, [int(b) for b in block_ids])
    if held is None:
        return ApiError(404, f"no KV held for request {request_id!r} (expired, already "
                        "pulled, or never prefilled here)", "KVTransferError").response()
    return JSONResponse(pull_response(rt.engine_id, held))


async def reset_prefix_cache(request: Request) -> Response:
    dropped = _runtime(request).engine.reset_prefix_cache()
    return JSONResponse({"success": True, "dropped_blocks": dropped})


def routes() -> list[Route]:
    return [
        Route("/emulator/stats", stats, methods=["GET"]),
        Route("/emulator/faults", faults, methods=["GET", "POST"]),
        Route(PULL_PATH, kv_pull, methods=["POST"]),
        Route("/emulator/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
        Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
        Route("/flush_cache", reset_prefix_cache, methods=["POST", "GET"]),
    ]
