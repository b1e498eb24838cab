"""Running the two legs of a disaggregated request (bodies: handoff.py).

Both runners return the decode leg's response once its headers arrived (body unread), or
raise PrefillFailed when the prefill leg failed before the decode leg answered — the one
moment a retry elsewhere is still possible.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.responses import Response

from router.core.instances import Instance
from router.upstream.client import Upstream
from router.upstream.handoff import sglang_body, vllm_decode_body, vllm_prefill_body

log = logging.getLogger(__name__)

_TRANSIENT = frozenset({408, 429})


class PrefillFailed(Exception):
    """The prefill leg failed. ``response`` is set when the engine rejected the request
    itself (a 4xx other than 408/429): that goes back to the client, not to a retry."""

    def __init__(self, message: str, *, fatal: bool = False, response: Response | None = None) -> None:
        super().__init__(message)
        self.fatal = fatal  # the instance could not be reached at all
        self.response = response


@dataclass
class Legs:
    upstream: Upstream
    timeout: httpx.Timeout
    headers: dict[str, str]
    path: str
    prefill: Instance
    decode: Instance
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    # called once the prefill leg answered well (its prefill is computed, the KV may still
    # be moving): the router stops counting that work as queued on the prefill instance
    on_prefilled: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True)
class LegsResult:
    decode: httpx.Response
    prefill_s: float | None  # how long the prefill leg took, when known
    missing_kv_params: bool = False


def _check_prefill(resp: httpx.Response) -> None:
    status = resp.status_code
    if status >= 500 or status in _TRANSIENT:
        raise PrefillFailed(f"prefill answered {status}")
    if status >= 400:
        media = resp.headers.get("content-type", "application/json")
        raise PrefillFailed(f"prefill rejected the request ({status})", response=Response(resp.content, status, media_type=media))


async def run_vllm(legs: Legs, body: dict[str, Any], min_tokens: str) -> LegsResult:
    """Prefill first (max_tokens=1), then decode with the returned kv_transfer_params."""
    started = time.perf_counter()
    payload = json.dumps(vllm_prefill_body(body, min_tokens)).encode()
    try:
        resp = await legs.upstream.client.post(legs.prefill.url + legs.path, content=payload, headers=legs.headers, timeout=legs.timeout)
    except httpx.TransportError as exc:
        raise PrefillFailed(f"prefill unreachable: {type(exc).__name__}", fatal=isinstance(exc, httpx.ConnectError)) from None
    prefill_s = time.perf_counter() - started
    _check_prefill(resp)
    if legs.on_prefilled is not None:
        await legs.on_prefilled()
    try:
        params = resp.json().get("kv_transfer_params")
    except (ValueError, AttributeError):
        raise PrefillFailed("prefill answered something other than a JSON object") from None
    if params is None:
        log.warning("prefill %s returned no kv_transfer_params: decode %s will prefill the whole prompt",
                    legs.prefill.id, legs.decode.id)
    decode_payload = json.dumps(vllm_decode_body(body, params)).encode()
    upstream = await legs.upstream.send(legs.decode.url + legs.path, decode_payload, legs.headers, legs.timeout)
    return LegsResult(upstream, prefill_s, params is None)


async def run_sglang(legs: Legs, body: dict[str, Any], rng: random.Random) -> LegsResult:
    """Both legs at once with the same bootstrap room; the decode leg's answer is returned."""
    payload = json.dumps(sglang_body(body, legs.prefill.url, legs.prefill.config.bootstrap_port, rng)).encode()
    started = time.perf_counter()
    timings: dict[str, float] = {}

    async def prefill_leg() -> httpx.Response:
        try:
            resp = await legs.upstream.client.post(legs.prefill.url + legs.path, content=payload, headers=legs.headers, timeout=legs.timeout)
        except httpx.TransportError as exc:
            raise PrefillFailed(f"prefill unreachable: {type(exc).__name__}", fatal=isinstance(exc, httpx.ConnectError)) from None
        timings["prefill"] = time.perf_counter() - started
        _check_prefill(resp)
        if legs.on_prefilled is not None:
            await legs.on_prefilled()
        return resp

    p_task = asyncio.create_task(prefill_leg())
    d_task = asyncio.create_task(legs.upstream.send(legs.decode.url + legs.path, payload, legs.headers, legs.timeout))
    try:
        done, _ = await asyncio.wait({p_task, d_task}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # given up before either answered (client gone, a standby warm cancelled):
        p_task.cancel()  # so are both legs, else the engines pair and serve them for nobody
        d_task.cancel()
        raise
    if p_task in done and p_task.exception() is not None:
        await _cancel_decode(d_task)
        raise p_task.exception()  # type: ignore[misc]
    try:
        upstream = await d_task
    except BaseException:
        p_task.cancel()
        raise
    if p_task.done():
        _log_late_failure(p_task, legs)
    else:  # the decode answered first; the prefill finishes on its own, failures logged
        legs.background.add(p_task)
        p_task.add_done_callback(legs.background.discard)
        p_task.add_done_callback(lambda t: _log_late_failure(t, legs))
    return LegsResult(upstream, timings.get("prefill"))


async def _cancel_decode(d_task: asyncio.Task[httpx.Response]) -> None:
    if d_task.done():
        if d_task.exception() is None:
            await d_task.result().aclose()
        return
    d_task.cancel()
    try:
        response = await d_task
    except (asyncio.CancelledError, httpx.HTTPError):
        return
    await response.aclose()


def _log_late_failure(task: asyncio.Task[Any], legs: Legs) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.warning("prefill leg on %s failed after decode %s answered: %s", legs.prefill.id, legs.decode.id, exc)
