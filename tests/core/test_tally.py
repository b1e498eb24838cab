"""Tallied counters and histograms (router/core/tally.py): what a scrape reads is exactly what
prometheus_client's own children would have recorded, and nothing is held back from it."""

import math
import random
import threading

from prometheus_client import generate_latest

from router.core.metrics import Metrics


def series(metrics: Metrics, prefix: bytes) -> list[bytes]:
    return [line for line in generate_latest(metrics.registry).splitlines()
            if line.startswith(prefix) and b"_created" not in line]  # creation times differ


def test_a_scrape_reads_the_same_samples_as_direct_observations():
    rng = random.Random(7)
    values = [rng.choice([0.0, 0.005, 0.01, 300.0, 1e9, math.inf, math.nan]) if rng.random() < 0.2 else rng.expovariate(3)
              for _ in range(2000)]
    tallied, direct = Metrics(), Metrics()
    for v in values:
        tallied.child("latency", "a", "m", "ok").observe(v)
        direct.latency.labels("a", "m", "ok").observe(v)
        tallied.child("requests", "a", "m", "ok").inc()
        direct.requests.labels("a", "m", "ok").inc()
        tallied.child("routed_prompt", "a").inc(17)
        direct.routed_prompt.labels("a").inc(17)
    for prefix in (b"pd_router_request_duration_seconds", b"pd_router_requests_total", b"pd_router_routed_prompt"):
        assert series(tallied, prefix) == series(direct, prefix) != []
    # and again after a scrape: the tallies start from zero, the series keep counting
    tallied.child("requests", "a", "m", "ok").inc(3)
    direct.requests.labels("a", "m", "ok").inc(3)
    assert tallied.registry.get_sample_value("pd_router_requests_total", {"engine": "a", "model": "m", "outcome": "ok"}) == 2003
    assert series(tallied, b"pd_router_requests_total") == series(direct, b"pd_router_requests_total")


def test_a_forgotten_engine_keeps_no_tally_and_others_keep_theirs():
    m = Metrics()
    m.child("ttfb", "gone").observe(0.1)
    m.child("ttfb", "kept").observe(0.2)
    m.forget_engine("gone")
    assert m.registry.get_sample_value("pd_router_time_to_first_byte_seconds_count", {"engine": "gone"}) is None
    assert m.registry.get_sample_value("pd_router_time_to_first_byte_seconds_count", {"engine": "kept"}) == 1
    m.child("ttfb", "gone").observe(0.3)  # it came back: a fresh series
    assert m.registry.get_sample_value("pd_router_time_to_first_byte_seconds_count", {"engine": "gone"}) == 1


def test_reads_from_another_thread_lose_nothing():
    m = Metrics()
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            generate_latest(m.registry)

    reader = threading.Thread(target=scrape)
    reader.start()
    try:
        for _ in range(50_000):
            m.child("decisions", "p", "r").inc()
            m.child("store_latency", "decide").observe(0.001)
    finally:
        stop.set()
        reader.join()
    assert m.registry.get_sample_value("pd_router_decisions_total", {"policy": "p", "reason": "r"}) == 50_000
    assert m.registry.get_sample_value("pd_router_state_store_seconds_count", {"op": "decide"}) == 50_000
