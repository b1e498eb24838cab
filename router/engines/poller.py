"""Reads every engine in the background: ``/metrics`` often, facts now and then.

Never on the request path: one background task, every read bounded in time and size,
all instances read concurrently. A failed read leaves the last facts in place (an
engine does not change its model list by timing out) but drops its external load.
Facts are applied to the pool (capacity, block size and KV dtype feed the cost model
and the P/D compatibility contract) and to the store (residency cap) as soon as they
change; a fact contradicting config is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import httpx

from router.config.engines import EnginesConfig
from router.config.model import InstanceConfig, RouterConfig
from router.core.instances import Instance, InstancePool
from router.engines.book import EngineBook
from router.engines.decode_step import DecodeStepMeter
from router.engines.external import external_load
from router.engines.facts import EngineFacts, effective_config, parse_models, parse_server_info
from router.engines.prefill_rate import PrefillMeter, PrefillSample
from router.engines.readings import EngineReading, parse_metrics
from router.state.base import Load, StateStore

log = logging.getLogger(__name__)


class _TooLarge(Exception):
    pass


class EnginePoller:
    def __init__(
        self, config: RouterConfig, pool: InstancePool, store: StateStore, client: httpx.AsyncClient, book: EngineBook
    ) -> None:
        self._config = config
        self._engines: EnginesConfig = config.engines
        self._pool = pool
        self._store = store
        self._client = client
        self.book = book
        self._written: dict[str, InstanceConfig] = {}  # each instance's config as the operator wrote it
        self._applied: dict[str, InstanceConfig] = {}  # ... and as last handed to the pool
        self._logged: set[tuple[str, str, str]] = set()
        self.meter = PrefillMeter(self._engines.calibration)
        self.decode = DecodeStepMeter(self._engines.decode_step)
        # where measured prefill windows go (the calibration, which decides what it learns from);
        # set by whoever owns the calibrator
        self.on_prefill: Callable[[str, PrefillSample], None] | None = None
        # every reading, as it is recorded (the token ratio's windows of answers without usage)
        self.on_reading: Callable[[str, EngineReading], None] | None = None

    # -- reads -----------------------------------------------------------------------------
    async def _get(self, url: str) -> bytes | None:
        limit = self._engines.max_response_bytes
        try:
            async with self._client.stream("GET", url, timeout=self._engines.timeout_s) as resp:
                if resp.status_code != 200:
                    return None
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise _TooLarge
                    chunks.append(chunk)
                return b"".join(chunks)
        except _TooLarge:
            self._log_once(url, "too_large", f"{url} answered more than {limit} bytes; ignored")
        except (httpx.HTTPError, OSError):
            pass
        return None

    async def _get_json(self, url: str) -> object | None:
        raw = await self._get(url)
        if raw is None:
            return None
        try:
            data: object = json.loads(raw)
            return data
        except ValueError:
            return None

    # -- load ------------------------------------------------------------------------------
    async def _read_metrics(self, inst: Instance) -> EngineReading | None:
        raw = await self._get(f"{inst.url}/metrics")
        if raw is None:
            return None
        try:
            return parse_metrics(raw.decode("utf-8", "replace"))
        except ValueError:
            return None

    async def _booked(self, ids: list[str]) -> dict[str, Load] | None:
        try:
            return dict((await self._store.snapshot([], ids)).loads)
        except Exception as exc:  # the store is down: what is ours is unknown, so nothing counts as external
            log.debug("no booked load: %s", exc)
            return None

    def _record(self, inst: Instance, reading: EngineReading | None,
                before: dict[str, Load] | None, after: dict[str, Load] | None) -> None:
        if reading is None:
            self.book.scrape_failed(inst.id)
            return
        external = Load()
        if before is not None and after is not None:
            # The engine counted our requests at some moment of the scrape: booked load is
            # taken on both sides of it and the larger kept, so a request that finished (or
            # began) meanwhile is not mistaken for someone else's.
            a, b = before.get(inst.id, Load()), after.get(inst.id, Load())
            booked = Load(max(a.requests, b.requests), max(a.prefill_tokens, b.prefill_tokens),
                          max(a.kv_tokens, b.kv_tokens), max(a.transfers, b.transfers))
            external = external_load(reading, booked, inst.candidate.cache_tokens)  # booked KV is in the router's tokens
        self.book.record_reading(inst.id, reading, external)
        if self.on_reading is not None:
            self.on_reading(inst.id, reading)
        calibration = self._engines.calibration
        if calibration.enabled:
            sample = self.meter.update(inst.id, reading)
            if sample is not None:
                self.book.record_prefill(inst.id, sample)
                if self.on_prefill is not None:
                    self.on_prefill(inst.id, sample)
        if self._engines.decode_step.enabled:
            step = self.decode.update(inst.id, reading)
            if step is not None and self._pool.set_decode_step(inst.id, self.decode.belief(inst.id)) is not None:
                self.book.entry(inst.id).decode_step_s = step
        elif inst.decode_step is not None:  # turned off while running (config reload): the configured step again
            self.decode.retain(())
            self._pool.set_decode_step(inst.id, None)
            self.book.entry(inst.id).decode_step_s = None
        facts = self.book.entry(inst.id).facts
        updated = facts.with_reading(reading)
        if updated != facts:
            self._apply(inst, updated)

    async def poll_metrics(self, instances: list[Instance]) -> None:
        """Scrape ``instances`` concurrently, between two reads of the load booked on them."""
        ids = [i.id for i in instances]
        before = await self._booked(ids)
        readings = await asyncio.gather(*(self._read_metrics(i) for i in instances), return_exceptions=True)
        after = await self._booked(ids)
        for inst, reading in zip(instances, readings):
            if isinstance(reading, BaseException):
                log.error("reading engine %s failed", inst.id, exc_info=reading)
                reading = None
            self._record(inst, reading, before, after)

    # -- facts -----------------------------------------------------------------------------
    async def refresh_facts(self, inst: Instance) -> None:
        facts = self.book.entry(inst.id).facts
        models = await self._get_json(f"{inst.url}/v1/models")
        try:
            facts = replace(facts, models=parse_models(models))
        except ValueError:
            self.book.entry(inst.id).facts_errors += 1
        if inst.config.flavor == "sglang":
            info = await self._get_json(f"{inst.url}/get_server_info")
            if info is None:
                info = await self._get_json(f"{inst.url}/server_info")
            with contextlib.suppress(ValueError):
                page, capacity, dtype, context = parse_server_info(info)
                facts = facts.with_geometry(page, capacity, dtype)
                if context is not None and facts.models is not None:
                    facts = replace(facts, models={m: n or context for m, n in facts.models.items()})
        self._apply(inst, facts)

    def _apply(self, inst: Instance, facts: EngineFacts) -> None:
        self.book.set_facts(inst.id, facts)
        current = inst.config
        if current is not self._applied.get(inst.id):  # new instance, or its config was replaced
            self._written[inst.id] = current
        effective, problems = effective_config(self._written[inst.id], facts)
        for problem in problems:
            self._log_once(problem.instance, problem.field, str(problem))
        if effective != current:
            log.info("instance %s: using engine-reported %s", inst.id,
                     {k: getattr(effective, k) for k in ("cache_tokens", "block_size", "kv_dtype")
                      if getattr(effective, k) != getattr(current, k)})
            try:
                self._pool.apply_facts(inst.id, effective)
            except KeyError:  # it left the pool while we were reading it
                return
            self._store.set_capacity(inst.id, self._config.residency_cap(effective, inst.candidate.cache_tokens))
            for instance_id, unpairable in self._pool.compat_report().items():
                self._log_once(instance_id, "compat", f"instance {instance_id} can never be paired: {unpairable}")
        self._applied[inst.id] = inst.config

    def _log_once(self, instance: str, what: str, message: str) -> None:
        key = (instance, what, message)
        if key not in self._logged and len(self._logged) < 10_000:
            self._logged.add(key)
            log.warning("%s", message)

    # -- scheduling ------------------------------------------------------------------------
    def _live(self) -> list[Instance]:
        instances = list(self._pool)
        ids = {i.id for i in instances}
        self.book.retain(ids)
        self.meter.retain(ids)
        self.decode.retain(ids)
        for known in (self._written, self._applied):
            for gone in [i for i in known if i not in ids]:
                del known[gone]
        return [i for i in instances if i.healthy]

    @staticmethod
    async def _each(instances: list[Instance], work: Callable[[Instance], Awaitable[None]]) -> None:
        results = await asyncio.gather(*(work(i) for i in instances), return_exceptions=True)
        for inst, result in zip(instances, results):
            if isinstance(result, Exception):
                log.error("reading engine %s failed", inst.id, exc_info=result)

    async def poll_all(self) -> None:
        await self.poll_metrics(self._live())

    async def refresh_all(self) -> None:
        await self._each(self._live(), self.refresh_facts)

    async def start(self) -> None:
        """First facts and load before the router serves (bounded by the engine timeout)."""
        await self.refresh_all()
        await self.poll_all()

    async def on_recovered(self, instance_id: str) -> None:
        """An instance came back (likely restarted, maybe with other settings): re-read it."""
        try:
            inst = self._pool.get(instance_id)
        except KeyError:
            return
        await self.refresh_facts(inst)
        await self.poll_metrics([inst])

    async def run(self) -> None:
        """The background task (after ``start``): both loops, until cancelled."""
        await asyncio.gather(self._every(self._engines.metrics_interval_s, self.poll_all),
                             self._every(self._engines.facts_interval_s, self.refresh_all))

    @staticmethod
    async def _every(interval_s: float, work: Callable[[], Awaitable[None]]) -> None:
        """``work`` every ``interval_s``, start to start (``start`` did the first round)."""
        elapsed = 0.0
        while True:
            await asyncio.sleep(max(0.0, interval_s - elapsed))
            started = time.monotonic()
            try:
                await work()
            except Exception:  # a bug here must not stop a loop the router depends on
                log.exception("engine poll failed")
            elapsed = time.monotonic() - started
