"""The poller against real servers (emulated engines): facts learned and applied, load read."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack

import httpx
import pytest

from router.config.model import RouterConfig, load_config
from router.core.instances import InstancePool
from router.engines.book import EngineBook
from router.engines.exported import EngineCollector
from router.engines.poller import EnginePoller
from router.state.base import Booking
from router.state.memory import MemoryStore
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import EmulatorHandle, start_in_thread
from servers import FakeBackend, free_port, serve_app


@pytest.fixture
def emulators() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def emulate(stack: ExitStack, **fields: object) -> EmulatorHandle:
    fields.setdefault("time_scale", 0.01)
    fields.setdefault("model", "m")
    return stack.enter_context(start_in_thread(EmulatorConfig(**fields)))  # type: ignore[arg-type]


class Rig:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.pool = InstancePool(config)
        self.store = MemoryStore({i.id: config.residency_cap(i.config) for i in self.pool})
        self.book = EngineBook(config.engines.stale_after_s or 1.0)
        self.client = httpx.AsyncClient(trust_env=False)
        self.poller = EnginePoller(config, self.pool, self.store, self.client, self.book)


@pytest.fixture
async def rig_for() -> AsyncIterator:
    rigs: list[Rig] = []

    def make(instances: list[dict], **overrides: object) -> Rig:
        rig = Rig(load_config(overrides={"instances": instances, **overrides}))
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        await rig.client.aclose()


async def test_facts_are_learned_and_feed_the_pool_and_the_residency_cap(emulators, rig_for) -> None:
    emu = emulate(emulators, block_size=32, cache_tokens=4096, max_model_len=2048)
    rig = rig_for([{"url": emu.url, "name": "e"}])
    await rig.poller.start()
    facts = rig.book.facts("e")
    assert facts.models == {"m": 2048}
    assert (facts.block_size, facts.capacity_tokens, facts.kv_dtype) == (32, 4096, "auto")
    inst = rig.pool.get("e")
    assert (inst.config.cache_tokens, inst.config.block_size) == (4096, 32)
    assert inst.candidate.cache_tokens == 4096 and inst.candidate.compat == (None, "auto", 32, "vllm")
    # residency now holds what the engine can: 4096 tokens / 64-token keys = 64 keys
    keys = list(range(1, 101))
    rig.store.record_residency("e", keys)
    assert (await rig.store.snapshot(keys, ["e"])).matched["e"] == 64


async def test_calibration_survives_facts(emulators, rig_for) -> None:
    emu = emulate(emulators, block_size=32, cache_tokens=4096)
    rig = rig_for([{"url": emu.url, "name": "e"}])
    rig.pool.calibrate("e", 2.0)
    rate = rig.pool.get("e").candidate.prefill_tokens_per_s
    await rig.poller.start()
    assert rig.pool.get("e").candidate.prefill_tokens_per_s == rate
    assert rig.pool.get("e").candidate.cache_tokens == 4096


async def test_config_wins_and_a_contradiction_is_logged_once(emulators, rig_for, caplog) -> None:
    emu = emulate(emulators, block_size=32, cache_tokens=4096)
    rig = rig_for([{"url": emu.url, "name": "e", "block_size": 16, "model": "x"}])
    with caplog.at_level(logging.WARNING, logger="router.engines.poller"):
        for _ in range(3):
            await rig.poller.refresh_all()
            await rig.poller.poll_all()
    assert rig.pool.get("e").config.block_size == 16
    assert rig.pool.get("e").config.cache_tokens == 4096  # not set in config: the engine's
    messages = [r.getMessage() for r in caplog.records]
    assert sum("block_size=16" in m and "32" in m for m in messages) == 1, messages
    assert sum("model='x'" in m for m in messages) == 1, messages


async def test_sglang_geometry_comes_from_server_info(emulators, rig_for) -> None:
    emu = emulate(emulators, flavor="sglang", block_size=8, cache_tokens=800, max_model_len=1024)
    rig = rig_for([{"url": emu.url, "name": "s", "flavor": "sglang"}], engines={"poll": True})
    await rig.poller.refresh_all()
    facts = rig.book.facts("s")
    assert (facts.block_size, facts.capacity_tokens, facts.models) == (8, 800, {"m": 1024})
    await rig.poller.poll_all()
    assert rig.book.entry("s").reading.capacity_tokens == 800  # its /metrics says the same


def post_in_background(url: str, n: int, max_tokens: int) -> list[threading.Thread]:
    def send(i: int) -> None:
        httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": f"{i} bypass " * 100,
                                                  "max_tokens": max_tokens}, timeout=60)
    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


async def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_traffic_that_bypasses_the_router_is_external_load(emulators, rig_for) -> None:
    emu = emulate(emulators, time_scale=0.5, max_num_seqs=2)
    rig = rig_for([{"url": emu.url, "name": "e"}])
    threads = post_in_background(emu.url, 5, 400)

    async def seen() -> bool:
        await rig.poller.poll_all()
        reading = rig.book.entry("e").reading
        return reading is not None and (reading.requests or 0) >= 5

    deadline = time.monotonic() + 15
    while not await seen():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    ext = rig.book.external_loads()["e"]
    assert ext.requests >= 5 and ext.kv_tokens > 0
    # the same engine load, but booked by the router itself: nothing is external
    for i in range(8):
        rig.store.book(Booking.single(f"b{i}", "e", 0, 10_000))
    await rig.poller.poll_all()
    assert "e" not in rig.book.external_loads()
    assert rig.book.entry("e").external.requests == 0
    for t in threads:
        t.join(timeout=60)


async def test_an_engine_without_metrics_has_no_external_load(rig_for) -> None:
    fake = FakeBackend("a")
    with serve_app(fake.app()) as url:
        rig = rig_for([{"url": url, "name": "a"}, {"url": f"http://127.0.0.1:{free_port()}", "name": "dead"}])
        await rig.poller.start()
        assert rig.book.external_loads() == {}
        assert rig.book.entry("a").scrape_errors == 1 and rig.book.entry("dead").scrape_errors == 1
        assert rig.book.facts("a").models is not None and "m" in rig.book.facts("a").models
        assert rig.book.facts("dead").models is None


async def test_oversized_answers_are_dropped(emulators, rig_for, caplog) -> None:
    emu = emulate(emulators)
    rig = rig_for([{"url": emu.url, "name": "e"}], engines={"max_response_bytes": 4096})
    with caplog.at_level(logging.WARNING, logger="router.engines.poller"):
        await rig.poller.poll_all()
        await rig.poller.poll_all()
    assert rig.book.entry("e").reading is None and rig.book.entry("e").scrape_errors == 2
    assert sum("more than 4096 bytes" in r.getMessage() for r in caplog.records) == 1


async def test_the_engines_own_hit_ratio_comes_from_its_counter_deltas(emulators, rig_for) -> None:
    emu = emulate(emulators)
    rig = rig_for([{"url": emu.url, "name": "e"}])
    prompt = " ".join(f"w{i}" for i in range(600))
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await client.post(emu.url + "/v1/completions", json={"model": "m", "prompt": "warm up", "max_tokens": 1})
        await rig.poller.poll_all()  # what the engine did before this scrape does not count
        for _ in range(2):  # the second finds the first's blocks cached
            r = await client.post(emu.url + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 1})
            assert r.status_code == 200
        await rig.poller.poll_all()
        stats = (await client.get(emu.url + "/emulator/stats")).json()
    entry = rig.book.entry("e")
    assert entry.hit_ratio is not None and 0.4 < entry.hit_ratio < 0.5  # all but the last block of one of two
    assert entry.hit_tokens_seen <= stats["tokens"]["cached"]
    exported = {(s.name, s.labels.get("engine")): s.value for m in EngineCollector(rig.book).collect() for s in m.samples}
    assert exported[("pd_router_engine_prefix_cache_hit_ratio", "e")] == entry.hit_ratio


def test_an_engine_restart_does_not_count_as_negative_hits() -> None:
    from router.engines.book import EngineEntry
    from router.engines.readings import EngineReading

    entry = EngineEntry()
    first, second = EngineReading(queried_tokens=1000, hit_tokens=400), EngineReading(queried_tokens=2000, hit_tokens=1200)
    restarted = EngineReading(queried_tokens=100, hit_tokens=0)
    entry.count_hits(None, first)
    entry.count_hits(first, second)
    entry.count_hits(second, restarted)  # counters reset: this interval is skipped
    entry.count_hits(restarted, EngineReading(queried_tokens=300, hit_tokens=200))
    assert (entry.hit_tokens_seen, entry.queried_tokens_seen) == (1000, 1200)
    assert entry.hit_ratio == 1000 / 1200


async def test_an_engines_inter_token_latency_becomes_its_decode_step(emulators, rig_for) -> None:
    emu = emulate(emulators, time_scale=1.0)
    other = emulate(emulators, time_scale=1.0)
    rig = rig_for([{"url": emu.url, "name": "e"}, {"url": other.url, "name": "o"}],
                  engines={"decode_step": {"min_window_s": 0.01, "min_tokens": 8}})
    await rig.poller.start()
    assert rig.pool.get("e").candidate.decode_step_s is None  # nothing measured yet: the configured step
    await asyncio.gather(*(asyncio.to_thread(t.join) for t in post_in_background(emu.url, 2, 40)))
    await rig.poller.poll_all()
    step = rig.pool.get("e").candidate.decode_step_s
    assert step is not None and rig.book.entry("e").decode_step_s == step
    reading = rig.book.entry("e").reading  # what the poller read
    assert reading is not None and reading.itl_s is not None and reading.itl_tokens
    assert step == pytest.approx(reading.itl_s / reading.itl_tokens)  # one window: its mean
    assert rig.pool.get("o").candidate.decode_step_s is None  # generated nothing: never measured
    rig.pool.calibrate("e", 2.0)  # a rebuilt candidate keeps it
    assert rig.pool.get("e").candidate.decode_step_s == step
    rig.config.engines.decode_step.enabled = False  # a reload turns it off (the config is updated in place)
    await rig.poller.poll_all()
    assert rig.pool.get("e").candidate.decode_step_s is None and rig.book.entry("e").decode_step_s is None
    assert rig.poller.decode.beliefs == {}  # re-enabled, it measures afresh


async def test_the_batch_an_engines_step_was_measured_at_goes_with_it(emulators, rig_for) -> None:
    """Scraped while three requests decode: the step comes with a batch of three and the KV they hold."""
    emu = emulate(emulators, time_scale=2.0)
    rig = rig_for([{"url": emu.url, "name": "e"}], engines={"decode_step": {"min_window_s": 0.01, "min_tokens": 8}})
    await rig.poller.start()
    threads = post_in_background(emu.url, 3, 300)
    for _ in range(8):  # ~1.6 s of a ~4 s decode
        await asyncio.sleep(0.2)
        await rig.poller.poll_all()
    cand = rig.pool.get("e").candidate
    # the first window may hold a scrape taken while the third request was still arriving
    assert cand.decode_step_s is not None and cand.decode_step_batch is not None
    assert 2.5 <= cand.decode_step_batch <= 3.0
    assert 0.0 < cand.decode_step_kv_share < 0.5  # three ~300-token prompts in a 64K-token cache
    await asyncio.gather(*(asyncio.to_thread(t.join) for t in threads))
