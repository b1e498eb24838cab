"""Warm standby: a long stream's backup decode instance loads its prompt's KV ahead of a failure.

Why: a session that migrates after its decode instance died loads the KV of prompt + generated
tokens from the shared store (continuation.py). For a long prompt that load dominates the gap
the client sees, and it cannot be made shorter at failure time, only earlier. So once a long
stream's first token arrived (the prompt's KV is in the store by then: the prefill wrote it),
the session's backup decode instance is sent the same prompt with ``max_tokens: 1`` through the
engine's ordinary API; the engine loads the prompt's blocks from the store into its prefix
cache, and residency records that it holds them. If the stream then breaks, the continuation's
cost model sees the backup holding the prompt and loading only the generated tail, and prefers it.

The backup is the highest rendezvous weight of the session's first block key over the healthy
instances of the serving one's role, flavour and KV layout, the serving one excluded: stable for
a session, the same on every router replica, spread over the pool.

SGLang PD pools: a decode worker only serves requests paired with a prefill through a bootstrap
room, and a continuation goes through a pair again; what it waits for is the whole KV crossing
the PD link to the new decode worker (the session's prefill still holds the prompt). So the warm
is a pair too: the session's own prefill (it computes nothing, the prompt is in its prefix cache)
and the backup decode worker, which receives the prompt's KV ahead of a failure; the continuation
then moves only the generated tail. That needs a decode worker that keeps transferred KV in a
prefix cache (SGLang's ``--disaggregation-decode-enable-radix-cache``; the emulator's decode
always does); without one the warm is wasted link bytes, so pools without it keep standby off.

A warm is never on the request's path (a background task, started after the first token), never
client traffic (no lifecycle of its own: no request metrics, no access log, no calibration; its
booking is load and residency only), never the stream's failure (every error is counted and
dropped), bounded (``max_in_flight``: a stream finding them all busy gets none), and cancelled
with its stream: when the stream ends ``ok`` or its client goes away. A stream broken mid-way
keeps its warm running, since the continuation is what it is for.

A continued stream is re-armed: once the continuation's first token arrived, the session gets a
new backup (the same rendezvous over the new serving instance's peers, the instances it broke on
excluded) warmed with the prompt plus the text so far, so a second failure finds a warm peer too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Collection
from typing import Any

import httpx

from router.config.model import RouterConfig
from router.core.instances import Instance, InstancePool
from router.core.metrics import Metrics
from router.request.admission import Admission
from router.request.lifecycle import Attempt, Hook
from router.request.prompt import ParsedRequest
from router.scheduling.placement import rendezvous_weight
from router.state.base import Booking, Snapshot, StateStore
from router.upstream.client import Upstream
from router.upstream.pd_legs import Legs, run_sglang
from router.upstream.relay import Outcome

log = logging.getLogger(__name__)


class _Book:
    """The warm's booking on its backup: KV room and the prompt's residency, no queued prefill
    (the backup loads the prompt from the store while it computes one token)."""

    def __init__(self, booking: Booking) -> None:
        self.booking = booking

    def __call__(self, snap: Snapshot) -> Booking:
        return self.booking

    def revise(self, snap: Snapshot, booking: Booking) -> Booking | None:
        return None


def warm_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request that loads ``body``'s prompt into a prefix cache: one token, no stream."""
    warm = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "max_completion_tokens")}
    warm["max_tokens"] = 1
    warm["stream"] = False
    return warm


