"""End to end: emulated engines publish KV events, the router learns their caches from them
(discovered through GET /kv_event_sources, no per-instance config) and routes on them."""

import time
from contextlib import ExitStack

import httpx
import pytest

from router.config.model import load_config
from router.gateway.app import create_app
from router.request.hashing import root_seed, token_block_keys
from router.state.precise_mirror import NATIVE_BUILT
from router.state.precise_native import NATIVE_TABLES_BUILT
from router.state.shared_mirror import shared_tables
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import start_in_thread
from servers import free_port, serve_app

SYSTEM = "You are the support assistant of a large logistics company. Answer precisely. " * 40  # ~800 tokens


def completion(prompt, max_tokens=2):
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens}


def wait_for(predicate, timeout=60.0):  # generous: a sidecar's process can take seconds to start on a loaded host
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def settled(read, quiet_s=1.0, timeout=60.0):
    """``read()`` once it has not changed for ``quiet_s`` (events still in flight, or in a
    sidecar's next delta, would change it)."""
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "never settled"
        time.sleep(0.02)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value


def keys_of(engine_url, prompt):
    ids = httpx.post(f"{engine_url}/tokenize", json={"model": "m", "prompt": prompt}).json()["tokens"]
    return token_block_keys(ids, 16, root_seed("m"), 4096), len(ids)


def recent(engine_url):
    return httpx.get(f"{engine_url}/emulator/stats", params={"recent": 100}).json()["recent"]


def router_for(engines, **extra):
    return load_config(overrides={
        "instances": [{"url": e.url, "name": name, "model": "m"} for name, e in engines.items()],
        "health": {"interval_s": 60}, "policy": {"seed": 3},
        "hashing": {"mode": "tokens"}, "kv_events": {"enabled": True, "discover_interval_s": 0.2, **extra},
    })


