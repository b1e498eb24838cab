"""The shared KV store: content-addressed LRU, engines loading what they lack, over HTTP."""

from __future__ import annotations

import httpx
import pytest

from router.tools.emulator.engine import Engine, EngineConfig
from router.tools.emulator.kvcache import block_hashes
from router.tools.emulator.kvstore import KVStore
from router.tools.emulator.perf import get_profile
from router.tools.emulator.request import EngineRequest, EventKind
from router.tools.emulator.store_server import StoreConfig, start_store_in_thread

from tests.tools.emulator.conftest import StartFn


def test_the_store_matches_leading_blocks_and_evicts_the_deepest_first() -> None:
    store = KVStore(capacity_tokens=4 * 16, block_size=16)
    a = block_hashes(list(range(64)), 16)  # 4 blocks
    assert store.put(a) == 4 and store.lookup(a) == 4
    diverged = block_hashes(list(range(32)) + [9] * 32, 16)
    assert store.lookup(diverged) == 2  # chained: only the blocks before the first difference
    b = block_hashes([7] * 32, 16)
    store.put(b)  # 2 more blocks: the 2 deepest of a go
    assert store.match(a) == 2 and store.match(b) == 2
    assert store.counters.evicted_blocks == 2 and len(store) == 4


def _engine(blocks: int = 4096) -> Engine:
    return Engine(EngineConfig(num_blocks=blocks), get_profile("llama3-8b-h100"))


def test_a_store_load_overlaps_the_rest_and_gates_only_the_first_token() -> None:
    engine = _engine()
    r = EngineRequest("r", list(range(4000)), 4, store_tokens=3200)
    engine.add_request(r, 0.0)
    out = engine.step(0.0)
    assert out.loads == [r] and r.num_loaded == 3200 and r.loading
    assert out.shape.prefill_tokens == 4000 - 3200 - 1  # the rest computes while the bytes move
    steps = 0
    while True:  # nothing more can run until the load is done
        out = engine.step(1.0)
        steps += 1
        if out.idle:
            break
    assert steps == 1 and r.first_token_time is None
    assert engine.load_done("r")
    out = engine.step(2.0)
    assert [e.kind for e in out.events] == [EventKind.FIRST_TOKEN] and out.shape.prefill_tokens == 1
    assert engine.counters.store_loaded_tokens == 3200 and r.num_cached == 0


def test_a_local_hit_is_not_loaded_again() -> None:
    engine = _engine()
    first = EngineRequest("a", list(range(2000)), 1)
    engine.add_request(first, 0.0)
    while engine.has_work():
        engine.step(0.0)
    again = EngineRequest("b", list(range(2000)) + list(range(5000, 6000)), 1, store_tokens=2400)
    engine.add_request(again, 1.0)
    out = engine.step(1.0)
    assert again.num_cached == 2000 and again.num_loaded == 400 and out.loads == [again]


def _stats(client: httpx.Client, url: str) -> dict:
    return client.get(url + "/emulator/stats").json()


@pytest.mark.parametrize("gbps", [400.0])
def test_an_engine_loads_from_the_store_what_another_computed(start_emulator: StartFn, client: httpx.Client,
                                                              gbps: float) -> None:
    with start_store_in_thread(StoreConfig(gbps=gbps, time_scale=0.05)) as store:
        a = start_emulator(time_scale=0.05, kv_store_url=store.url)
        b = start_emulator(time_scale=0.05, kv_store_url=store.url)
        prompt = "a long shared document " * 800
        for url in (a.url, b.url):
            resp = client.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2})
            assert resp.status_code == 200
        sa, sb = _stats(client, a.url), _stats(client, b.url)
        assert sa["store"]["loaded_tokens"] == 0 and sa["tokens"]["prefill_computed"] > 3000
        assert sb["store"]["loaded_tokens"] > 3000  # all the full blocks but the last token's
        assert sb["tokens"]["prefill_computed"] < 32 and sb["tokens"]["cached"] == 0
        stats = client.get(store.url + "/store/stats").json()
        assert stats["hit_lookups"] == 1 and stats["loaded_bytes"] == sb["store"]["loaded_bytes"] > 0


def test_a_slow_store_makes_the_load_the_ttft(start_emulator: StartFn, client: httpx.Client) -> None:
    """Load time = bytes / store bandwidth: ~4400 tokens x 128 KiB at 2 Gbit/s = 2.3 model s
    (against ~0.2 s to compute them); at 400 Gbit/s 12 ms. Each load also pays an HTTP round
    trip to the store in wall time (tens of model ms at this time scale), the same for both."""
    ttft, loaded = {}, {}
    prompt = "bandwidth decides " * 1100
    for gbps in (2.0, 400.0):
        with start_store_in_thread(StoreConfig(gbps=gbps, time_scale=0.05)) as store:
            a = start_emulator(time_scale=0.05, kv_store_url=store.url)
            b = start_emulator(time_scale=0.05, kv_store_url=store.url)
            for url in (a.url, b.url):
                assert client.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}).status_code == 200
            stats = _stats(client, b.url)
            ttft[gbps], loaded[gbps] = stats["recent"][-1]["ttft_model_s"], stats["store"]["loaded_bytes"]
    expected = loaded[2.0] * 8 / 2e9 - loaded[400.0] * 8 / 400e9
    assert expected > 2.0
    assert ttft[2.0] - ttft[400.0] == pytest.approx(expected, rel=0.2), ttft


def test_bad_store_calls_get_a_400_and_leave_the_store_alone(client: httpx.Client) -> None:
    with start_store_in_thread(StoreConfig()) as store:
        for path, body in (("/store/put", {"hashes": "x"}), ("/store/lookup", [1]), ("/store/load", {"blocks": -1, "bytes": 1})):
            resp = client.post(store.url + path, json=body)
            assert resp.status_code == 400 and "error" in resp.json()
        assert client.get(store.url + "/store/stats").json()["blocks"] == 0


def test_an_engine_whose_store_is_gone_serves_as_without_one(start_emulator: StartFn, client: httpx.Client) -> None:
    from router.tools.process import free_port

    engine = start_emulator(kv_store_url=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    resp = client.post(engine.url + "/v1/completions", json={"prompt": "no store here " * 50, "max_tokens": 3})
    assert resp.status_code == 200
    store = _stats(client, engine.url)["store"]
    assert store["failures"] >= 1 and store["loaded_tokens"] == 0 and store["hit_tokens"] == 0
