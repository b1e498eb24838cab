"""What a decision tells /metrics: the router's predicted hit ratio, token-weighted per engine."""

import asyncio
import random

from router.config.model import PolicyConfig
from router.core.instances import Candidate
from router.core.metrics import Metrics
from router.scheduling import build_policy
from router.scheduling.decide import decide
from router.scheduling.framework import RouteRequest
from router.state.base import Booking
from router.state.memory import MemoryStore


def _value(metrics: Metrics, name: str, engine: str) -> float:
    return metrics.registry.get_sample_value(name, {"engine": engine}) or 0.0


def test_predicted_cached_and_routed_prompt_tokens_are_counted_per_engine():
    store = MemoryStore({"a": 1000}, clock=lambda: 0.0)
    keys = tuple(range(10))
    store.book(Booking.single("x", "a", 0, 0, keys[:6]))  # a holds the first 6 of 10 blocks
    metrics = Metrics()
    policy = build_policy(PolicyConfig(name="ttft"), rng=random.Random(0))
    req = RouteRequest("r", keys, 640, 8, 64)
    asyncio.run(decide(store, policy, req, [Candidate("a")], metrics))
    assert _value(metrics, "pd_router_routed_prompt_tokens_total", "a") == 640
    assert _value(metrics, "pd_router_predicted_cached_tokens_total", "a") == 6 * 64  # confidence 1: a fresh entry


def test_a_decision_carries_the_rate_its_estimate_was_priced_at():
    store = MemoryStore({"a": 1000, "b": 1000}, clock=lambda: 0.0)
    candidates = [Candidate("a", prefill_tokens_per_s=4000.0), Candidate("b", prefill_tokens_per_s=9000.0)]
    policy = build_policy(PolicyConfig(name="ttft"), rng=random.Random(0))
    routed = asyncio.run(decide(store, policy, RouteRequest("r", tuple(range(4)), 256, 8, 64), candidates))
    assert routed.decision.estimate_s is not None
    assert routed.prefill_rate == {"a": 4000.0, "b": 9000.0}[routed.decision.instance]  # what calibration compares with
    unpriced = build_policy(PolicyConfig(name="round_robin"), rng=random.Random(0))
    assert asyncio.run(decide(store, unpriced, RouteRequest("s", (), 8, 8, 64), candidates)).prefill_rate is None


def test_a_decision_carries_the_unbooked_queue_the_engine_reported_on_its_instance():
    from router.engines.external import ExternalLoadPolicy
    from router.state.base import Load

    store = MemoryStore({"a": 1000, "b": 1000}, clock=lambda: 0.0)
    candidates = [Candidate("a", prefill_tokens_per_s=4000.0), Candidate("b", prefill_tokens_per_s=4000.0)]
    external = {"a": Load(requests=3, prefill_tokens=6000), "b": Load(requests=1, prefill_tokens=200)}
    policy = ExternalLoadPolicy(build_policy(PolicyConfig(name="ttft"), rng=random.Random(0)), lambda: external)
    routed = asyncio.run(decide(store, policy, RouteRequest("r", tuple(range(4)), 256, 8, 64), candidates))
    assert routed.decision.instance == "b"  # a's unbooked queue was priced
    assert routed.external_prefill == 200  # what calibration's queued share counts ahead of it
    plain = build_policy(PolicyConfig(name="ttft"), rng=random.Random(0))
    assert asyncio.run(decide(store, plain, RouteRequest("s", (), 8, 8, 64), candidates)).external_prefill == 0
