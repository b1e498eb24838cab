"""Everything one running emulator owns, wired together.

Why one object: routes, PD handoff, fault injection and metrics all need the
same engine, driver and counters; passing one runtime (stored on
``app.state.runtime``) avoids globals so many emulators can share a process.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from dataclasses import asdict

import httpx

from router.tools.emulator.build import build_engine
from router.tools.emulator.config import EmulatorConfig, FaultConfig
from router.tools.emulator.driver import EngineDriver, RequestStream
from router.tools.emulator.faults import FaultInjector
from router.tools.emulator.kv_events import KVEventLog, KVEventPublisher
from router.tools.emulator.metrics import EngineMetrics
from router.tools.emulator.openai_schema import Limits
from router.tools.emulator.links import AsyncLink
from router.tools.emulator.pd_sglang import BootstrapServer
from router.tools.emulator.pd_vllm import KVHolds
from router.tools.emulator.kvcache import block_hashes
from router.tools.emulator.request import EngineRequest
from router.tools.emulator.stats import FinishedRecord, StatsRecorder
from router.tools.emulator.store_client import StoreClient

log = logging.getLogger(__name__)


class EmulatorRuntime:
    """Config + engine + driver + faults + stats + metrics + PD helpers."""

    def __init__(self, config: EmulatorConfig) -> None:
        parts = build_engine(config)
        self.config = config
        self.profile = parts.profile
        self.engine = parts.engine
        self.tokenizer = parts.tokenizer
        self.sampler = parts.sampler
        self.max_model_len = parts.max_model_len
        self.kv_bandwidth_gbps = parts.kv_bandwidth_gbps
        self.engine_id = config.engine_id or f"emu-{uuid.uuid4().hex[:12]}"
        self.model = config.served_model
        self.limits = Limits(served_model=self.model, max_model_len=self.max_model_len,
                             default_max_tokens=config.default_max_tokens,
                             vocab_size=self.tokenizer.vocab_size)
        self.stats = StatsRecorder(config.stats_history)
        self.metrics = EngineMetrics(config.flavor, self.model, self.engine,
                                     self.cache_labels(), config.time_scale)
        self.faults = FaultInjector(config.faults, config.seed, self._apply_faults)
        self.driver = EngineDriver(self.engine, config.time_scale,
                                   on_first_token=self._on_first_token,
                                   on_finished=self._on_finished, on_load=self._start_load)
        self.kv_bytes_per_token = config.kv_bytes_per_token(self.profile.kv_bytes_per_token)
        self.kv_link = AsyncLink(self.kv_bandwidth_gbps * 1e9 / 8, config.time_scale, self._link_busy)
        self.kv_holds = KVHolds(self.driver, config.kv_hold_timeout_s, self.stats.pd)
        self.kv_events: KVEventPublisher | None = None
        if config.kv_events_endpoint:
            self.engine.kv.events = KVEventLog(self.engine.config.block_size)
            self.kv_events = KVEventPublisher(
                self.engine.kv.events, config.kv_events_endpoint, topic=config.kv_events_topic,
                replay_endpoint=config.kv_events_replay_endpoint, positional=config.kv_events_positional)
        self.kv_store: StoreClient | None = None
        if config.kv_store_url:
            self.kv_store = StoreClient(config.kv_store_url, lambda: self.http, self.engine.config.block_size)
        self._loads: set[asyncio.Task[None]] = set()
        self.bootstrap: BootstrapServer | None = None
        self.bootstrap_port: int | None = None
        self.http: httpx.AsyncClient | None = None
        self._ids = itertools.count()
        self._run_tag = uuid.uuid4().hex[:8]

    # -- lifecycle (called from the app's lifespan) ------------------------------

    async def start(self) -> None:
        if self.kv_events is not None:
            self.kv_events.start()
        self.driver.start()
        # trust_env=False: PD peers are addressed directly, never via a proxy.
        self.http = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0))
        if self.config.flavor == "sglang" and self.config.role == "prefill":
            self.bootstrap = BootstrapServer(self.config.bootstrap_timeout_s, self.stats.pd)
            self.bootstrap_port = await self.bootstrap.start(self.config.host,
                                                             self.config.bootstrap_port)
            log.info("bootstrap listener on port %d", self.bootstrap_port)

    async def stop(self) -> None:
        self.kv_holds.close()
        for task in list(self._loads):
            task.cancel()
        if self.kv_store is not None:
            await self.kv_store.close()
        if self.bootstrap is not None:
            await self.bootstrap.close()
        if self.http is not None:
            await self.http.aclose()
        await self.driver.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()

    # -- helpers -----------------------------------------------------------------

    def next_request_id(self) -> str:
        """Engine-unique request id (also the PD ``remote_request_id``)."""
        return f"{self._run_tag}-{next(self._ids)}"

    def sleep_scale(self) -> float:
        """Wall seconds per model second, including the slowdown fault."""
        return self.config.time_scale * self.faults.config.slowdown

    def cache_labels(self) -> dict[str, str]:
        kv = self.engine.kv
        return {
            "block_size": str(kv.block_size),
            "num_gpu_blocks": str(kv.num_blocks),
            "enable_prefix_caching": "True",
            "cache_dtype": "fp8" if self.config.kv_dtype == "fp8" else "auto",
            "gpu_memory_utilization": str(self.profile.gpu_memory_utilization),
        }

    # -- the shared KV store (store_client.py) -------------------------------------------
    async def lookup_store(self, requests: list[EngineRequest]) -> None:
        """Tell each request how many leading prompt tokens the store holds (on arrival)."""
        if self.kv_store is None:
            return
        bs = self.engine.config.block_size
        for r in requests:
            if r.kv_ready_tokens >= r.prompt_len - 1:
                continue  # a PD decode leg: its KV comes from the prefill engine
            self.engine.prepare(r)
            assert r.hashes is not None
            limit = (r.prompt_len - 1) // bs
            if limit:
                r.store_tokens = await self.kv_store.lookup(r.hashes[:limit]) * bs

    def _start_load(self, request: EngineRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._load(request))
        self._loads.add(task)
        task.add_done_callback(self._loads.discard)

    async def _load(self, request: EngineRequest) -> None:
        try:
            if self.kv_store is not None and self.config.time_scale > 0:
                await self.kv_store.load(request.num_loaded, request.num_loaded * self.kv_bytes_per_token)
        finally:
            if self.engine.load_done(request.request_id):
                self.driver.wake()

    def write_store(self, tokens: list[int]) -> int:
        """Write the full blocks of ``tokens`` (a prompt and what followed it) to the store;
        returns how many blocks that is."""
        if self.kv_store is None:
            return 0
        bs = self.engine.config.block_size
        hashes = block_hashes(tokens, bs, self.engine.config.hash_salt)
        self.kv_store.write(hashes)
        return len(hashes)

    def _link_busy(self, busy: bool) -> None:
        """Isolation: steps slow by the configured fraction while the NIC moves KV."""
        self.engine.transfer_slowdown = 1.0 + self.config.kv_transfer_interference if busy else 1.0

    def _apply_faults(self, faults: FaultConfig) -> None:
        self.engine.time_multiplier = faults.slowdown

    def _on_first_token(self, stream: RequestStream) -> None:
        if self.kv_store is not None and stream.request.hashes:
            self.kv_store.write(stream.request.hashes)  # what this engine computed (or received)
        if stream.first_token_wall is not None:
            self.metrics.observe_ttft(stream.first_token_wall - stream.arrival_wall)
        queue = stream.request.queue_time
        if self.config.flavor != "vllm" and queue is not None:  # SGLang observes it at scheduling; vLLM at the end
            self.metrics.observe_queue(queue * self.config.time_scale)

    def _on_finished(self, stream: RequestStream) -> None:
        r = stream.request
        self.metrics.observe_e2e(self.driver.wall_time() - stream.arrival_wall)
        if self.config.flavor == "vllm" and r.schedule_time is not None and r.first_token_time is not None:
            scale = self.config.time_scale
            self.metrics.observe_queue((r.schedule_time - r.arrival_time) * scale)
            present = r.num_cached + r.num_transferred + r.num_loaded
            self.metrics.observe_prefill((r.first_token_time - r.schedule_time) * scale, max(0, r.prompt_len - present),
                                         r.prompt_len)
        e2e = (r.finish_time - r.arrival_time) if r.finish_time is not None else None
        self.stats.record(FinishedRecord(
            request_id=r.request_id, client_request_id=r.tag, prompt_tokens=r.prompt_len,
            cached_tokens=r.num_cached, transferred_tokens=r.num_transferred,
            output_tokens=r.num_output, queue_model_s=r.queue_time,
            ttft_model_s=r.ttft, e2e_model_s=e2e, finish_reason=r.finish_reason))

    def snapshot(self, recent: int = 100) -> dict[str, object]:
        """The ``/emulator/stats`` document (``recent`` finished requests)."""
        e = self.engine
        c = e.counters
        kv = e.kv
        return {
            "engine_id": self.engine_id,
            "flavor": self.config.flavor,
            "role": self.config.role,
            "model": self.model,
            "profile": self.profile.name,
            "time_scale": self.config.time_scale,
            "requests": {
                "added": c.requests_added, "scheduled": c.requests_scheduled,
                "finished": c.requests_finished, "aborted": c.requests_aborted,
                "running": e.num_running, "waiting": e.num_waiting,
                "held": len(e.held),
            },
            "tokens": {
                "prompt": c.prompt_tokens, "cached": c.cached_tokens,
                "transferred_in": c.transferred_tokens,
                "prefill_computed": c.prefill_computed_tokens,
                "generated": c.generated_tokens,
            },
            "prefix_hit_ratio": c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            "kv": {
                "block_size": kv.block_size, "num_blocks": kv.num_blocks,
                "used_blocks": kv.used_blocks, "cached_blocks": kv.cached_blocks,
                "usage": kv.usage, "evictions": kv.evictions,
            },
            "model_time": {"steps": c.steps, "busy_s": c.busy_time,
                           "now_s": self.driver.model_now()},
            "faults": self.faults.config.to_dict(),
            "store": {"url": self.config.kv_store_url, "loaded_tokens_admitted": c.store_loaded_tokens,
                      **(asdict(self.kv_store.counters) if self.kv_store is not None else {})},
            **self.stats.to_dict(recent),
        }
