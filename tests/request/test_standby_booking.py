"""A standby warm books its backup like a routed request: the prompt's blocks pinned, so two
sessions sharing a prefix, warmed on one backup at once, book that prefix there once."""

from __future__ import annotations

import asyncio
import json

from router.config import load_config
from router.core.instances import InstancePool
from router.core.metrics import Metrics
from router.engines.book import EngineBook
from router.request.admission import Admission
from router.request.prompt import parse_body
from router.request.standby import Standby
from router.state.memory import MemoryStore
from router.tools.emulator import EmulatorConfig, FaultConfig, start_in_thread
from router.upstream.client import Upstream

BLOCK = 16


async def _booked_kv(store: MemoryStore, instance: str, want: int, timeout: float = 5.0) -> int:
    """The KV booked on ``instance`` once it reaches ``want`` (or what it is at the timeout)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        kv = (await store.snapshot([], [instance])).loads[instance].kv_tokens
        if kv >= want or asyncio.get_running_loop().time() > deadline:
            return kv
        await asyncio.sleep(0.02)


async def test_two_warms_sharing_a_prefix_on_one_backup_book_it_once() -> None:
    # the backup stalls every request, so both warms are in flight (booked) while the test reads
    backup = start_in_thread(EmulatorConfig(role="decode", engine_id="d1",
                                            faults=FaultConfig(stall_rate=1.0, stall_seconds=30)))
    serving = start_in_thread(EmulatorConfig(role="decode", engine_id="d0"))
    try:
        config = load_config(overrides={
            "instances": [{"url": serving.url, "name": "d0", "role": "decode", "model": "m"},
                          {"url": backup.url, "name": "d1", "role": "decode", "model": "m"}],
            "kv_store": {"enabled": True, "standby": {"enabled": True, "min_prompt_tokens": 256}},
        })
        pool = InstancePool(config)
        store = MemoryStore({i.id: 1 << 20 for i in pool}, 600.0, 1 << 20)
        upstream = Upstream.open(8, 60.0)
        metrics = Metrics(lambda: {})
        ids = iter(range(100))
        standby = Standby(config, pool, Admission(pool, EngineBook(1.0), 8.0), store, upstream, metrics,
                          lambda: str(next(ids)))
        shared = tuple(range(1, 49))  # 48 blocks both prompts begin with
        keys = {"a": shared + tuple(range(100, 116)), "b": shared + tuple(range(200, 216))}
        prompt_tokens = 64 * BLOCK
        try:
            for rid, ks in keys.items():
                raw = json.dumps({"model": "m", "prompt": f"session {rid}", "max_tokens": 50, "stream": True}).encode()
                parsed = parse_body(raw, "completions", 4.0)
                standby.start(rid, pool.get("d0"), parsed, ks, prompt_tokens, BLOCK, "/v1/completions", {})
            assert standby.in_flight == 2
            union = (48 + 16 + 16) * BLOCK  # the shared prefix once, each session's own 16 blocks
            booked = await _booked_kv(store, "d1", union)
            # pinned blocks are counted at the grid of pins.py (an over-count below one grid step per chain
            # end): never under the union, and far under both prompts booked whole (2,048 tokens)
            assert union <= booked < union + 2 * 8 * BLOCK < 2 * prompt_tokens
        finally:
            for rid in keys:
                standby.cancel(rid)
            for _ in range(500):  # the cancelled warms settle (shielded) within a few loop turns
                if not standby.in_flight and not (await store.snapshot([], ["d1"])).loads["d1"].requests:
                    break
                await asyncio.sleep(0.01)
            await upstream.aclose()
        # nothing stays booked on the backup
        load = (await store.snapshot([], ["d1"])).loads["d1"]
        assert load.requests == 0 and load.kv_tokens == 0
    finally:
        serving.stop()
        backup.stop()
