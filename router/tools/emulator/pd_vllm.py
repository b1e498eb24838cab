"""vLLM NixlConnector-shaped PD handoff.

Prefill leg: a request with ``kv_transfer_params.do_remote_decode=true``
(normally ``max_tokens=1``) is prefilled, its KV blocks stay pinned, and the
response carries top-level ``kv_transfer_params`` telling the decode where to
read them (``remote_engine_id``, ``remote_block_ids``, ``remote_host``,
``remote_port``, ``remote_request_id``). The pin expires after
``kv_hold_timeout_s`` wall seconds, as vLLM frees unclaimed KV.

Decode leg: a request carrying ``do_remote_prefill=true`` and those fields
"reads" the KV: ``POST /emulator/kv/pull`` on the prefill engine (which
unpins the blocks), then waits bytes/bandwidth model time, then runs with
that KV already present. A gone engine, expired blocks or a different
prompt fail loudly (HTTP 502) unless ``--pd-fallback recompute``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from router.tools.emulator.driver import EngineDriver
from router.tools.emulator.openai_schema import bad_request
from router.tools.emulator.pd_common import Leg, PdFailure, PdHost, prompt_digest
from router.tools.emulator.request import EngineRequest, RequestStatus
from router.tools.emulator.stats import PdCounters

PULL_PATH = "/emulator/kv/pull"


class KVHolds:
    """Prefill side: requests whose finished KV waits for a decode's pull."""

    def __init__(self, driver: EngineDriver, timeout_s: float, counters: PdCounters) -> None:
        self._driver = driver
        self._timeout_s = timeout_s
        self._counters = counters
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._by_blocks: dict[tuple[int, ...], str] = {}
        self._blocks_of: dict[str, tuple[int, ...]] = {}

    def hold(self, request: EngineRequest, prompt_blocks: Sequence[int]) -> None:
        """Start the expiry clock for a request the engine already holds."""
        rid = request.request_id
        key = tuple(prompt_blocks)
        self._by_blocks[key] = rid
        self._blocks_of[rid] = key
        loop = asyncio.get_running_loop()
        self._timers[rid] = loop.call_later(self._timeout_s, self._expire, rid)
        self._counters.kv_holds += 1

    def pull(self, request_id: str | None, block_ids: Sequence[int]) -> EngineRequest | None:
        """Hand the KV to a peer: unpin and forget it. None if unknown/expired."""
        rid = request_id or self._by_blocks.get(tuple(block_ids))
        if rid is None or rid not in self._blocks_of:
            return None
        self._forget(rid)
        request = self._driver.release_held(rid)
        if request is not None:
            self._counters.kv_pulls_served += 1
        return request

    def drop(self, request_id: str) -> None:
        """Release without a pull (the prefill response itself failed)."""
        self._forget(request_id)
        self._driver.release_held(request_id)

    def _expire(self, request_id: str) -> None:
        self._timers.pop(request_id, None)
        self._forget(request_id)
        if self._driver.release_held(request_id) is not None:
            self._counters.kv_holds_expired += 1

    def _forget(self, request_id: str) -> None:
        timer = self._timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()
        key = self._blocks_of.pop(request_id, None)
        if key is not None:
            self._by_blocks.pop(key, None)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


def pull_response(runtime_engine_id: str, request: EngineRequest) -> dict[str, object]:
    """Body of a successful pull: what the decode needs to trust the KV."""
    return {
        "engine_id": runtime_engine_id,
        "request_id": request.request_id,
        "prompt_len": request.prompt_len,
        "prompt_digest": prompt_digest(request.prompt),
        "block_hashes": list(request.hashes or []),
    }


class VllmHost(PdHost, Protocol):
    """An engine that can play a vLLM leg: it pins KV for pulls and pulls from peers."""

    @property
    def kv_holds(self) -> KVHolds: ...
    @property
    def http(self) -> httpx.AsyncClient | None: ...


class VllmPrefillLeg(Leg):
    """Prefill, keep the KV pinned, return where to fetch it."""

    name = "vllm-prefill"
    rt: VllmHost

    def __init__(self, runtime: VllmHost) -> None:
        super().__init__(runtime)

    async def prepare(self, requests: list[EngineRequest]) -> None:
        if self.rt.config.role == "decode":
            raise bad_request("this engine is decode-only; do_remote_decode needs a "
                              "prefill engine", "kv_transfer_params")
        if len(requests) != 1:
            raise bad_request("do_remote_decode supports a single prompt", "prompt")
        requests[0].hold_on_finish = True

    async def finalize(self, requests: list[EngineRequest]) -> dict[str, object]:
        rt = self.rt
        request = requests[0]
        if request.status is not RequestStatus.HELD:
            return {}
        bs = rt.engine.config.block_size
        prompt_blocks = request.block_ids[: -(-request.prompt_len // bs)]
        rt.kv_holds.hold(request, prompt_blocks)
        return {"kv_transfer_params": {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": rt.engine_id,
            "remote_block_ids": list(prompt_blocks),
            "remote_host": rt.config.public_host,
            "remote_port": rt.config.port,
            "remote_request_id": request.request_id,
            "tp_size": 1,
        }}

    def abort(self, requests: list[EngineRequest]) -> None:
        for request in requests:
            if request.status is RequestStatus.HELD:
                self.rt.kv_holds.drop(request.request_id)


class VllmDecodeLeg(Leg):
    """Pull the prompt KV from the prefill engine named in the params."""

    name = "vllm-decode"
    rt: VllmHost

    def __init__(self, runtime: VllmHost, params: Mapping[str, Any]) -> None:
        super().__init__(runtime)
        self.params = params

    async def prepare(self, requests: list[EngineRequest]) -> None:
        if self.rt.config.role == "prefill":
            raise bad_request("this engine is prefill-only; do_remote_prefill needs a "
                              "decode engine", "kv_transfer_params")
        if len(requests) != 1:
            raise bad_request("do_remote_prefill supports a single prompt", "prompt")
        request = requests[0]
        local_hit = self.rt.engine.local_hit_tokens(request)
        try:
            await self._pull(request)
        except PdFailure as failure:
            self.fail_or_fallback(failure)
            return
        await self.receive_kv(request, local_hit)

    async def _pull(self, request: EngineRequest) -> None:
        p = self.params
        host, port = p.get("remote_host"), p.get("remote_port")
        block_ids = p.get("remote_block_ids") or []
        if not isinstance(host, str) or not isinstance(port, int) \
                or not isinstance(block_ids, list):
            raise PdFailure("kv_transfer_params lack remote_host/remote_port/"
                            "remote_block_ids", status=400)
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        assert self.rt.http is not None
        try:
            resp = await self.rt.http.post(f"http://{netloc}{PULL_PATH}", json={
                "remote_request_id": p.get("remote_request_id"),
                "remote_block_ids": block_ids,
                "remote_engine_id": p.get("remote_engine_id"),
                "requester_engine_id": self.rt.engine_id,
            }, timeout=10.0)
        except httpx.HTTPError as exc:
            raise PdFailure(f"prefill engine {netloc} unreachable ({exc!r})") from None
        if resp.status_code != 200:
            raise PdFailure(f"prefill engine {netloc} answered {resp.status_code}: "
                            f"{resp.text[:300]}")
        info = resp.json()
        expected = p.get("remote_engine_id")
        if expected is not None and info.get("engine_id") != expected:
            raise PdFailure(f"{netloc} is engine {info.get('engine_id')!r}, "
                            f"not {expected!r}")
        if info.get("prompt_digest") != prompt_digest(request.prompt):
            raise PdFailure("the prefilled prompt differs from this request's prompt",
                            status=409)