@pytest.mark.parametrize("sidecar", [False, True], ids=["in-process", "sidecar"])
def test_residency_from_discovered_events_routes_to_the_engine_that_holds_the_prefix(sidecar):
    with ExitStack() as stack:
        base = EmulatorConfig(model="m", time_scale=0.01, kv_events_endpoint="tcp://*:0")
        a = stack.enter_context(start_in_thread(base.replace(engine_id="a")))
        b = stack.enter_context(start_in_thread(base.replace(engine_id="b", kv_events_positional=True)))
        app = create_app(router_for({"a": a, "b": b}, sidecar=sidecar))
        url = stack.enter_context(serve_app(app))
        ingest = app.state.kv_events
        wait_for(lambda: len(ingest.sources) == 2)

        prompt = SYSTEM + " Where is parcel 1?"
        keys, n = keys_of(a.url, prompt)
        assert httpx.post(f"{url}/v1/completions", json=completion(prompt), timeout=30).status_code == 200
        first = "a" if recent(a.url) else "b"
        engine = {"a": a, "b": b}[first]
        # what the router learnt from the events is what that engine holds, block for block
        wait_for(lambda: ingest.residency.matched(keys, ["a", "b"]).get(first) == n // 16)
        stats = httpx.get(f"{engine.url}/emulator/stats").json()
        assert sum(len(t) for t in ingest.residency.tables(first).values()) == stats["kv"]["cached_blocks"]

        # the same prefix again: routed there, and the engine measures the hit the router predicted
        for q in range(2, 5):
            r = httpx.post(f"{url}/v1/completions", json=completion(SYSTEM + f" Where is parcel {q}?"), timeout=30)
            assert r.status_code == 200
        assert len(recent(engine.url)) == 4
        assert all(rec["cached_tokens"] >= (n // 16 - 1) * 16 for rec in recent(engine.url)[1:])
        metrics = httpx.get(f"{url}/metrics").text
        assert f'pd_router_kv_residency_fresh{{engine="{first}"}} 1.0' in metrics
        assert 'pd_router_kv_event_stream_total{engine="a",kind="gaps"} 0.0' in metrics


@pytest.mark.parametrize("sidecar", [False, True], ids=["in-process", "sidecar"])
def test_a_block_evicted_on_the_engine_stops_being_counted(sidecar):
    with ExitStack() as stack:
        # 2,048 tokens of cache: three ~800-token prompts cannot all stay
        e = stack.enter_context(start_in_thread(EmulatorConfig(
            model="m", time_scale=0.01, cache_tokens=2048, kv_events_endpoint="tcp://*:0")))
        app = create_app(router_for({"e": e}, sidecar=sidecar))
        url = stack.enter_context(serve_app(app))
        residency = app.state.kv_events.residency
        wait_for(lambda: len(app.state.kv_events.sources) == 1)

        first = "Parcel tracking. " + SYSTEM
        keys, n = keys_of(e.url, first)
        assert httpx.post(f"{url}/v1/completions", json=completion(first), timeout=30).status_code == 200
        wait_for(lambda: residency.matched(keys, ["e"]) == {"e": n // 16})
        for i in range(3):
            other = f"Other tenant {i}. " + SYSTEM[::-1]
            assert httpx.post(f"{url}/v1/completions", json=completion(other), timeout=30).status_code == 200
        evictions = httpx.get(f"{e.url}/emulator/stats").json()["kv"]["evictions"]
        assert evictions > 0
        wait_for(lambda: residency.matched(keys, ["e"])["e"] < n // 16)
        predicted = settled(lambda: residency.matched(keys, ["e"])["e"])  # the evictions' events all applied
        # the engine's own hit on that prompt now is what the router says it still holds
        assert httpx.post(f"{url}/v1/completions", json=completion(first), timeout=30).status_code == 200
        assert recent(e.url)[-1]["cached_tokens"] == min(predicted, (n - 1) // 16) * 16


def test_an_engine_whose_publisher_connects_reaches_the_socket_the_router_binds():
    port = free_port()
    with ExitStack() as stack:
        # vLLM's rule: an endpoint naming a host makes the publisher connect there
        e = stack.enter_context(start_in_thread(EmulatorConfig(
            model="m", time_scale=0.01, kv_events_endpoint=f"tcp://127.0.0.1:{port}", kv_events_topic="kv@e")))
        app = create_app(router_for({"e": e}))
        url = stack.enter_context(serve_app(app))
        ingest = app.state.kv_events
        wait_for(lambda: len(ingest.sources) == 1)
        assert ingest.sources[0].spec.bind == f"tcp://*:{port}"
        prompt = SYSTEM + " Bound socket."
        keys, n = keys_of(e.url, prompt)
        # The first batches may be sent before the connection lands (PUB/SUB drops them), and
        # the stream then starts past 0: stale, honestly. A reset of the engine's cache
        # (AllBlocksCleared) brings it in sync, as on a real engine.
        deadline = time.monotonic() + 10
        while not ingest.residency.is_fresh("e"):
            assert time.monotonic() < deadline, "never in sync"
            assert httpx.post(f"{url}/v1/completions", json=completion("warm up " * 40), timeout=30).status_code == 200
            httpx.post(f"{e.url}/reset_prefix_cache")
            time.sleep(0.05)
        assert httpx.post(f"{url}/v1/completions", json=completion(prompt), timeout=30).status_code == 200
        wait_for(lambda: ingest.residency.matched(keys, ["e"]).get("e") == n // 16)


@pytest.mark.parametrize("sidecar", [False, True], ids=["in-process", "sidecar"])
def test_an_instance_that_joins_later_is_subscribed_too(sidecar):
    with ExitStack() as stack:
        base = EmulatorConfig(model="m", time_scale=0.01, kv_events_endpoint="tcp://*:0")
        a = stack.enter_context(start_in_thread(base.replace(engine_id="a")))
        b = stack.enter_context(start_in_thread(base.replace(engine_id="b")))
        config = router_for({"a": a}, sidecar=sidecar)
        config.server.admin_token = "t0ken"
        app = create_app(config)
        url = stack.enter_context(serve_app(app))
        ingest = app.state.kv_events
        wait_for(lambda: {s.spec.instance for s in ingest.sources} == {"a"})
        r = httpx.post(f"{url}/admin/instances", json={"url": b.url, "name": "b", "model": "m"},
                       headers={"authorization": "Bearer t0ken"})
        assert r.status_code == 201, r.text
        wait_for(lambda: {s.spec.instance for s in ingest.sources} == {"a", "b"})  # found through its own /kv_event_sources


@pytest.mark.parametrize("sidecar", [False, True], ids=["in-process", "sidecar"])
def test_an_instance_that_leaves_is_unsubscribed_and_one_back_at_another_address_is_subscribed_there(sidecar):
    admin = {"authorization": "Bearer t0ken"}
    with ExitStack() as stack:
        base = EmulatorConfig(model="m", time_scale=0.01, kv_events_endpoint="tcp://*:0",
                              kv_events_replay_endpoint="tcp://*:0")  # known (empty) at once, through a replay
        a, b, c = (stack.enter_context(start_in_thread(base.replace(engine_id=n))) for n in "abc")
        config = router_for({"a": a, "b": b}, sidecar=sidecar)
        config.server.admin_token = "t0ken"
        app = create_app(config)
        url = stack.enter_context(serve_app(app))
        ingest = app.state.kv_events
        wait_for(lambda: ingest.residency.is_fresh("a") and ingest.residency.is_fresh("b"))
        prompt = SYSTEM + " Where is parcel 7?"
        keys, n = keys_of(b.url, prompt)
        assert httpx.post(f"{b.url}/v1/completions", json=completion(prompt), timeout=30).status_code == 200
        wait_for(lambda: ingest.residency.matched(keys, ["b"]) == {"b": n // 16})  # traffic that bypassed the router

        assert httpx.delete(f"{url}/admin/instances/b", headers=admin).status_code in (200, 204)
        wait_for(lambda: {s.spec.instance for s in ingest.sources} == {"a"})
        doc = httpx.get(f"{url}/debug/kv_events", headers=admin).json()
        assert [s["instance"] for s in doc["sources"]] == ["a"] and "b" not in doc["instances"]
        assert doc["key_sets"] == (("native" if NATIVE_BUILT else "python") if sidecar else None)
        assert doc["tables"] == ("native" if NATIVE_TABLES_BUILT else "python")
        assert doc["mirror"] == ((shared_tables() if NATIVE_BUILT else "deltas") if sidecar else None)
        applied_a = ingest.sources[0].writer.counters.events
        assert httpx.post(f"{b.url}/v1/completions", json=completion(prompt + " again"), timeout=30).status_code == 200
        assert httpx.post(f"{a.url}/v1/completions", json=completion("a marker " * 40), timeout=30).status_code == 200
        wait_for(lambda: ingest.sources[0].writer.counters.events > applied_a)  # a's events still flow ...
        assert "b" not in ingest.residency.instances()  # ... b's, after it left, count for nobody

        r = httpx.post(f"{url}/admin/instances", json={"url": c.url, "name": "b", "model": "m"}, headers=admin)
        assert r.status_code == 201, r.text
        c_port = httpx.get(f"{c.url}/kv_event_sources").json()["0"]["endpoint"].rsplit(":", 1)[1]
        wait_for(lambda: any(s.spec.instance == "b" and s.spec.endpoint.endswith(f":{c_port}") for s in ingest.sources))
        wait_for(lambda: ingest.residency.is_fresh("b"))
        assert ingest.residency.matched(keys, ["b"]) == {"b": 0}  # the new "b" holds nothing of the old one's