class Standby(Hook):
    """The router's warms in flight, keyed by request id (one per session), and the hook that
    cancels a warm when its stream ends."""

    def __init__(self, config: RouterConfig, pool: InstancePool, admission: Admission, store: StateStore,
                 upstream: Upstream, metrics: Metrics, new_id: Callable[[], str],
                 rng: random.Random | None = None) -> None:
        self._config, self._pool, self._admission, self._store = config, pool, admission, store
        self._upstream, self._metrics, self._new_id = upstream, metrics, new_id
        self._rng = rng or random.SystemRandom()  # SGLang bootstrap rooms of paired warms
        self._warms: dict[str, asyncio.Task[None]] = {}
        self._legs: set[asyncio.Task[object]] = set()  # paired warms' prefill legs finishing after their decode

    @property
    def in_flight(self) -> int:
        return len(self._warms)

    def backup_for(self, serving: Instance, first_key: int, model: str, exclude: Collection[str] = ()) -> Instance | None:
        """The session's backup: rendezvous on its first key over the serving instance's peers, less ``exclude``."""
        c = serving.config
        peers = [i for i in self._admission.usable(self._pool.healthy((c.role,), exclude=(serving.id, *exclude),
                                                                      model=model), model)
                 if i.config.kv_dtype == c.kv_dtype and i.config.block_size == c.block_size
                 and i.config.flavor == c.flavor]
        return max(peers, key=lambda i: rendezvous_weight(first_key, i.id), default=None)

    def start(self, request_id: str, serving: Instance, parsed: ParsedRequest, keys: tuple[int, ...],
              prompt_tokens: int, block_tokens: int, path: str, headers: dict[str, str], *,
              failed: Collection[str] = (), rearm: bool = False, prefill: Instance | None = None) -> None:
        """Warm the backup of a stream whose first token just arrived, if it qualifies; never waits.

        ``rearm``: the stream is a continuation (its engine broke, ``failed`` are the instances it
        broke on): the session gets a new backup for the prompt plus the text so far, since the old
        one is now serving it or was passed over. A warm of the old backup still running is
        cancelled: the continuation it was for has been routed. ``prefill``: the stream's prefill
        instance, through which an SGLang decode worker's backup is warmed (none: no standby)."""
        store_cfg = self._config.kv_store
        cfg = store_cfg.standby
        if not (cfg.enabled and store_cfg.enabled and keys) or prompt_tokens < cfg.min_prompt_tokens:
            return
        if rearm:
            self.cancel(request_id)
        elif request_id in self._warms:  # a client reusing its request id for a second stream: one warm is enough
            return
        if len(self._warms) >= cfg.max_in_flight:
            self._metrics.standby_warms.labels("busy").inc()
            return
        paired = serving.config.role == "decode" and serving.config.flavor == "sglang"
        backup = None if paired and prefill is None else self.backup_for(serving, keys[0], parsed.model, failed)
        if backup is None:
            self._metrics.standby_warms.labels("no_backup").inc()
            return
        # the prompt's blocks are pinned like a routed request's: a prefix the backup already holds for
        # requests in flight (another session's warm, its own traffic) is booked there once
        # a pinning leg books its own KV apart: the prompt's tail past the blocks, and the warm's one output token
        tail = max(0, prompt_tokens - len(keys) * block_tokens)
        booking = Booking.single(f"standby-{self._new_id()}", backup.id, 0, tail + 1, keys, block_tokens)
        body = warm_body(parsed.body)
        sent = {**headers, "x-request-id": f"{request_id}-standby"}
        task = asyncio.get_running_loop().create_task(
            self._warm(backup, booking, path, body, sent, cfg.timeout_s, prefill if paired else None),
            name=f"standby {request_id}")
        self._warms[request_id] = task
        task.add_done_callback(lambda t: self._warms.pop(request_id, None) if self._warms.get(request_id) is t else None)
        self._metrics.standby_warms.labels("rearmed" if rearm else "started").inc()

    async def _warm(self, backup: Instance, booking: Booking, path: str, body: dict[str, Any], headers: dict[str, str],
                    timeout_s: float, prefill: Instance | None) -> None:
        snap: Snapshot | None = None
        result = "failed"
        try:
            snap, _ = await self._store.decide(booking.keys, [backup.id], _Book(booking))
            async with asyncio.timeout(timeout_s):
                timeout = httpx.Timeout(timeout_s)
                if prefill is None:
                    response = await self._upstream.send(backup.url + path, json.dumps(body).encode(), headers, timeout)
                else:  # SGLang: through a pair, the session's prefill handing the prompt's KV to the backup
                    legs = Legs(self._upstream, timeout, headers, path, prefill, backup, self._legs)
                    response = (await run_sglang(legs, body, self._rng)).decode
                try:
                    await response.aread()
                finally:
                    await response.aclose()
            if response.status_code == 200:
                result = "ok"
            else:
                log.info("standby warm on %s answered %d", backup.id, response.status_code)
        except asyncio.CancelledError:
            result = "cancelled"
            raise
        except Exception as exc:  # a warm is an optimisation: whatever goes wrong stays here
            result = "timeout" if isinstance(exc, TimeoutError) else "failed"
            log.info("standby warm on %s failed: %s", backup.id, type(exc).__name__)
        finally:
            self._metrics.standby_warms.labels(result).inc()
            await asyncio.shield(self._settle(booking, snap, result == "ok"))

    async def _settle(self, booking: Booking, snap: Snapshot | None, loaded: bool) -> None:
        """Release the warm's load; its residency stays only if the backup answered."""
        if snap is None:
            return
        try:
            if loaded:
                await self._store.release(booking)
            else:
                await self._store.abandon(booking, snap.matched)
        except Exception as exc:
            log.warning("standby warm's booking on %s not settled: %s", booking.instance, type(exc).__name__)

    def cancel(self, request_id: str) -> None:
        task = self._warms.pop(request_id, None)
        if task is not None and not task.done():
            task.cancel()

    async def end(self, attempt: Attempt, outcome: Outcome) -> None:
        if outcome != "upstream_error":  # done, or its client left: a broken stream keeps its warm for the continuation
            self.cancel(attempt.request_id)
