"""External load: what engines report beyond the router's bookings, and that policies see it."""

from __future__ import annotations

import random

from router.config.model import PolicyConfig
from router.core.instances import Candidate
from router.engines.book import EngineBook
from router.engines.external import ExternalLoadPolicy, add_loads, external_load, mean_uncached_prompt
from router.engines.readings import EngineReading
from router.scheduling import build_policy
from router.scheduling.framework import RouteRequest
from router.state.base import Load, Snapshot


def test_own_bookings_are_not_counted_twice() -> None:
    reading = EngineReading(running=3, waiting=1, kv_usage=0.5)
    assert external_load(reading, Load(requests=4, kv_tokens=6000), 10_000) == Load()


def test_excess_is_external_and_floored_at_zero() -> None:
    reading = EngineReading(running=6, waiting=4, kv_usage=0.5, prompt_tokens=10_000, hit_tokens=2_000, finished=8)
    ext = external_load(reading, Load(requests=2, kv_tokens=1000), 10_000)
    assert ext.requests == 8
    assert ext.kv_tokens == 4000  # 5000 in use, 1000 of them ours
    # 4 of 10 requests wait; 8 of 10 are external -> 3.2 external waiting x 1000 uncached tokens each
    assert ext.prefill_tokens == 3200
    assert external_load(EngineReading(running=1, waiting=0, kv_usage=0.0), Load(requests=5, kv_tokens=9), 100) == Load()


def test_without_counters_no_prefill_is_guessed() -> None:
    assert mean_uncached_prompt(EngineReading(waiting=3)) == 0
    assert external_load(EngineReading(waiting=3), Load(), 100) == Load(requests=3)


def test_no_reading_no_load() -> None:
    assert external_load(EngineReading(kv_usage=0.9), Load(), 100) == Load()


def test_add_loads_only_to_named_instances() -> None:
    snap = Snapshot({"a": 1, "b": 0}, {"a": Load(1, 10, 100, 0), "b": Load()})
    out = add_loads(snap, {"a": Load(2, 20, 200, 0), "z": Load(9)})
    assert out.loads == {"a": Load(3, 30, 300, 0), "b": Load()} and out.matched == snap.matched


def req() -> RouteRequest:
    return RouteRequest("r", tuple(range(8)), prompt_tokens=512, max_tokens=16, block_tokens=64)


def test_a_policy_steers_away_from_external_load() -> None:
    cands = [Candidate("a"), Candidate("b")]
    inner = build_policy(PolicyConfig(name="ttft", seed=1), rng=random.Random(1))
    snap = Snapshot({"a": 8, "b": 0}, {"a": Load(), "b": Load()})  # a holds the whole prompt
    book = EngineBook(stale_after_s=5.0)
    policy = ExternalLoadPolicy(inner, book.external_loads)
    assert policy.name == inner.name and policy.revisable == inner.revisable
    assert policy.choose(req(), cands, snap).instance == "a"
    book.record_reading("a", EngineReading(running=40, waiting=30), Load(requests=70, prefill_tokens=400_000))
    assert policy.choose(req(), cands, snap).instance == "b"  # a is busy with traffic the router never saw


def test_least_loaded_counts_external_requests() -> None:
    cands = [Candidate("a"), Candidate("b")]
    inner = build_policy(PolicyConfig(name="least_loaded", seed=1), rng=random.Random(1))
    book = EngineBook(stale_after_s=5.0)
    policy = ExternalLoadPolicy(inner, book.external_loads)
    snap = Snapshot({"a": 0, "b": 0}, {"a": Load(requests=1), "b": Load(requests=2)})
    assert policy.choose(req(), cands, snap).instance == "a"
    book.record_reading("a", EngineReading(running=5), Load(requests=5))
    assert policy.choose(req(), cands, snap).instance == "b"


def test_stale_or_failed_readings_stop_counting() -> None:
    now = [100.0]
    book = EngineBook(stale_after_s=3.0, clock=lambda: now[0])
    book.record_reading("a", EngineReading(running=5), Load(requests=5))
    book.record_reading("b", EngineReading(running=5), Load(requests=5))
    assert set(book.external_loads()) == {"a", "b"}
    book.scrape_failed("b")
    assert set(book.external_loads()) == {"a"}
    now[0] += 3.5
    assert book.external_loads() == {}
    book.record_reading("a", EngineReading(running=0), Load())
    assert book.external_loads() == {} and book.entry("a").reading is not None
    book.retain(["b"])
    assert book.facts("a") is None and book.facts("b") is not None


def test_add_loads_keeps_the_confidence_and_the_bytes_in_flight() -> None:
    snap = Snapshot({"a": 4}, {"a": Load(1, 10, 100, 1, 5000)}, {"a": 0.25})
    out = add_loads(snap, {"a": Load(1, 0, 50, 0, 0)})
    assert out.confidence == {"a": 0.25} and out.loads["a"] == Load(2, 10, 150, 1, 5000)
